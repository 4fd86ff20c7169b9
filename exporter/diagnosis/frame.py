"""The numbers the rules read: one `Frame` per cycle, live or rebuilt from stored series.

A `Frame` is a flat, typed view of one moment of a node: per GPU, per engine, per
allocator probe. The rules and the history work on frames only, so they never depend on
how a reading class nests its fields, and a history of frames is small (a few hundred
bytes per GPU per sample) where a history of snapshots would keep every reading alive.
Where each field comes from is declared once, in `exporter/diagnosis/inputs.py`, which
makes the frame both from a snapshot (`frame_of`) and from a TSDB's rows (`frame_at`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, TypeVar

from exporter.allocator_readings import AllocatorProbes, AllocatorProcess
from exporter.diagnosis.inputs import (
    ALLOCATOR,
    ENGINE,
    ENGINE_UP,
    FAMILIES,
    FIELD_FORM,
    FIELDS,
    GPU,
    GPU_CLASSES,
    GPU_UP,
    INFO,
    KEYS,
    LIVE_ONLY,
    MIG,
    NODE,
    NODE_CLASSES,
    SCALAR,
    SERIES_FAMILIES,
    Input,
    Row,
    Rows,
    Scope,
    Source,
    label,
)
from exporter.engines.readings import Engines, EngineTargetReading
from exporter.gpu_readings import Mig, MigInstance
from exporter.gpu_specs import spec_of
from exporter.metricdef import Labels, MetricDef, kept, samples
from exporter.snapshot import ExporterInfo, GpuUp, Snapshot

T = TypeVar("T")
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
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None


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
    nvlink_links_up: int | None = None  # active links; None: the GPU has no NVLink (or cannot say)
    nvlink_links_sleeping: int | None = None  # asleep: not down, and ready for traffic
    nvlink_tx_bytes_per_second: float | None = None  # GPM, when the GPU has it
    nvlink_rx_bytes_per_second: float | None = None
    nvlink_tx_bytes_total: float | None = None  # link counters, for GPUs without GPM
    nvlink_rx_bytes_total: float | None = None
    ecc_uncorrected_total: float | None = None
    remap_failed: bool = False
    xid_counts: Mapping[int, int] | None = None  # XIDs seen, zero counts left out; None: no XID data
    process_pids: tuple[int, ...] = ()
    process_count: int | None = None
    # Each process' memory, SM share over the last window (the shared profile; None: not
    # known) and owner ("namespace/pod", else its name), by pid.
    process_memory: Mapping[int, float] = field(default_factory=dict)
    process_sm: Mapping[int, float] | None = None
    process_owner: Mapping[int, str] = field(default_factory=dict)
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
    # prefill/decode disaggregation: SGLang's PD queues by name (prefill_bootstrap, ...;
    # None: not a disaggregated SGLang), the KV transfer of one request, failed transfers
    disagg_queues: Mapping[str, float] | None = None
    kv_transfer_latency_seconds: float | None = None
    kv_transfer_failures_total: float | None = None
    # written by the Diagnoser from its up/down record (diagnosis/recovery.py)
    down_since: float | None = None  # down since this sample, after it was up
    last_downtime_seconds: float | None = None  # the last down episode that ended
    recovered_at: float | None = None  # when it ended

    @property
    def disagg_role(self) -> str | None:
        """prefill or decode, from the PD queues its engine reports (SGLang); else None."""
        names = self.disagg_queues or {}
        return next((side for side in ("prefill", "decode") if any(n.startswith(side) for n in names)), None)


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


# ---- rows, grouped by subject -----------------------------------------------------------

Subject = dict[str, list[Row]]
ON_A_GPU: tuple[Scope, ...] = ("mig", "allocator")  # subjects that belong to the GPU of their key
Placed = tuple[Scope, str, tuple[str, ...], str, Row]  # scope, GPU, key, family, row


def place(family: str, labels: Labels, value: float) -> Placed | None:
    """Where a sample goes: its scope, the GPU of a per-GPU scope, its subject's key; None
    for a family no input reads, a series the matchers leave out or one on no subject."""
    found = FAMILIES.get(family)
    if found is None:
        return None
    scope, match = found
    if match and not all(label(labels, k) == v for k, v in match):
        return None
    key: list[str] = []
    for name in KEYS[scope]:
        v = label(labels, name)
        if v is None:
            return None  # not on a subject it names
        key.append(v)
    if scope != "engine" and key and not key[0].isdigit():
        return None  # not on a GPU
    if scope in ON_A_GPU:
        return scope, key[0], tuple(key[1:]), family, (labels, value)
    return scope, "", tuple(key), family, (labels, value)


def placed(metric: MetricDef, labels: Labels, value: Any) -> Placed | None:
    """`place` for a sample as `metricdef.samples` gives it, written as the exposition writes it."""
    if metric.kind == "info":
        return place(metric.name, labels + tuple((k, str(v)) for k, v in value.items()), 1.0)
    return place(metric.name, labels, float(value))


class Grouped:
    """The declared families' samples, by scope and subject key; MIG instances and
    allocator probes by GPU first."""

    def __init__(self) -> None:
        self.by: dict[Scope, dict[tuple[str, ...], Subject]] = {s: {} for s in KEYS}
        self.on_gpu: dict[Scope, dict[str, dict[tuple[str, ...], Subject]]] = {s: {} for s in ON_A_GPU}

    def put(self, where: Placed) -> None:
        scope, gpu, key, family, row = where
        table = self.on_gpu[scope].setdefault(gpu, {}) if gpu else self.by[scope]
        subject = table.setdefault(key, {})
        rows = subject.get(family)
        if rows is None:
            subject[family] = [row]
        else:
            rows.append(row)

    def add(self, family: str, labels: Labels, value: float) -> None:
        where = place(family, labels, value)
        if where is not None:
            self.put(where)

    def under(self, scope: Scope, gpu: str) -> list[tuple[tuple[str, ...], Subject]]:
        """The subjects of a per-GPU scope on one GPU, by the rest of their key."""
        return sorted(self.on_gpu[scope].get(gpu, {}).items())


def _read(inputs: Iterable[Input], subject: Rows) -> dict[str, Any]:
    """Each input's field from stored rows: its sources reduced, then normalised."""
    return {
        inp.field: inp.of([s.reduce.rows(subject.get(s.family, ()), s) for s in inp.sources])
        for inp in inputs
    }


