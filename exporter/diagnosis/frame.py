"""The numbers the rules read, pulled out of a Snapshot once per cycle.

A `Frame` is a flat, typed view of one snapshot: per GPU, per engine, per allocator
probe. The rules and the history work on frames only, so they never depend on how a
reading class nests its fields, and a history of frames is small (a few hundred bytes
per GPU per sample) where a history of snapshots would keep every reading alive.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

from exporter.allocator_readings import AllocatorProbes
from exporter.diagnosis.pidns import ns_pids
from exporter.engines.readings import EngineGpus, Engines, EngineSeries, EngineTargetReading
from exporter.gpu_readings import (
    Clocks,
    DeviceFacts,
    Ecc,
    Memory,
    Mig,
    NvLink,
    Pcie,
    Power,
    Processes,
    Profiling,
    Utilization,
    Xid,
)
from exporter.gpu_specs import spec_of
from exporter.snapshot import GpuState, Snapshot

THERMAL_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake")


def short_target(target: str) -> str:
    """http://10.0.0.5:8000/metrics -> 10.0.0.5:8000"""
    return target.removeprefix("http://").removeprefix("https://").removesuffix("/metrics")


@dataclass(frozen=True, slots=True)
class AllocFrame:
    """One process' PyTorch caching allocator, as the allocator probe reports it."""

    pid: int  # in the probe's own pid namespace
    reserved_bytes: float | None = None
    allocated_bytes: float | None = None
    free_bytes: float | None = None  # free inside reserved segments
    largest_free_block_bytes: float | None = None
    fragmentation_ratio: float | None = None
    alloc_retries_total: float | None = None
    ooms_total: float | None = None
    pid_namespace: str | None = None  # "pid:[4026532000]", as the probe reports it
    uuid: str = ""  # the GPU (or MIG instance) the probe's process runs on


@dataclass(frozen=True, slots=True)
class MigFrame:
    uuid: str
    memory_used_bytes: float | None
    memory_total_bytes: float | None


