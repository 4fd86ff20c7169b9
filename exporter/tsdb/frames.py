"""Frames rebuilt from stored series: the TSDB twin of `frame_of(snapshot)`.

Each field comes from the metric the exporter writes it to:

* GPU: `gpu`/`uuid` labels of `llmgpu_gpu_up`; name and NUMA node from `llmgpu_gpu_info`;
  `sm_clock_ratio` = `llmgpu_gpu_sm_clock_hertz / llmgpu_gpu_sm_clock_max_hertz`;
  `throttle_reasons` = the `reason`s with `llmgpu_gpu_clock_event_active == 1`; NVLink
  totals = the sum of the per-link counters, links up = the sum of `llmgpu_gpu_nvlink_up`
  (0 on a GPU whose NVLink family is unsupported); XID counts from
  `llmgpu_gpu_xid_errors_total{xid}`; allocator probes by `pid`.
* engine: one frame per `target` of `llmgpu_engine_up`, its series (models,
  data-parallel ranks) summed, maxed or minned as `frame_of` does; latency quantiles from
  `window="1m"`; its GPUs from the `llmgpu_engine_gpu_info` join table;
  `gpu_memory_utilization` from the `llmgpu_engine_cache_config_info` label.

What the exporter never exports stays empty: the engines' process ids and the NUMA
nodes of their CPUs (so `hardware/numa_mismatch` cannot fire from a TSDB).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.diagnosis.frame import (
    NO_XIDS,
    AllocFrame,
    EngineFrame,
    Frame,
    GpuFrame,
    MigFrame,
    short_target,
)
from exporter.gpu_specs import spec_of
from exporter.tsdb.families import TIMELINE

Labels = Mapping[str, str]
Row = tuple[Labels, float]


@dataclass
class NodeSeries:
    """Every fetched series of one node, by family name, points keyed by time."""

    families: dict[str, list[tuple[Labels, dict[float, float]]]] = field(default_factory=dict)

    def add(self, family: str, labels: Labels, points: Iterable[tuple[float, float]]) -> None:
        self.families.setdefault(family, []).append((labels, dict(points)))

    def times(self) -> list[float]:
        """The node's scrape times: where its build-info series (or any GPU or engine) has a point."""
        stamps: set[float] = set()
        for name in (TIMELINE, "llmgpu_gpu_up", "llmgpu_engine_up"):
            for _, points in self.families.get(name, ()):
                stamps.update(points)
        return sorted(stamps)

    def at(self, t: float) -> dict[str, list[Row]]:
        return {
            name: [(labels, points[t]) for labels, points in series if t in points]
            for name, series in self.families.items()
        }


def frames(node: NodeSeries, taken_at: Callable[[float], float] = float) -> list[Frame]:
    """One frame per scrape time of the node, oldest first; `taken_at` maps a sample's
    time to the frame's (a time scale for simulations played fast)."""
    return [frame_at(node.at(t), taken_at(t)) for t in node.times()]


def frame_at(rows: Mapping[str, list[Row]], taken_at: float) -> Frame:
    gpus = _gpus(rows)
    engines = _engines(rows, taken_at)
    simulated = any(v == 1 for _, v in rows.get("llmgpu_exporter_simulated", ()))
    return Frame(taken_at, gpus, engines, simulated)


# ---- GPUs ----------------------------------------------------------------------------


class _ByGpu:
    """The rows of each family grouped by GPU index."""

    def __init__(self, rows: Mapping[str, list[Row]]) -> None:
        self._groups: dict[str, dict[int, list[Row]]] = {}
        for name, items in rows.items():
            groups: dict[int, list[Row]] = {}
            for labels, v in items:
                gpu = labels.get("gpu", "")
                if gpu.isdigit():
                    groups.setdefault(int(gpu), []).append((labels, v))
            if groups:
                self._groups[name] = groups

    def rows(self, name: str, index: int) -> list[Row]:
        return self._groups.get(name, {}).get(index, [])

    def value(self, name: str, index: int) -> float | None:
        found = self.rows(name, index)
        return found[0][1] if found else None

    def labels(self, name: str, index: int) -> Labels | None:
        found = self.rows(name, index)
        return found[0][0] if found else None

    def by(self, name: str, index: int, label: str) -> dict[str, float]:
        return {lb.get(label, ""): v for lb, v in self.rows(name, index)}