def _index(text: str | None) -> int:
    return int(text) if text and text.isdigit() else -1


def _live_only(fields: dict[str, Any], scope: Scope, reading: object, taken_at: float | None) -> None:
    """Live (`reading` given): what the subject's reading says. Stored: the stand-in, if any."""
    for lo in LIVE_ONLY:
        if lo.scope != scope:
            continue
        if reading is not None:
            fields[lo.field] = lo.live(reading)
        elif taken_at is not None and lo.stored is not None:
            fields[lo.field] = lo.stored(fields, taken_at)


def _engine(target: str, fields: dict[str, Any], subject: Rows) -> EngineFrame:
    """An engine frame, named for a person: its series' models (or its kind) and where it listens."""
    models = sorted(
        {
            m
            for f, rows in subject.items()
            if f in SERIES_FAMILIES
            for lb, _ in rows
            if (m := label(lb, "model"))
        }
    )
    kinds = [label(lb, "engine") for lb, _ in subject.get(ENGINE_UP, ())]
    kind = next((k for k in kinds if k and k != "unknown"), "")
    short = ", ".join(m.rsplit("/", 1)[-1] for m in models) or kind or "engine"
    return EngineFrame(
        target=target, name=f"{short} @ {short_target(target)}", model=", ".join(models), kind=kind, **fields
    )


# ---- the frame from stored rows ------------------------------------------------------------


def frame_at(stored: Mapping[str, Iterable[Row]], taken_at: float) -> Frame:
    """The frame of one scrape time from the rows a store returned for it, by family."""
    rows = Grouped()
    for family, items in stored.items():
        for labels, value in items:
            rows.add(family, labels, value)
    gpus = []
    for (index,), subject in sorted(rows.by["gpu"].items(), key=lambda kv: int(kv[0][0])):
        ups = subject.get(GPU_UP)
        if not ups:
            continue
        migs = []
        for (uuid,), inst in rows.under("mig", index):
            lb = next(iter(inst.values()))[0][0]
            order = (_index(label(lb, "gpu_instance")), _index(label(lb, "compute_instance")), uuid)
            migs.append((order, MigFrame(uuid=uuid, **_read(MIG, inst))))
        allocators = [
            AllocFrame(pid=int(pid), uuid=uuid, **_read(ALLOCATOR, probe))
            for (uuid, pid), probe in rows.under("allocator", index)
            if pid.isdigit()
        ]
        gpus.append(
            GpuFrame(
                index=int(index),
                uuid=label(ups[0][0], "uuid") or "",
                mig=tuple(m for _, m in sorted(migs, key=lambda x: x[0])),
                allocators=tuple(sorted(allocators, key=lambda a: (a.pid, a.uuid))),
                **_read(GPU, subject),
            )
        )
    engines = []
    for (target,), subject in sorted(rows.by["engine"].items()):
        if ENGINE_UP in subject:
            fields = _read(ENGINE, subject)
            _live_only(fields, "engine", None, taken_at)
            engines.append(_engine(target, fields, subject))
    node = _read(NODE, rows.by["node"].get((), {}))
    return Frame(taken_at, tuple(gpus), tuple(engines), **node)


