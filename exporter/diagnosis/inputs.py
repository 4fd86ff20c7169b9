"""Every input of the diagnosis, declared once, and the two frames made from the declarations.

An `Input` is one field of a frame: the metric families it is read from (each a `Source`:
the family, the label matchers that pick its series, how its samples reduce to one
value) and the function that normalises those values (HW slowdown explained by the
power brake, NVLink links up, labels parsed). Both frames are made from these
declarations with the same reductions and normalisers, so they agree by construction:

* `frame_of(snapshot)`, the live frame, every cycle. A family declared on a top-level
  field of a GPU reading is read from that field, which is what the exposition makes its
  samples of (one sample; for a mapping, one per key under the family's label); every
  other family goes through the exposition's own walk (`metricdef.samples`), restricted
  to the declared families, into the same rows a store keeps.
* `frame_at(rows, taken_at)`, from stored series: the rows a TSDB returned for one
  scrape time (`exporter/tsdb/frames.py`), whose queries are `SOURCES`.

Rows are grouped by subject: the node, a GPU (`gpu` label), a MIG instance or an
allocator probe on a GPU, an engine target (`target` label). What the exporter never
exports is `LIVE_ONLY`: the live frame reads it from the readings, a frame rebuilt from a
store leaves it empty or puts what stands in for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal

from exporter.allocator_readings import AllocatorProbes, AllocatorProcess
from exporter.diagnosis.pidns import ns_pids
from exporter.engines.readings import EngineGpus, Engines, EngineSeries, EngineTargetReading
from exporter.gpu_readings import GPU_READINGS, MigInstance
from exporter.gpu_specs import spec_of
from exporter.metricdef import Labels, MetricDef, metric_defs
from exporter.probe.schema import ProbeReport
from exporter.snapshot import ExporterInfo, GpuUp

Row = tuple[Labels, float]
Rows = Mapping[str, Sequence[Row]]  # one subject's samples, by family
Scope = Literal["node", "gpu", "mig", "allocator", "engine"]
# The labels that name a subject of each scope; MIG instances and allocator probes belong
# to the GPU of their `gpu` label.
KEYS: Mapping[Scope, tuple[str, ...]] = {
    "node": (),
    "gpu": ("gpu",),
    "mig": ("gpu", "mig_uuid"),
    "allocator": ("gpu", "uuid", "pid"),
    "engine": ("target",),
}
GPU_UP, ENGINE_UP = "llmgpu_gpu_up", "llmgpu_engine_up"  # a GPU, an engine target, is one of these
# The readings the declared families live on (GpuUp is the GpuState's own up and supported).
GPU_CLASSES: tuple[type, ...] = (GpuUp, *GPU_READINGS)
NODE_CLASSES: tuple[type, ...] = (ExporterInfo, Engines, EngineGpus, AllocatorProbes)
NO_XIDS: Mapping[int, int] = MappingProxyType({})


def label(labels: Labels, name: str) -> str | None:
    for key, value in labels:
        if key == name:
            return value
    return None


# ---- how samples reduce ------------------------------------------------------------


@dataclass(frozen=True)
class Reduce:
    """How the samples of one family for one subject become one value: from rows, and, for
    a family declared on a top-level GPU reading field, from that field's value."""

    name: str
    rows: Callable[[Sequence[Row], Source], Any]
    field: Callable[[Any, Source], Any] | None = None


def _first(rows: Sequence[Row], _: Source) -> float | None:
    return rows[0][1] if rows else None


def _keyed_rows(rows: Sequence[Row], src: Source) -> dict[str, float] | None:
    key = src.own_label
    return {label(lb, key) or "": v for lb, v in rows if src.picks(lb)} or None


def _keyed_field(value: Mapping[Any, Any] | None, src: Source) -> Mapping[str, float] | None:
    """The samples of a mapping field: one per key that has a value, under the family's label."""
    if value is None:
        return None
    want = src.wanted
    if want is not None:  # a matcher on the family's own label: that key only
        v = value.get(want)
        return None if v is None else {want: float(v)}
    if None in value.values() or not all(type(k) is str for k in value):
        value = {str(k): v for k, v in value.items() if v is not None}
    return value or None  # its values as they are: the normalisers compare numbers