def _gpus(rows: Mapping[str, list[Row]]) -> tuple[GpuFrame, ...]:
    by = _ByGpu(rows)
    ups = {int(lb["gpu"]): (lb, v) for lb, v in rows.get("llmgpu_gpu_up", ()) if lb.get("gpu", "").isdigit()}
    return tuple(_gpu(by, index, labels, up) for index, (labels, up) in sorted(ups.items()))


def _gpu(by: _ByGpu, i: int, up_labels: Labels, up: float) -> GpuFrame:
    info = by.labels("llmgpu_gpu_info", i) or {}
    numa = info.get("numa_node", "")
    sm, sm_max = by.value("llmgpu_gpu_sm_clock_hertz", i), by.value("llmgpu_gpu_sm_clock_max_hertz", i)
    events = by.by("llmgpu_gpu_clock_event_active", i, "reason")
    xids = by.by("llmgpu_gpu_xid_errors_total", i, "xid")
    procs = by.by("llmgpu_gpu_process_memory_used_bytes", i, "pid")
    return GpuFrame(
        index=i,
        uuid=up_labels.get("uuid", ""),
        up=up == 1,
        name=info.get("name", ""),
        numa_node=int(numa) if numa.lstrip("-").isdigit() else None,
        memory_total_bytes=by.value("llmgpu_gpu_memory_total_bytes", i),
        memory_used_bytes=by.value("llmgpu_gpu_memory_used_bytes", i),
        memory_free_bytes=by.value("llmgpu_gpu_memory_free_bytes", i),
        util_ratio=by.value("llmgpu_gpu_utilization_ratio", i),
        sm_active_ratio=by.value("llmgpu_gpu_sm_active_ratio", i),
        tensor_active_ratio=by.value("llmgpu_gpu_tensor_active_ratio", i),
        dram_active_ratio=by.value("llmgpu_gpu_dram_active_ratio", i),
        dram_peak_bytes_per_second=by.value("llmgpu_gpu_dram_bandwidth_peak_bytes_per_second", i),
        sm_clock_ratio=sm / sm_max if sm is not None and sm_max else None,
        throttle_reasons=tuple(sorted(r for r, v in events.items() if v == 1)) if events else None,
        power_watts=by.value("llmgpu_gpu_power_watts", i),
        power_limit_watts=by.value("llmgpu_gpu_power_limit_watts", i),
        temperature_celsius=by.value("llmgpu_gpu_temperature_celsius", i),
        pcie_replays_total=by.value("llmgpu_gpu_pcie_replays_total", i),
        nvlink_links_up=_links_up(by, i, info.get("name", "")),
        energy_joules_total=by.value("llmgpu_gpu_energy_joules_total", i),
        nvlink_tx_bytes_per_second=by.value("llmgpu_gpu_nvlink_tx_bytes_per_second", i),
        nvlink_rx_bytes_per_second=by.value("llmgpu_gpu_nvlink_rx_bytes_per_second", i),
        nvlink_tx_bytes_total=_total(by.rows("llmgpu_gpu_nvlink_tx_bytes_total", i)),
        nvlink_rx_bytes_total=_total(by.rows("llmgpu_gpu_nvlink_rx_bytes_total", i)),
        ecc_uncorrected_total=by.value("llmgpu_gpu_ecc_uncorrected_errors_total", i),
        remap_failed=by.value("llmgpu_gpu_row_remap_failed", i) == 1,
        xid_counts=_xids(xids) if xids else None,
        process_pids=tuple(sorted(int(p) for p in procs if p.isdigit())),
        process_count=_int(by.value("llmgpu_gpu_processes", i)),
        mig_enabled=by.value("llmgpu_gpu_mig_enabled", i) == 1,
        mig=_mig(by, i),
        allocators=_allocators(by, i),
    )


def _links_up(by: _ByGpu, i: int, name: str) -> int | None:
    up = by.value("llmgpu_gpu_nvlink_links_up", i)
    if up is not None:
        return int(up)
    if by.rows("llmgpu_gpu_nvlink_tx_bytes_total", i) or by.rows("llmgpu_gpu_nvlink_rx_bytes_total", i):
        return None  # links without a state: the GPU cannot say
    # No link at all: a GPU without NVLink reaches its peers over PCIe. The full profile
    # says so per GPU; the default one leaves it to the part's datasheet.
    if by.by("llmgpu_gpu_metric_supported", i, "family").get("nvlink") == 0:
        return 0
    spec = spec_of(name)
    return 0 if spec is not None and spec.nvlinks == 0 else None