# ---- the live frame --------------------------------------------------------------------------

# The live frame reads a family off its subject's field where it can (FIELD_FORM: what the
# exposition makes its samples of), and walks the readings for the rest.
_WALKED = kept(lambda m: m.name in FAMILIES and m.name not in FIELD_FORM)
_WALKED_GPU = tuple(c for c in GPU_CLASSES if _WALKED(c))
_WALKED_NODE = tuple(c for c in NODE_CLASSES if _WALKED(c))
Getter = tuple[str, type | None, str, Callable[[Any, Source], Any], Source]


def _getter(src: Source, own: type) -> Getter:
    """How the live frame reads a source: (how, class, field or family, reduction, source).
    `how` is "scalar" (a field's value as a float), "as is" (an info field's mapping),
    "field" (the reduction's field form) or "rows" (its rows form, on the walked rows);
    the class is None for the subject's own reading."""
    if src.family not in FIELD_FORM or src.reduce.field is None:
        return "rows", None, src.family, src.reduce.rows, src
    owner, attr = FIELDS[src.family]
    how = "scalar" if src.reduce in SCALAR else "as is" if src.reduce is INFO else "field"
    return how, None if owner is own else owner, attr, src.reduce.field, src


@dataclass(frozen=True)
class _Live:
    """A scope's inputs, ready for the live frame, which is made every cycle (so its loops
    are tight): `plain` are fields' values as floats, by reading class (None: the
    subject's own reading); `shaped` the others, with their getters and normaliser."""

    plain: tuple[tuple[type | None, tuple[tuple[str, str], ...]], ...]
    shaped: tuple[tuple[str, Callable[..., Any] | None, tuple[Getter, ...]], ...]

    @classmethod
    def of(cls, inputs: Iterable[Input], own: type) -> _Live:
        plain: dict[type | None, list[tuple[str, str]]] = {}
        shaped = []
        for inp in inputs:
            getters = tuple(_getter(s, own) for s in inp.sources)
            how, owner, attr, _, _ = getters[0]
            if len(getters) == 1 and how == "scalar" and inp.normalise is None:
                plain.setdefault(owner, []).append((inp.field, attr))
            else:
                shaped.append((inp.field, inp.normalise, getters))
        return cls(tuple((k, tuple(v)) for k, v in plain.items()), tuple(shaped))

    def read(self, own: object, readings: Mapping[type, object], walked: Rows) -> dict[str, Any]:
        """The fields of one subject: `own` is its reading, `readings` the others it has by
        class, `walked` its walked rows. A field left out keeps its default, None."""
        fields: dict[str, Any] = {}
        for owner, attrs in self.plain:
            reading = own if owner is None else readings.get(owner)
            if reading is not None:
                for field, attr in attrs:
                    value = getattr(reading, attr)
                    if value is not None:
                        fields[field] = float(value)
        for field, normalise, getters in self.shaped:
            values = []
            for how, owner, attr, reduce, src in getters:
                if how == "rows":
                    values.append(reduce(walked.get(attr, ()), src))
                    continue
                reading = own if owner is None else readings.get(owner)
                value = None if reading is None else getattr(reading, attr)
                if how == "scalar":
                    values.append(None if value is None else float(value))
                elif how == "as is":
                    values.append(value)
                else:
                    values.append(reduce(value, src))
            fields[field] = values[0] if normalise is None else normalise(*values)
        return fields


_GPU = _Live.of(GPU, GpuUp)  # a GPU's own reading is its GpuState: its up and supported
_MIG, _ALLOCATOR = _Live.of(MIG, MigInstance), _Live.of(ALLOCATOR, AllocatorProcess)
_ENGINE, _NODE = _Live.of(ENGINE, EngineTargetReading), _Live.of(NODE, ExporterInfo)
_NONE: Mapping[type, object] = {}