def _nonzero_rows(rows: Sequence[Row], src: Source) -> dict[str, float] | None:
    key = src.own_label
    return {label(lb, key) or "": v for lb, v in rows if v} if rows else None


def _sampled(value: Mapping[Any, Any] | None) -> bool:
    """Whether a mapping field has a sample: a key whose value is not None."""
    if not value:
        return False
    values = value.values()
    return None not in values or any(v is not None for v in values)


def _nonzero_field(value: Mapping[Any, Any] | None, _: Source) -> dict[str, float] | None:
    if value is None or not _sampled(value):
        return None
    return {str(k): v for k, v in value.items() if v}


def _on_rows(rows: Sequence[Row], src: Source) -> tuple[str, ...] | None:
    key = src.own_label
    return tuple(sorted(label(lb, key) or "" for lb, v in rows if v == 1)) if rows else None


def _on_field(value: Mapping[Any, Any] | None, _: Source) -> tuple[str, ...] | None:
    if value is None or not _sampled(value):
        return None
    return tuple(sorted(str(k) for k, v in value.items() if v == 1))


def _values(fn: Callable[[list[float]], float]) -> Callable[[Sequence[Row], Source], float | None]:
    def reduce(rows: Sequence[Row], _: Source) -> float | None:
        return float(fn([v for _, v in rows])) if rows else None

    return reduce


def _one(value: Any, _: Source) -> float | None:
    """A scalar field is one sample."""
    return None if value is None else float(value)


FIRST = Reduce("first", _first, _one)
SUM = Reduce("sum", _values(sum), _one)
MAX = Reduce("max", _values(max), _one)
MIN = Reduce("min", _values(min), _one)
SCALAR = (FIRST, SUM, MAX, MIN)  # of one sample, the field's value
KEYED = Reduce("keyed", _keyed_rows, _keyed_field)  # {value of the family's own label: sample}
# of a mapping field's samples: those not zero, and the keys of those that are 1 (None: no sample)
NONZERO = Reduce("nonzero", _nonzero_rows, _nonzero_field)
ON = Reduce("on", _on_rows, _on_field)
INFO = Reduce("info", lambda rows, _: dict(rows[0][0]) if rows else None, lambda v, _: v)  # its labels
ROWS = Reduce("rows", lambda rows, _: rows)  # the samples themselves, for the normaliser


# ---- declarations ----------------------------------------------------------------------


def _metrics(classes: Iterable[type]) -> dict[str, MetricDef]:
    return {m.name: m for cls in classes for m in metric_defs(cls)}


METRICS = _metrics((*GPU_CLASSES, *NODE_CLASSES))
# The readings a live subject of each scope is: a GPU's readings, a MIG instance, one
# process' allocator probe, an engine target, the node's exporter info.
SUBJECTS: Mapping[Scope, tuple[type, ...]] = {
    "node": (ExporterInfo,),
    "gpu": GPU_CLASSES,
    "mig": (MigInstance,),
    "allocator": (AllocatorProcess,),
    "engine": (EngineTargetReading,),
}
# family -> (reading class, field) for the families declared on a top-level field of a subject
FIELDS: dict[str, tuple[type, str]] = {
    f.metadata["metric"].name: (cls, f.name)
    for classes in SUBJECTS.values()
    for cls in classes
    for f in dataclasses.fields(cls)
    if "metric" in f.metadata
}


@dataclass(frozen=True)
class Source:
    """One metric family an input reads, the label matchers that pick its series, and how
    its samples reduce."""

    family: str
    reduce: Reduce = FIRST
    match: Labels = ()

    @cached_property
    def metric(self) -> MetricDef:
        return METRICS[self.family]

    @cached_property
    def own_label(self) -> str:
        """The label a mapping field's keys become (`reason`, `xid`, `family`)."""
        return self.metric.label or ""

    @cached_property
    def wanted(self) -> str | None:
        """The key a matcher on the family's own label picks."""
        return dict(self.match).get(self.own_label) if self.own_label else None

    def picks(self, labels: Labels) -> bool:
        return all(label(labels, k) == v for k, v in self.match)

    def selector(self, matchers: str = "") -> str:
        """PromQL: `family{matchers, own matchers}`."""
        own = ", ".join(f'{k}="{v}"' for k, v in self.match)
        inner = ", ".join(m for m in (matchers, own) if m)
        return f"{self.family}{{{inner}}}" if inner else self.family