def _total(rows: list[Row]) -> float | None:
    return float(sum(v for _, v in rows)) if rows else None


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def _xids(counts: Mapping[str, float]) -> Mapping[int, int]:
    seen = {int(x): int(v) for x, v in counts.items() if x.lstrip("-").isdigit() and v}
    return seen or NO_XIDS


def _mig(by: _ByGpu, i: int) -> tuple[MigFrame, ...]:
    used = {lb.get("mig_uuid", ""): (lb, v) for lb, v in by.rows("llmgpu_gpu_mig_memory_used_bytes", i)}
    total = {lb.get("mig_uuid", ""): (lb, v) for lb, v in by.rows("llmgpu_gpu_mig_memory_total_bytes", i)}
    out = []
    for uuid in used.keys() | total.keys():
        labels = (used.get(uuid) or total[uuid])[0]
        order = (_num(labels.get("gpu_instance")), _num(labels.get("compute_instance")), uuid)
        u, t = used.get(uuid), total.get(uuid)
        out.append((order, MigFrame(uuid, u[1] if u else None, t[1] if t else None)))
    return tuple(m for _, m in sorted(out, key=lambda x: x[0]))


def _num(text: str | None) -> int:
    return int(text) if text and text.isdigit() else -1


ALLOCATOR_FIELDS = {
    "llmgpu_allocator_reserved_bytes": "reserved_bytes",
    "llmgpu_allocator_allocated_bytes": "allocated_bytes",
    "llmgpu_allocator_free_bytes": "free_bytes",
    "llmgpu_allocator_largest_free_block_bytes": "largest_free_block_bytes",
    "llmgpu_allocator_fragmentation_ratio": "fragmentation_ratio",
    "llmgpu_allocator_alloc_retries_total": "alloc_retries_total",
    "llmgpu_allocator_ooms_total": "ooms_total",
}


def _allocators(by: _ByGpu, i: int) -> tuple[AllocFrame, ...]:
    fields: dict[int, dict[str, Any]] = {}
    for family, name in ALLOCATOR_FIELDS.items():
        for pid, v in by.by(family, i, "pid").items():
            if pid.isdigit():
                fields.setdefault(int(pid), {})[name] = v
    return tuple(AllocFrame(pid=pid, **values) for pid, values in sorted(fields.items()))


# ---- engines -------------------------------------------------------------------------

# families with one series per (model, data-parallel rank) of an engine target
SERIES_FAMILIES = (
    "llmgpu_engine_requests_running",
    "llmgpu_engine_requests_waiting",
    "llmgpu_engine_kv_cache_usage_ratio",
    "llmgpu_engine_preemptions_total",
    "llmgpu_engine_preemptions_per_second",
    "llmgpu_engine_generation_tokens_per_second",
    "llmgpu_engine_prompt_tokens_per_second",
    "llmgpu_engine_request_rate_per_second",
    "llmgpu_engine_rejected_requests_total",
    "llmgpu_engine_spec_decode_acceptance_ratio",
    "llmgpu_engine_time_to_first_token_quantile_seconds",
    "llmgpu_engine_inter_token_latency_quantile_seconds",
    "llmgpu_engine_cache_config_info",
    "llmgpu_engine_estimated_flops_per_gpu_total",
    "llmgpu_engine_estimated_read_bytes_per_gpu_total",
    "llmgpu_engine_requests_waiting_by_reason",
    "llmgpu_engine_generation_tokens_total",
)


def _engines(rows: Mapping[str, list[Row]], taken_at: float) -> tuple[EngineFrame, ...]:
    by: dict[str, dict[str, list[Row]]] = {}
    for name, items in rows.items():
        if name.startswith("llmgpu_engine_"):
            for labels, v in items:
                if "target" in labels:
                    by.setdefault(labels["target"], {}).setdefault(name, []).append((labels, v))
    out = []
    for target in sorted(by):
        fams = by[target]
        if "llmgpu_engine_up" in fams:
            out.append(_engine(target, fams, taken_at))
    return tuple(out)