class _Reuse:
    """What the live frame made of a reading last cycle, by key. A reading that a slower
    collector has not renewed (processes and MIG every 5 s, engines every engine interval,
    allocator probes) is the same object, or an equal one (the engine-GPU join, made anew
    each cycle), and what is made of it is the same."""

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[object, Any]] = {}
        self._now: dict[Hashable, tuple[object, Any]] = {}

    def get(self, key: Hashable, reading: object, make: Callable[[], T]) -> T:
        hit = self._last.get(key)
        if hit is None or not (hit[0] is reading or hit[0] == reading):
            hit = (reading, make())
        self._now[key] = hit
        made: T = hit[1]
        return made

    def cycle(self) -> None:
        """What this cycle did not use is let go."""
        self._last, self._now = self._now, {}


_REUSE = _Reuse()


def _walk(reading: object, base: Labels) -> list[Placed]:
    """A reading's samples of the walked families, labelled as the exposition labels them."""
    found = [placed(*s) for s in samples(reading, base, _WALKED)]
    return [p for p in found if p is not None]


def _allocators(probes: tuple[AllocatorProbes, ...]) -> dict[str, tuple[AllocFrame, ...]]:
    """Each probed process' allocator, by the GPU it runs on."""
    reports = {(r.uuid or "", r.pid): r for p in probes for r in p.reports}
    out: dict[str, list[AllocFrame]] = {}
    for proc in sorted((q for p in probes for q in p.processes), key=lambda q: (q.pid, q.uuid)):
        fields = _ALLOCATOR.read(proc, _NONE, {})
        _live_only(fields, "allocator", reports.get((proc.uuid, proc.pid)), None)
        out.setdefault(proc.gpu, []).append(AllocFrame(pid=proc.pid, uuid=proc.uuid, **fields))
    return {gpu: tuple(frames) for gpu, frames in out.items()}


def _migs(mig: Mig | None) -> tuple[MigFrame, ...]:
    instances = (
        sorted(mig.instances, key=lambda i: (i.gpu_instance, i.compute_instance, i.mig_uuid)) if mig else ()
    )
    return tuple(MigFrame(uuid=i.mig_uuid, **_MIG.read(i, _NONE, {})) for i in instances)


def _live_engine(target: str, reading: EngineTargetReading, subject: Rows) -> EngineFrame:
    fields = _ENGINE.read(reading, _NONE, subject)
    _live_only(fields, "engine", reading, None)
    return _engine(target, fields, subject)


def frame_of(snapshot: Snapshot) -> Frame:
    """The live frame: every declared input, from the snapshot's readings."""
    reuse, rows = _REUSE, Grouped()
    for cls in _WALKED_NODE:
        for i, reading in enumerate(snapshot.node.get(cls, ())):
            for where in reuse.get((cls, i), reading, partial(_walk, reading, ())):
                rows.put(where)
    for state in snapshot.gpus:
        base = state.base_labels
        for cls in _WALKED_GPU:
            if (found := state.readings.get(cls)) is not None:
                for where in reuse.get((cls, base), found, partial(_walk, found, base)):
                    rows.put(where)
    probes = snapshot.all(AllocatorProbes)
    allocators = reuse.get(AllocatorProbes, probes, partial(_allocators, probes))
    gpus = []
    for state in snapshot.gpus:
        index = str(state.index)
        mig = state.get(Mig)
        gpus.append(
            GpuFrame(
                index=state.index,
                uuid=state.uuid,
                mig=reuse.get((Mig, index), mig, partial(_migs, mig)),
                allocators=allocators.get(index, ()),
                **_GPU.read(state, state.readings, rows.by["gpu"].get((index,), {})),
            )
        )
    engines = []
    targets = {t.target: t for e in snapshot.all(Engines) for t in e.targets}
    for (target,), subject in sorted(rows.by["engine"].items()):
        reading = targets.get(target)
        if ENGINE_UP in subject and reading is not None:
            # made again when the engine is scraped again or its GPUs change
            key = (reading, subject.get("llmgpu_engine_gpu_info"))
            engines.append(reuse.get((Engines, target), key, partial(_live_engine, target, reading, subject)))
    reuse.cycle()
    info = snapshot.get(ExporterInfo)
    node = _NODE.read(info, _NONE, {}) if info is not None else {}
    return Frame(snapshot.taken_at, tuple(gpus), tuple(engines), **node)