@dataclass(frozen=True)
class Input:
    """One frame field: its scope, the sources it reads, and the function of their reduced
    values that gives the field (None: the one value as it is)."""

    field: str
    scope: Scope
    sources: tuple[Source, ...]
    normalise: Callable[..., Any] | None = None

    def of(self, values: Sequence[Any]) -> Any:
        return values[0] if self.normalise is None else self.normalise(*values)


@dataclass(frozen=True)
class LiveOnly:
    """A frame field the exporter never exports: the live frame reads it from the subject's
    reading; a frame rebuilt from a store puts `stored(fields, taken_at)` or leaves it empty."""

    field: str
    scope: Scope
    live: Callable[[Any], Any]
    why: str
    stored: Callable[[Mapping[str, Any], float], Any] | None = None


def _src(family: str | Source) -> Source:
    return family if isinstance(family, Source) else Source(family)


def _on(scope: Scope) -> Callable[..., Input]:
    def declare(field: str, *sources: str | Source, then: Callable[..., Any] | None = None) -> Input:
        return Input(field, scope, tuple(_src(s) for s in sources), then)

    return declare


gpu, mig, allocator, engine, node = (_on(s) for s in ("gpu", "mig", "allocator", "engine", "node"))


# ---- normalisers ----------------------------------------------------------------------