def _engine(target: str, fams: Mapping[str, list[Row]], taken_at: float) -> EngineFrame:
    def values(name: str, **match: str) -> list[float]:
        return [v for lb, v in fams.get(name, ()) if all(lb.get(k) == w for k, w in match.items())]

    models = sorted(
        {lb["model"] for name in SERIES_FAMILIES for lb, _ in fams.get(name, ()) if lb.get("model")}
    )
    kinds = [lb.get("engine", "") for lb, _ in fams.get("llmgpu_engine_up", ())]
    kinds += [lb.get("engine", "") for name in SERIES_FAMILIES for lb, _ in fams.get(name, ())]
    kind = next((k for k in kinds if k), "")
    short = ", ".join(m.rsplit("/", 1)[-1] for m in models) or kind or "engine"
    links = fams.get("llmgpu_engine_gpu_info", ())
    gpus = tuple(sorted({int(lb["gpu"]) for lb, _ in links if lb.get("gpu", "").isdigit()}))
    budgets = [
        _float(lb.get("gpu_memory_utilization")) for lb, _ in fams.get("llmgpu_engine_cache_config_info", ())
    ]
    return EngineFrame(
        target=target,
        name=f"{short} @ {short_target(target)}",
        model=", ".join(models),
        kind=kind,
        up=any(v == 1 for v in values("llmgpu_engine_up")),
        gpus=gpus,
        gpu_uuids=tuple(sorted({lb.get("uuid", "") for lb, _ in links if lb.get("uuid")})),
        running=_sum(values("llmgpu_engine_requests_running")),
        waiting=_sum(values("llmgpu_engine_requests_waiting")),
        kv_usage_ratio=_max(values("llmgpu_engine_kv_cache_usage_ratio")),
        preemptions_total=_sum(values("llmgpu_engine_preemptions_total")),
        preemptions_per_second=_sum(values("llmgpu_engine_preemptions_per_second")),
        generation_tokens_per_second=_sum(values("llmgpu_engine_generation_tokens_per_second")),
        prompt_tokens_per_second=_sum(values("llmgpu_engine_prompt_tokens_per_second")),
        request_rate_per_second=_sum(values("llmgpu_engine_request_rate_per_second")),
        rejected_total=_sum(values("llmgpu_engine_rejected_requests_total")),
        spec_acceptance_ratio=_min(values("llmgpu_engine_spec_decode_acceptance_ratio")),
        ttft_p50_seconds=_max(_quantile(fams, "llmgpu_engine_time_to_first_token_quantile_seconds", 0.5)),
        ttft_p99_seconds=_max(_quantile(fams, "llmgpu_engine_time_to_first_token_quantile_seconds", 0.99)),
        itl_p50_seconds=_max(_quantile(fams, "llmgpu_engine_inter_token_latency_quantile_seconds", 0.5)),
        itl_p99_seconds=_max(_quantile(fams, "llmgpu_engine_inter_token_latency_quantile_seconds", 0.99)),
        gpu_memory_utilization=_max([b for b in budgets if b is not None]),
        api_server_cpu_ratio=_max(values("llmgpu_engine_process_cpu_ratio", role="api_server")),
        estimated_flops_per_gpu_total=_sum(values("llmgpu_engine_estimated_flops_per_gpu_total")),
        estimated_read_bytes_per_gpu_total=_sum(values("llmgpu_engine_estimated_read_bytes_per_gpu_total")),
        waiting_deferred=_sum(values("llmgpu_engine_requests_waiting_by_reason", reason="deferred")),
        generation_tokens_total=_sum(values("llmgpu_engine_generation_tokens_total")),
        # the stored sample's time stands for the engine's own scrape (within one interval)
        scraped_at=taken_at if any(v == 1 for v in values("llmgpu_engine_up")) else None,
        max_num_seqs=_int(_max(values("llmgpu_engine_max_num_seqs"))),
        max_num_batched_tokens=_int(_max(values("llmgpu_engine_max_num_batched_tokens"))),
        kv_cache_max_concurrency=_sum(
            [
                c
                for lb, _ in fams.get("llmgpu_engine_cache_config_info", ())
                if (c := _float(lb.get("kv_cache_max_concurrency"))) is not None
            ]
        ),
    )


def _quantile(fams: Mapping[str, list[Row]], name: str, q: float) -> list[float]:
    out = []
    for lb, v in fams.get(name, ()):
        if lb.get("window", "1m") != "1m":
            continue
        value = _float(lb.get("quantile"))
        if value is not None and value == q:
            out.append(v)
    return out


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def _sum(vs: list[float]) -> float | None:
    return float(sum(vs)) if vs else None


def _max(vs: list[float]) -> float | None:
    return max(vs) if vs else None


def _min(vs: list[float]) -> float | None:
    return min(vs) if vs else None
