"""From an engine's exposition text to engine-neutral values, one set per (model, dp).

The tables below map each engine's metric names onto the fields of
`readings.EngineSeries`. Matching is on sample names, so a page with or without
`# TYPE` lines reads the same (the parser appends `_total` to typed counters only).
Older names are fallbacks: they count only when the current name is absent, so a
version that exports both is not counted twice. At most `max_models` models are read
per page, the first ones it names: each model is a few dozen of our series, and a page
of 19 000 model names made /metrics 18 times larger; the others are counted, not read.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from exporter.metricdef import Histogram

SeriesKey = tuple[str | None, str | None]  # (model, dp)
MAX_MODELS = 16  # vLLM and SGLang label one model per server (its served name)


@dataclass(frozen=True)
class Source:
    field: str
    source: str  # sample name without _total / _bucket / _sum / _count
    part: str = "value"  # value | hist | sum (a histogram's or summary's _sum) | info | config
    key_label: str | None = None  # mapping fields: the source label that becomes the key
    key: str | None = None  # mapping fields: a fixed key
    only: tuple[str, str] | None = None  # (label, value) the sample must carry
    exclude: tuple[str, str] | None = None  # (label, value) the sample must not carry
    fallback: bool = False  # an older name: used only when no current name has data
    scale: float = 1.0


def _sources(*sources: Source) -> tuple[Source, ...]:
    return sources


# Mapping fields (a dict per series) are those with a key_label or key.
MAP_FIELDS = frozenset({"requests_waiting_by_reason", "requests", "disagg_queue_requests"})
HIST_FIELDS = ("ttft", "itl", "e2e", "queue", "prefill", "decode", "kv_transfer")

ROLE = {side: ("engine_type", side) for side in ("prefill", "decode")}  # SGLang's disaggregation role

VLLM = _sources(
    Source("requests_running", "vllm:num_requests_running"),
    Source("requests_waiting", "vllm:num_requests_waiting"),
    Source("requests_waiting_by_reason", "vllm:num_requests_waiting_by_reason", key_label="reason"),
    Source("kv_cache_usage_ratio", "vllm:kv_cache_usage_perc"),
    Source("kv_cache_usage_ratio", "vllm:gpu_cache_usage_perc", fallback=True),
    Source("preemptions", "vllm:num_preemptions"),
    Source("estimated_flops_per_gpu", "vllm:estimated_flops_per_gpu"),
    Source("estimated_read_bytes_per_gpu", "vllm:estimated_read_bytes_per_gpu"),
    Source("prompt_tokens", "vllm:prompt_tokens"),
    Source("generation_tokens", "vllm:generation_tokens"),
    Source("prompt_tokens_cached", "vllm:prompt_tokens_cached"),
    Source("requests", "vllm:request_success", key_label="finished_reason"),
    Source("rejected_requests", "vllm:admission_rejections"),
    Source("prefix_cache_queries", "vllm:prefix_cache_queries"),
    Source("prefix_cache_queries", "vllm:gpu_prefix_cache_queries", fallback=True),
    Source("prefix_cache_hits", "vllm:prefix_cache_hits"),
    Source("prefix_cache_hits", "vllm:gpu_prefix_cache_hits", fallback=True),
    Source("spec_decode_draft_tokens", "vllm:spec_decode_num_draft_tokens"),
    Source("spec_decode_accepted_tokens", "vllm:spec_decode_num_accepted_tokens"),
    Source("ttft", "vllm:time_to_first_token_seconds", "hist"),
    Source("itl", "vllm:inter_token_latency_seconds", "hist"),
    Source("itl", "vllm:time_per_output_token_seconds", "hist", fallback=True),
    Source("e2e", "vllm:e2e_request_latency_seconds", "hist"),
    Source("queue", "vllm:request_queue_time_seconds", "hist"),
    Source("prefill", "vllm:request_prefill_time_seconds", "hist"),
    Source("decode", "vllm:request_decode_time_seconds", "hist"),
    Source("cache_config", "vllm:cache_config_info", "info"),
    # the NIXL KV connector of a disaggregated deployment (observed where transfers are pulled)
    Source("kv_transfer", "vllm:nixl_xfer_time_seconds", "hist"),
    Source("kv_transfer_bytes", "vllm:nixl_bytes_transferred", "sum"),
    Source("kv_transfer_failures", "vllm:nixl_num_failed_transfers"),
)

SGLANG = _sources(
    Source("requests_running", "sglang:num_running_reqs"),
    Source("requests_waiting", "sglang:num_queue_reqs"),
    Source("kv_cache_usage_ratio", "sglang:token_usage"),
    Source("preemptions", "sglang:num_retracted_requests"),
    Source("prompt_tokens", "sglang:prompt_tokens"),
    Source("generation_tokens", "sglang:generation_tokens"),
    Source("prompt_tokens_cached", "sglang:cached_tokens"),
    Source("requests", "sglang:num_requests", key="finished"),
    Source("prefix_hit_ratio_reported", "sglang:cache_hit_rate"),
    Source("spec_accept_ratio_reported", "sglang:spec_accept_rate"),
    Source("ttft", "sglang:time_to_first_token_seconds", "hist"),
    Source("itl", "sglang:inter_token_latency_seconds", "hist"),
    Source("itl", "sglang:time_per_output_token_seconds", "hist", fallback=True),
    Source("e2e", "sglang:e2e_request_latency_seconds", "hist"),
    Source("queue", "sglang:queue_time_seconds", "hist"),
    Source("cache_config", "sglang:max_total_num_tokens", "config", key="max_total_num_tokens"),
    # PD disaggregation: every scheduler exports every queue, 0 where its role has none,
    # so each is read from the role that has it only
    *(
        Source(
            "disagg_queue_requests",
            f"sglang:num_{side}_{name}_queue_reqs",
            key=f"{side}_{key}",
            only=ROLE[side],
        )
        for side, name, key in (
            ("prefill", "prealloc", "bootstrap"),
            ("prefill", "inflight", "inflight"),
            ("decode", "prealloc", "prealloc"),
            ("decode", "transfer", "transfer"),
        )
    ),
    Source("kv_transfer_latency_reported", "sglang:kv_transfer_latency_ms", only=ROLE["prefill"], scale=1e-3),
    Source("kv_transfer_speed_reported", "sglang:kv_transfer_speed_gb_s", only=ROLE["prefill"], scale=1e9),
    Source("kv_transfer_failures", "sglang:num_transfer_failed_reqs"),
    Source("kv_transfer_failures", "sglang:num_bootstrap_failed_reqs"),
)

TGI = _sources(
    Source("requests_running", "tgi_batch_current_size"),
    Source("requests_waiting", "tgi_queue_size"),
    Source("prompt_tokens", "tgi_request_input_length", "sum"),
    Source("generation_tokens", "tgi_request_generated_tokens", "sum"),
    Source("requests", "tgi_request_success", key="success"),
    Source("requests", "tgi_request_failure", key_label="err", exclude=("err", "overloaded")),
    Source("rejected_requests", "tgi_request_failure", only=("err", "overloaded")),
    Source("arrivals", "tgi_request_count"),
    Source("itl", "tgi_request_mean_time_per_token_duration", "hist"),
    Source("e2e", "tgi_request_duration", "hist"),
    Source("queue", "tgi_request_queue_duration", "hist"),
)

TABLES: Mapping[str, tuple[Source, ...]] = {"vllm": VLLM, "sglang": SGLANG, "tgi": TGI}
PREFIXES = (("vllm", "vllm:"), ("sglang", "sglang:"), ("tgi", "tgi_"))
MODEL_LABELS = ("model_name", "name")  # SGLang's first releases called it `name`
DP_LABELS: Mapping[str, str] = {"vllm": "engine", "sglang": "dp_rank"}
# SGLang reports the same scheduler view from every tensor/pipeline rank; rank 0 speaks.
RANK_LABELS = ("tp_rank", "pp_rank")
# vllm:cache_config_info keys worth keeping: the memory budget and the cache shape.
CACHE_CONFIG_KEYS = frozenset(
    {
        "block_size",
        "num_gpu_blocks",
        "num_cpu_blocks",
        "gpu_memory_utilization",
        "cache_dtype",
        "enable_prefix_caching",
        "kv_cache_memory_bytes",
        "swap_space_bytes",
        "kv_cache_size_tokens",
        "kv_cache_max_concurrency",
        "sliding_window",
        "max_total_num_tokens",
    }
)
PROCESS_CPU = "process_cpu_seconds_total"


@dataclass(frozen=True)
class Raw:
    """What one scrape said about one (model, dp), in the fields of EngineSeries."""

    values: Mapping[str, float] = field(default_factory=dict)
    maps: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    hists: Mapping[str, Histogram] = field(default_factory=dict)
    cache_config: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Normalized:
    kind: str
    series: Mapping[SeriesKey, Raw]
    samples: int  # every sample on the page, engine or not
    process_cpu_seconds: float | None = None  # the serving process' own counter
    dropped_models: int = 0  # distinct models past max_models, not read


def detect(families: Iterable[Metric]) -> str | None:
    """The engine whose metric prefix is the most common on the page, if any."""
    counts = dict.fromkeys(TABLES, 0)
    for fam in families:
        for kind, prefix in PREFIXES:
            if fam.name.startswith(prefix):
                counts[kind] += len(fam.samples)
    kind = max(counts, key=lambda k: counts[k])
    return kind if counts[kind] else None


class _Out:
    __slots__ = ("config", "hists", "maps", "values")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.maps: dict[str, dict[str, float]] = {}
        self.hists: dict[str, Histogram] = {}
        self.config: dict[str, str] = {}

    def raw(self) -> Raw:
        return Raw(values=self.values, maps=self.maps, hists=self.hists, cache_config=self.config or None)


class _Hist:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets: dict[float, float] = defaultdict(float)
        self.sum = 0.0
        self.count = 0.0


def normalize(
    families: list[Metric], kind: str | None = None, max_models: int = MAX_MODELS
) -> Normalized | None:
    """Engine-neutral values from parsed families; None when no engine is recognized."""
    kind = kind or detect(families)
    if kind is None:
        return None
    rules = TABLES[kind]
    by_source: dict[str, list[Source]] = defaultdict(list)
    for rule in rules:
        by_source[rule.source].append(rule)
    hist_sources = {r.source for r in rules if r.part in ("hist", "sum")}
    dp_label = DP_LABELS.get(kind)

    scalars: dict[tuple[Source, SeriesKey], float] = defaultdict(float)
    maps: dict[tuple[Source, SeriesKey], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    hists: dict[tuple[Source, SeriesKey], _Hist] = defaultdict(_Hist)
    configs: dict[tuple[Source, SeriesKey], dict[str, str]] = defaultdict(dict)
    total = 0
    cpu: float | None = None
    models: set[str] = set()
    dropped: set[str] = set()

    for fam in families:
        for s in fam.samples:
            total += 1
            name = s.name
            if name == PROCESS_CPU and not s.labels:
                cpu = s.value
                continue
            part = "value"
            if name in by_source:
                base = name
            elif name.endswith("_total") and name[:-6] in by_source:
                base = name[:-6]
            else:
                stem, _, suffix = name.rpartition("_")
                if suffix not in ("bucket", "sum", "count") or stem not in hist_sources:
                    continue
                base, part = stem, suffix
            labels = s.labels
            if any(labels.get(r, "0") != "0" for r in RANK_LABELS):
                continue
            if not math.isfinite(s.value) and part != "bucket":
                continue
            model = next((labels[m] for m in MODEL_LABELS if labels.get(m)), None)
            if model is not None and model not in models:
                if len(models) >= max_models:
                    dropped.add(model)
                    continue
                models.add(model)
            dp = labels.get(dp_label) if dp_label else None
            key: SeriesKey = (model, dp)
            for rule in by_source[base]:
                if rule.only and labels.get(rule.only[0]) != rule.only[1]:
                    continue
                if rule.exclude and labels.get(rule.exclude[0]) == rule.exclude[1]:
                    continue
                slot = (rule, key)
                if rule.part == "hist":
                    h = hists[slot]
                    if part == "bucket":
                        try:
                            h.buckets[float(labels.get("le", "nan"))] += s.value
                        except ValueError:
                            continue
                    elif part == "sum":
                        h.sum += s.value
                    elif part == "count":
                        h.count += s.value
                elif rule.part == "sum":
                    if part == "sum":
                        scalars[slot] += s.value
                elif part != "value":
                    continue
                elif rule.part == "info":
                    configs[slot].update(
                        (k, v) for k, v in labels.items() if k in CACHE_CONFIG_KEYS and v != "None"
                    )
                elif rule.part == "config":
                    configs[slot][rule.key or rule.source] = _fmt(s.value)
                elif rule.key_label or rule.key:
                    mkey = rule.key or labels.get(rule.key_label or "", "") or "unknown"
                    maps[slot][mkey] += s.value * rule.scale
                else:
                    scalars[slot] += s.value * rule.scale

    present = {r.field for (r, _) in (*scalars, *maps, *hists, *configs) if not r.fallback}

    def wanted(rule: Source) -> bool:
        return not rule.fallback or rule.field not in present

    out: dict[SeriesKey, _Out] = defaultdict(_Out)
    for (rule, key), v in scalars.items():
        if wanted(rule):
            vals = out[key].values
            vals[rule.field] = vals.get(rule.field, 0.0) + v
    for (rule, key), m in maps.items():
        if wanted(rule):
            into = out[key].maps.setdefault(rule.field, {})
            for k, v in m.items():
                into[k] = into.get(k, 0.0) + v
    for (rule, key), h in hists.items():
        if wanted(rule) and h.buckets and rule.field not in out[key].hists:
            out[key].hists[rule.field] = _histogram(h)
    for (rule, key), c in configs.items():
        if wanted(rule):
            out[key].config.update(c)

    series = _fold({k: v.raw() for k, v in out.items()})
    return Normalized(
        kind=kind, series=series, samples=total, process_cpu_seconds=cpu, dropped_models=len(dropped)
    )


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _histogram(h: _Hist) -> Histogram:
    bounds = sorted(h.buckets.items())
    if not bounds or not math.isinf(bounds[-1][0]):
        bounds.append((math.inf, h.count))
    return Histogram(buckets=tuple(bounds), sum=h.sum, count=h.count or bounds[-1][1])


def _merge(a: Raw, b: Raw) -> Raw:
    values = dict(a.values)
    for k, v in b.values.items():
        values[k] = values.get(k, 0.0) + v
    maps = {k: dict(v) for k, v in a.maps.items()}
    for k, m in b.maps.items():
        into = maps.setdefault(k, {})
        for mk, mv in m.items():
            into[mk] = into.get(mk, 0.0) + mv
    hists = {**b.hists, **a.hists}
    config = {**(b.cache_config or {}), **(a.cache_config or {})} or None
    return Raw(values=values, maps=maps, hists=hists, cache_config=config)


def _fold(series: dict[SeriesKey, Raw]) -> dict[SeriesKey, Raw]:
    """Drop `dp` unless several ranks report; give model-less series the only model."""
    dps = {dp for (_, dp) in series if dp is not None}
    if len(dps) <= 1:
        merged: dict[SeriesKey, Raw] = {}
        for (model, _), raw in series.items():
            key: SeriesKey = (model, None)
            merged[key] = _merge(merged[key], raw) if key in merged else raw
        series = merged
    models = {m for (m, _) in series if m is not None}
    if len(models) == 1:
        only: str | None = next(iter(models))
        folded: dict[SeriesKey, Raw] = {}
        for (model, dp), raw in series.items():
            fkey: SeriesKey = (model or only, dp)
            folded[fkey] = _merge(folded[fkey], raw) if fkey in folded else raw
        series = folded
    return series