def _flag(v: float | None) -> bool:
    return v == 1


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def _number(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _info(key: str) -> Callable[[Mapping[str, str] | None], str]:
    return lambda info: (info or {}).get(key, "")


def _numa(info: Mapping[str, str] | None) -> int | None:
    numa = (info or {}).get("numa_node", "")
    return int(numa) if numa.lstrip("-").isdigit() else None


def _ratio(value: float | None, peak: float | None) -> float | None:
    return value / peak if value is not None and peak else None


def active_reasons(active: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The clock-event reasons holding clocks down. HW slowdown is raised with the power
    brake (and other external signals) as well as with heat: while the brake bit is set
    it explains the slowdown, not heat."""
    if active is not None and "hw_power_brake" in active:
        return tuple(r for r in active if r != "hw_slowdown")
    return active


def links_up(
    up: float | None,
    tx: float | None,
    rx: float | None,
    supported: Mapping[str, float] | None,
    info: Mapping[str, str] | None,
) -> int | None:
    """Active NVLink links; 0 on a GPU without NVLink (its peers are reached over PCIe)."""
    if up is not None:
        return int(up)
    if tx is not None or rx is not None:
        return None  # links without a state: the GPU cannot say
    if supported is not None and supported.get("nvlink") == 0:
        return 0
    # The full profile says so per GPU; the default one leaves it to the part's datasheet.
    spec = spec_of((info or {}).get("name", ""))
    return 0 if spec is not None and spec.nvlinks == 0 else None


def _xids(counts: Mapping[str, float] | None) -> Mapping[int, int] | None:
    if counts is None:
        return None
    return {int(x): int(v) for x, v in counts.items() if x.lstrip("-").isdigit()} or NO_XIDS


def _label_set(key: str) -> Callable[[Sequence[Row]], list[str]]:
    """The values of one label over the rows, sorted."""
    return lambda rows: sorted({v for lb, _ in rows if (v := label(lb, key))})


def _numbered(key: str) -> Callable[[Sequence[Row]], tuple[int, ...]]:
    """The values of a numeric label (pid, gpu) over the rows, sorted."""
    return lambda rows: tuple(sorted({int(v) for lb, _ in rows if (v := label(lb, key)) and v.isdigit()}))


def _by_pid(rows: Sequence[Row]) -> dict[int, float]:
    """The rows' values by their `pid` label."""
    return {int(v): value for lb, value in rows if (v := label(lb, "pid")) and v.isdigit()}


def _by_pid_known(rows: Sequence[Row]) -> dict[int, float] | None:
    return _by_pid(rows) if rows else None


def _owners(rows: Sequence[Row]) -> dict[int, str]:
    """Each process' owner: `namespace/pod` where it has one, else its name."""
    out = {}
    for lb, _ in rows:
        pid = label(lb, "pid")
        if pid and pid.isdigit():
            ns, pod = label(lb, "namespace"), label(lb, "pod")
            out[int(pid)] = f"{ns}/{pod}" if ns and pod else (label(lb, "process") or f"pid {pid}")
    return out


def _quantile(q: float) -> Callable[[Sequence[Row]], float | None]:
    def pick(rows: Sequence[Row]) -> float | None:
        found = [v for lb, v in rows if _number(label(lb, "quantile")) == q]
        return max(found) if found else None

    return pick


def _config(key: str, fn: Callable[[list[float]], float]) -> Callable[[Sequence[Row]], float | None]:
    """A number from a label of the engine's cache-config info, over its series."""

    def read(rows: Sequence[Row]) -> float | None:
        found = [n for lb, _ in rows if (n := _number(label(lb, key))) is not None]
        return float(fn(found)) if found else None

    return read


# ---- the inputs -------------------------------------------------------------------------

INFO_SRC = Source("llmgpu_gpu_info", INFO)
PROCESS_MEMORY = Source("llmgpu_gpu_process_memory_used_bytes", ROWS)
GPU: tuple[Input, ...] = (
    gpu("up", GPU_UP, then=_flag),
    gpu("name", INFO_SRC, then=_info("name")),
    gpu("numa_node", INFO_SRC, then=_numa),
    gpu("memory_total_bytes", "llmgpu_gpu_memory_total_bytes"),
    gpu("memory_used_bytes", "llmgpu_gpu_memory_used_bytes"),
    gpu("memory_free_bytes", "llmgpu_gpu_memory_free_bytes"),
    gpu("util_ratio", "llmgpu_gpu_utilization_ratio"),
    gpu("sm_active_ratio", "llmgpu_gpu_sm_active_ratio"),
    gpu("tensor_active_ratio", "llmgpu_gpu_tensor_active_ratio"),
    gpu("dram_active_ratio", "llmgpu_gpu_dram_active_ratio"),
    gpu("dram_peak_bytes_per_second", "llmgpu_gpu_dram_bandwidth_peak_bytes_per_second"),
    gpu("sm_clock_ratio", "llmgpu_gpu_sm_clock_hertz", "llmgpu_gpu_sm_clock_max_hertz", then=_ratio),
    gpu("throttle_reasons", Source("llmgpu_gpu_clock_event_active", ON), then=active_reasons),
    gpu("power_watts", "llmgpu_gpu_power_watts"),
    gpu("power_limit_watts", "llmgpu_gpu_power_limit_watts"),
    gpu("energy_joules_total", "llmgpu_gpu_energy_joules_total"),
    gpu("temperature_celsius", "llmgpu_gpu_temperature_celsius"),
    gpu("pcie_replays_total", "llmgpu_gpu_pcie_replays_total"),
    gpu(
        "nvlink_links_up",
        "llmgpu_gpu_nvlink_links_up",
        "llmgpu_gpu_nvlink_tx_bytes_total",
        "llmgpu_gpu_nvlink_rx_bytes_total",
        Source("llmgpu_gpu_metric_supported", KEYED, (("family", "nvlink"),)),  # full profile only
        INFO_SRC,
        then=links_up,
    ),
    gpu("nvlink_links_sleeping", "llmgpu_gpu_nvlink_links_sleeping", then=_int),
    gpu("nvlink_tx_bytes_per_second", "llmgpu_gpu_nvlink_tx_bytes_per_second"),
    gpu("nvlink_rx_bytes_per_second", "llmgpu_gpu_nvlink_rx_bytes_per_second"),
    gpu("nvlink_tx_bytes_total", "llmgpu_gpu_nvlink_tx_bytes_total"),
    gpu("nvlink_rx_bytes_total", "llmgpu_gpu_nvlink_rx_bytes_total"),
    gpu("ecc_uncorrected_total", "llmgpu_gpu_ecc_uncorrected_errors_total"),
    gpu("remap_failed", "llmgpu_gpu_row_remap_failed", then=_flag),
    gpu("xid_counts", Source("llmgpu_gpu_xid_errors_total", NONZERO), then=_xids),
    gpu("process_pids", PROCESS_MEMORY, then=_numbered("pid")),
    gpu("process_count", "llmgpu_gpu_processes", then=_int),
    gpu("process_memory", PROCESS_MEMORY, then=_by_pid),
    gpu("process_owner", PROCESS_MEMORY, then=_owners),
    # the shared profile's: a store keeps it where the fleet picked that profile
    gpu("process_sm", Source("llmgpu_gpu_process_sm_utilization_ratio", ROWS), then=_by_pid_known),
    gpu("mig_enabled", "llmgpu_gpu_mig_enabled", then=_flag),
)
MIG: tuple[Input, ...] = (
    mig("memory_used_bytes", "llmgpu_gpu_mig_memory_used_bytes"),
    mig("memory_total_bytes", "llmgpu_gpu_mig_memory_total_bytes"),
)
ALLOCATOR: tuple[Input, ...] = (
    allocator("reserved_bytes", "llmgpu_allocator_reserved_bytes"),
    allocator("allocated_bytes", "llmgpu_allocator_allocated_bytes"),
    allocator("free_bytes", "llmgpu_allocator_free_bytes"),
    allocator("largest_free_block_bytes", "llmgpu_allocator_largest_free_block_bytes"),
    allocator("fragmentation_ratio", "llmgpu_allocator_fragmentation_ratio"),
    allocator("alloc_retries_total", "llmgpu_allocator_alloc_retries_total"),
    allocator("ooms_total", "llmgpu_allocator_ooms_total"),
)
# An engine target's series (models, data-parallel ranks) summed, maxed or minned.
TTFT = Source("llmgpu_engine_time_to_first_token_quantile_seconds", ROWS, (("window", "1m"),))
ITL = Source("llmgpu_engine_inter_token_latency_quantile_seconds", ROWS, (("window", "1m"),))
CACHE = Source("llmgpu_engine_cache_config_info", ROWS)
ENGINE: tuple[Input, ...] = (
    engine("up", Source(ENGINE_UP, MAX), then=_flag),
    engine("gpus", Source("llmgpu_engine_gpu_info", ROWS), then=_numbered("gpu")),
    engine("gpu_uuids", Source("llmgpu_engine_gpu_info", ROWS), then=lambda r: tuple(_label_set("uuid")(r))),
    engine("running", Source("llmgpu_engine_requests_running", SUM)),
    engine("waiting", Source("llmgpu_engine_requests_waiting", SUM)),
    engine("kv_usage_ratio", Source("llmgpu_engine_kv_cache_usage_ratio", MAX)),
    engine("preemptions_total", Source("llmgpu_engine_preemptions_total", SUM)),
    engine("preemptions_per_second", Source("llmgpu_engine_preemptions_per_second", SUM)),
    engine("generation_tokens_per_second", Source("llmgpu_engine_generation_tokens_per_second", SUM)),
    engine("generation_tokens_total", Source("llmgpu_engine_generation_tokens_total", SUM)),
    engine("prompt_tokens_per_second", Source("llmgpu_engine_prompt_tokens_per_second", SUM)),
    engine("request_rate_per_second", Source("llmgpu_engine_request_rate_per_second", SUM)),
    engine("rejected_total", Source("llmgpu_engine_rejected_requests_total", SUM)),
    engine("spec_acceptance_ratio", Source("llmgpu_engine_spec_decode_acceptance_ratio", MIN)),
    engine("ttft_p50_seconds", TTFT, then=_quantile(0.5)),
    engine("ttft_p99_seconds", TTFT, then=_quantile(0.99)),
    engine("itl_p50_seconds", ITL, then=_quantile(0.5)),
    engine("itl_p99_seconds", ITL, then=_quantile(0.99)),
    engine("gpu_memory_utilization", CACHE, then=_config("gpu_memory_utilization", max)),
    engine("kv_cache_max_concurrency", CACHE, then=_config("kv_cache_max_concurrency", sum)),
    engine("api_server_cpu_ratio", Source("llmgpu_engine_process_cpu_ratio", MAX, (("role", "api_server"),))),
    engine("estimated_flops_per_gpu_total", Source("llmgpu_engine_estimated_flops_per_gpu_total", SUM)),
    engine(
        "estimated_read_bytes_per_gpu_total", Source("llmgpu_engine_estimated_read_bytes_per_gpu_total", SUM)
    ),
    engine(
        "waiting_deferred",
        Source("llmgpu_engine_requests_waiting_by_reason", SUM, (("reason", "deferred"),)),
    ),
    engine("max_num_seqs", Source("llmgpu_engine_max_num_seqs", MAX), then=_int),
    engine("max_num_batched_tokens", Source("llmgpu_engine_max_num_batched_tokens", MAX), then=_int),
    engine("disagg_queues", Source("llmgpu_engine_disagg_queue_requests", KEYED)),
    engine("kv_transfer_latency_seconds", Source("llmgpu_engine_kv_transfer_latency_seconds", MAX)),
    engine("kv_transfer_failures_total", Source("llmgpu_engine_kv_transfer_failures_total", SUM)),
)
NODE: tuple[Input, ...] = (node("simulated", Source("llmgpu_exporter_simulated", MAX), then=_flag),)
INPUTS: tuple[Input, ...] = (*NODE, *GPU, *MIG, *ALLOCATOR, *ENGINE)
# An engine is named by the models of its series (not by the model its up and join rows
# keep while it is down).
SERIES_FAMILIES = frozenset(m.name for m in metric_defs(EngineSeries))


def _stored_scrape(fields: Mapping[str, Any], taken_at: float) -> float | None:
    return taken_at if fields.get("up") else None


def _numa_nodes(t: EngineTargetReading) -> tuple[int, ...] | None:
    return None if t.cpu_numa_nodes is None else tuple(t.cpu_numa_nodes)


def _pid_namespace(r: ProbeReport) -> str | None:
    return r.pid_namespace


LIVE_ONLY: tuple[LiveOnly, ...] = (
    LiveOnly(
        "pids", "engine", lambda t: t.pids, "the engine's process tree: a pid label per process is a cost"
    ),
    LiveOnly(
        "ns_pids", "engine", lambda t: ns_pids(t.pids), "the same processes in their pid namespace (/proc)"
    ),
    LiveOnly("cpu_numa_nodes", "engine", _numa_nodes, "the NUMA nodes of the engine's CPUs (/proc, sysfs)"),
    LiveOnly(
        "scraped_at",
        "engine",
        lambda t: t.scraped_at,
        "when the engine's counters were read; a store has the sample's time, which stands in for it",
        stored=_stored_scrape,
    ),
    LiveOnly("pid_namespace", "allocator", _pid_namespace, "the probe's pid namespace, as its file says"),
)


def _scopes(inputs: Iterable[Input]) -> dict[str, tuple[Scope, Labels]]:
    """family -> (scope, matchers): a family belongs to one scope and is read through one
    set of matchers, so that one query serves every input reading it."""
    out: dict[str, tuple[Scope, Labels]] = {}
    for inp in inputs:
        for src in inp.sources:
            assert src.family in METRICS, f"{inp.field}: {src.family} is not a declared metric"
            if src.reduce.field is not None and src.family in FIELDS:
                # the field form filters only on the family's own label
                assert all(k == src.metric.label for k, _ in src.match), src
            seen = out.setdefault(src.family, (inp.scope, src.match))
            assert seen == (inp.scope, src.match), f"{src.family} read with two scopes or matchers"
    return out


FAMILIES = _scopes(INPUTS)
SOURCES: tuple[Source, ...] = tuple(Source(name, ROWS, match) for name, (_, match) in FAMILIES.items())
# The families the live frame reads off a subject's own field (every source of them can);
# the others it takes from the exposition's walk.
FIELD_FORM = frozenset(
    name
    for name, (scope, _) in FAMILIES.items()
    if name in FIELDS
    and FIELDS[name][0] in SUBJECTS[scope]
    and all(s.reduce.field is not None for i in INPUTS for s in i.sources if s.family == name)
)