@dataclass(frozen=True, slots=True)
class GpuFrame:
    index: int
    uuid: str
    up: bool
    name: str = ""
    numa_node: int | None = None
    memory_total_bytes: float | None = None
    memory_used_bytes: float | None = None
    memory_free_bytes: float | None = None
    util_ratio: float | None = None
    sm_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    dram_peak_bytes_per_second: float | None = None
    sm_clock_ratio: float | None = None  # current SM clock over its maximum
    throttle_reasons: tuple[str, ...] | None = None  # active clock-event reasons
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules_total: float | None = None  # NVML's energy counter (since driver load)
    temperature_celsius: float | None = None
    pcie_replays_total: float | None = None
    nvlink_links_up: int | None = None  # None: the GPU has no NVLink (or cannot say)
    nvlink_tx_bytes_per_second: float | None = None  # GPM, when the GPU has it
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_total: float | None = None  # link counters, for GPUs without GPM
    nvlink_rx_bytes_total: float | None = None
    ecc_uncorrected_total: float | None = None
    remap_failed: bool = False
    xid_counts: Mapping[int, int] | None = None  # XIDs seen, zero counts left out; None: no XID data
    process_pids: tuple[int, ...] = ()
    process_count: int | None = None
    mig_enabled: bool = False
    mig: tuple[MigFrame, ...] = ()
    allocators: tuple[AllocFrame, ...] = ()

    @property
    def memory_used_ratio(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes

    @property
    def free_bytes(self) -> float | None:
        if self.memory_free_bytes is not None:
            return self.memory_free_bytes
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_used_bytes

    @property
    def peak_flops(self) -> float | None:
        """Dense BF16 tensor peak of the part (datasheet), for MFU."""
        spec = spec_of(self.name)
        return spec.peak_bf16_flops if spec else None


@dataclass(frozen=True, slots=True)
class EngineFrame:
    """One engine scrape target, its series summed (data-parallel ranks, models)."""

    target: str
    name: str = ""  # what a person calls it: its model and where it listens
    model: str = ""
    kind: str = ""
    up: bool = True
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()  # the GPUs' (or MIG instances') UUIDs, when known
    pids: frozenset[int] = frozenset()
    ns_pids: frozenset[tuple[str, int]] = frozenset()  # the same processes inside their pid namespace
    running: float | None = None
    waiting: float | None = None
    kv_usage_ratio: float | None = None
    preemptions_total: float | None = None
    preemptions_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    generation_tokens_total: float | None = None
    scraped_at: float | None = None  # when the engine's counters were read (its last good scrape)
    prompt_tokens_per_second: float | None = None
    request_rate_per_second: float | None = None
    rejected_total: float | None = None
    spec_acceptance_ratio: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    itl_p50_seconds: float | None = None
    itl_p99_seconds: float | None = None
    gpu_memory_utilization: float | None = None
    api_server_cpu_ratio: float | None = None
    estimated_flops_per_gpu_total: float | None = None
    estimated_read_bytes_per_gpu_total: float | None = None
    cpu_numa_nodes: tuple[int, ...] | None = None  # NUMA nodes of the engine's CPUs
    waiting_deferred: float | None = None  # waiting for LoRA budget, KV transfer... (vLLM)
    max_num_seqs: int | None = None  # declared with the target; None: unknown
    max_num_batched_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None  # full-length requests the KV cache holds
    # written by the Diagnoser from its up/down record (diagnosis/recovery.py)
    down_since: float | None = None  # down since this sample, after it was up
    last_downtime_seconds: float | None = None  # the last down episode that ended
    recovered_at: float | None = None  # when it ended


@dataclass(frozen=True)
class Frame:
    taken_at: float
    gpus: tuple[GpuFrame, ...] = ()
    engines: tuple[EngineFrame, ...] = ()
    simulated: bool = False

    @cached_property
    def _by_index(self) -> dict[int, GpuFrame]:
        return {g.index: g for g in self.gpus}

    @cached_property
    def _by_target(self) -> dict[str, EngineFrame]:
        return {e.target: e for e in self.engines}

    def gpu(self, index: int) -> GpuFrame | None:
        return self._by_index.get(index)

    def engine(self, target: str) -> EngineFrame | None:
        return self._by_target.get(target)


# ---- from a snapshot -----------------------------------------------------------------


def frame_of(snapshot: Snapshot) -> Frame:
    allocators = _allocators(snapshot)
    gpus = tuple(_gpu(g, allocators.get(g.index, ())) for g in snapshot.gpus)
    engines = _engines(snapshot, gpus)
    return Frame(snapshot.taken_at, gpus, engines, snapshot.simulated)


def _gpu(state: GpuState, allocators: tuple[AllocFrame, ...]) -> GpuFrame:
    facts = state.get(DeviceFacts)
    util = state.get(Utilization)
    mem = state.get(Memory)
    clocks = state.get(Clocks)
    power = state.get(Power)
    prof = state.get(Profiling)
    pcie = state.get(Pcie)
    nvlink = state.get(NvLink)
    ecc = state.get(Ecc)
    xid = state.get(Xid)
    procs = state.get(Processes)
    mig = state.get(Mig)
    numa = facts.get("numa_node") if facts else ""
    sm_ratio = None
    if clocks and clocks.sm_hertz is not None and facts and facts.sm_clock_max_hertz:
        sm_ratio = clocks.sm_hertz / facts.sm_clock_max_hertz
    reasons = None
    if clocks and clocks.event_active is not None:
        active = {r for r, on in clocks.event_active.items() if on}
        # HW slowdown is raised with the power brake (and other external signals) as well
        # as with heat: while the brake bit is set it explains the slowdown, not heat.
        if "hw_power_brake" in active:
            active.discard("hw_slowdown")
        reasons = tuple(sorted(active))
    links_up = None
    tx_total = rx_total = None
    if nvlink is not None:  # the per-GPU totals, as the default profile exposes them
        links_up = nvlink.links_up
        tx_total, rx_total = _f(nvlink.tx_bytes), _f(nvlink.rx_bytes)
    elif state.supported.get("nvlink") is False:
        links_up = 0  # the GPU has no NVLink: its peers are reached over PCIe
    return GpuFrame(
        index=state.index,
        uuid=state.uuid,
        up=state.up,
        name=facts.get("name") if facts else "",
        numa_node=int(numa) if numa.lstrip("-").isdigit() else None,
        memory_total_bytes=_f(facts.memory_total_bytes if facts else None),
        memory_used_bytes=_f(mem.used_bytes if mem else None),
        memory_free_bytes=_f(mem.free_bytes if mem else None),
        util_ratio=util.gpu_busy_ratio if util else None,
        sm_active_ratio=prof.sm_active_ratio if prof else None,
        tensor_active_ratio=prof.tensor_active_ratio if prof else None,
        dram_active_ratio=prof.dram_active_ratio if prof else None,
        dram_peak_bytes_per_second=facts.dram_bandwidth_peak_bytes_per_second if facts else None,
        sm_clock_ratio=sm_ratio,
        throttle_reasons=reasons,
        power_watts=power.usage_watts if power else None,
        power_limit_watts=power.limit_watts if power else None,
        energy_joules_total=_f(power.energy_joules if power else None),
        temperature_celsius=power.gpu_celsius if power else None,
        pcie_replays_total=_f(pcie.replays if pcie else None),
        nvlink_links_up=links_up,
        nvlink_tx_bytes_per_second=prof.nvlink_tx_bytes_per_second if prof else None,
        nvlink_rx_bytes_per_second=prof.nvlink_rx_bytes_per_second if prof else None,
        nvlink_tx_bytes_total=tx_total,
        nvlink_rx_bytes_total=rx_total,
        ecc_uncorrected_total=_f(ecc.uncorrected if ecc else None),
        remap_failed=bool(ecc and ecc.remap_failed),
        xid_counts=_nonzero(xid.counts) if xid else None,
        process_pids=tuple(p.pid for p in procs.items) if procs else (),
        process_count=procs.count if procs else None,
        mig_enabled=bool(mig and mig.enabled),
        mig=tuple(
            MigFrame(i.mig_uuid, _f(i.memory_used_bytes), _f(i.memory_total_bytes))
            for i in (mig.instances if mig else ())
        ),
        allocators=allocators,
    )


NO_XIDS: Mapping[int, int] = MappingProxyType({})


def _nonzero(counts: Mapping[int, int] | None) -> Mapping[int, int] | None:
    if counts is None:
        return None
    seen = {k: v for k, v in counts.items() if v}
    return seen or NO_XIDS


def _f(value: float | None) -> float | None:
    return None if value is None else float(value)


def _engines(snapshot: Snapshot, gpus: tuple[GpuFrame, ...]) -> tuple[EngineFrame, ...]:
    targets = [t for engines in snapshot.all(Engines) for t in engines.targets]
    links = snapshot.get(EngineGpus)
    out = []
    for target in targets:
        if links is not None and any(link.target == target.target for link in links.links):
            indexes = links.gpus_of(target.target)
            uuids = tuple(sorted({lk.uuid for lk in links.links if lk.target == target.target}))
        else:  # no join table: match the engine's process tree with the GPUs' processes
            indexes = tuple(g.index for g in gpus if target.pids & set(g.process_pids))
            uuids = tuple(g.uuid for g in gpus if g.index in indexes)
        out.append(_engine(target, indexes, uuids))
    return tuple(out)


def _engine(t: EngineTargetReading, gpus: tuple[int, ...], uuids: tuple[str, ...]) -> EngineFrame:
    series = t.series
    first: EngineSeries | None = series[0] if series else None
    api = [p.cpu_ratio for p in t.processes if p.role == "api_server" and p.cpu_ratio is not None]
    model = ", ".join(t.models)
    kind = t.kind or (first.engine if first else "")
    short = ", ".join(m.rsplit("/", 1)[-1] for m in t.models) or kind or "engine"
    numa = t.cpu_numa_nodes
    return EngineFrame(
        target=t.target,
        name=f"{short} @ {short_target(t.target)}",
        model=model,
        kind=kind,
        up=t.up,
        gpus=gpus,
        gpu_uuids=uuids,
        pids=t.pids,
        ns_pids=ns_pids(t.pids),
        running=_sum(s.requests_running for s in series),
        waiting=_sum(s.requests_waiting for s in series),
        kv_usage_ratio=_max(s.kv_cache_usage_ratio for s in series),
        preemptions_total=_sum(s.preemptions for s in series),
        preemptions_per_second=_sum(s.preemptions_per_second for s in series),
        generation_tokens_per_second=_sum(s.generation_tokens_per_second for s in series),
        generation_tokens_total=_sum(s.generation_tokens for s in series),
        scraped_at=t.scraped_at,
        prompt_tokens_per_second=_sum(s.prompt_tokens_per_second for s in series),
        request_rate_per_second=_sum(s.request_rate_per_second for s in series),
        rejected_total=_sum(s.rejected_requests for s in series),
        spec_acceptance_ratio=_min(s.spec_decode_acceptance_ratio for s in series),
        ttft_p50_seconds=_max(s.quantile("ttft", 0.5) for s in series),
        ttft_p99_seconds=_max(s.quantile("ttft", 0.99) for s in series),
        itl_p50_seconds=_max(s.quantile("itl", 0.5) for s in series),
        itl_p99_seconds=_max(s.quantile("itl", 0.99) for s in series),
        gpu_memory_utilization=_max(s.gpu_memory_utilization for s in series),
        api_server_cpu_ratio=max(api) if api else None,
        estimated_flops_per_gpu_total=_sum(s.estimated_flops_per_gpu for s in series),
        estimated_read_bytes_per_gpu_total=_sum(s.estimated_read_bytes_per_gpu for s in series),
        cpu_numa_nodes=tuple(numa) if numa is not None else None,
        waiting_deferred=_sum((s.requests_waiting_by_reason or {}).get("deferred") for s in series),
        max_num_seqs=t.max_num_seqs,
        max_num_batched_tokens=t.max_num_batched_tokens,
        kv_cache_max_concurrency=_sum(s.kv_cache_max_concurrency for s in series),
    )


def _present(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def _sum(values: Iterable[float | None]) -> float | None:
    vs = _present(values)
    return sum(vs) if vs else None


def _max(values: Iterable[float | None]) -> float | None:
    vs = _present(values)
    return max(vs) if vs else None


def _min(values: Iterable[float | None]) -> float | None:
    vs = _present(values)
    return min(vs) if vs else None


def _allocators(snapshot: Snapshot) -> dict[int, tuple[AllocFrame, ...]]:
    """Allocator probe readings by GPU index (processes the probe could place on a GPU)."""
    out: dict[int, list[AllocFrame]] = {}
    for probes in snapshot.all(AllocatorProbes):
        namespaces = {(r.pid, r.uuid or ""): r.pid_namespace for r in probes.reports}
        for p in probes.processes:
            if not p.gpu.isdigit():
                continue
            out.setdefault(int(p.gpu), []).append(
                AllocFrame(
                    pid=p.pid,
                    reserved_bytes=_f(p.reserved_bytes),
                    allocated_bytes=_f(p.allocated_bytes),
                    free_bytes=_f(p.free_bytes),
                    largest_free_block_bytes=_f(p.largest_free_block_bytes),
                    fragmentation_ratio=p.fragmentation_ratio,
                    alloc_retries_total=_f(p.alloc_retries),
                    ooms_total=_f(p.ooms),
                    pid_namespace=namespaces.get((p.pid, p.uuid)),
                    uuid=p.uuid,
                )
            )
    return {k: tuple(v) for k, v in out.items()}
