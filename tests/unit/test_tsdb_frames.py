"""The live frame and the frame rebuilt from stored series agree, input by input.

Every shipped scenario is played on a manual clock through the production path; at each
cycle the exporter's own /metrics text is parsed into stored series (what a TSDB keeps of
a scrape) and `exporter.tsdb.frames` rebuilds the frame from them. It must equal
`frame_of(snapshot)` field by field, except what the exporter never exports
(`inputs.LIVE_ONLY`). Every declared input must carry a value in at least one of the
compared frames, so that no declaration goes unchecked.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.allocator_readings import AllocatorProbes, AllocatorProcess
from exporter.config import Settings
from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.frame import AllocFrame, EngineFrame, Frame, GpuFrame, MigFrame, frame_of
from exporter.diagnosis.inputs import FAMILIES, INPUTS, LIVE_ONLY, NO_XIDS
from exporter.engines.readings import (
    EngineGpu,
    EngineGpus,
    Engines,
    EngineSeries,
    EngineTargetReading,
    EngineUp,
    LatencyQuantile,
    ProcessCpu,
)
from exporter.gpu_readings import Clocks, DeviceFacts, Ecc, Mig, MigInstance, Processes, Xid
from exporter.probe.schema import ProbeReport
from exporter.sim import node as sim_node
from exporter.sim.scenario import builtin_names, load_builtin
from exporter.snapshot import ExporterInfo, GpuState, Snapshot
from exporter.tsdb.frames import TIMELINE, NodeSeries, frames
from exporter.web.exposition import DEFAULT, EVERYTHING, Exposure, render

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

STEP_S = 60.0  # scenario seconds between cycles: every phase is seen
OF_SCOPE: dict[str, type] = {
    "gpu": GpuFrame,
    "mig": MigFrame,
    "allocator": AllocFrame,
    "engine": EngineFrame,
    "node": Frame,
}


def store(node: NodeSeries, at: float, text: bytes) -> None:
    """What a TSDB keeps of one scrape: each sample of a declared family under its name and
    labels, at `at`."""
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name in FAMILIES or s.name == TIMELINE:
                node.add(s.name, dict(s.labels), [(at, float(s.value))])


def blank(frame: Frame) -> Frame:
    """The frame without what the exporter never exports."""

    def cleared(obj: Any, scope: str) -> Any:
        cls = type(obj)
        fields = {
            lo.field: cls.__dataclass_fields__[lo.field].default for lo in LIVE_ONLY if lo.scope == scope
        }
        return dataclasses.replace(obj, **fields)

    gpus = tuple(
        dataclasses.replace(g, allocators=tuple(cleared(a, "allocator") for a in g.allocators))
        for g in frame.gpus
    )
    return Frame(frame.taken_at, gpus, tuple(cleared(e, "engine") for e in frame.engines), frame.simulated)


@dataclasses.dataclass
class Played:
    live: list[Frame]
    rebuilt: list[Frame]


def play(name: str, step_s: float = STEP_S, profile: str = "shared") -> Played:
    """Live frames and the frames rebuilt from a store of the scrapes, at the `shared`
    profile by default: the default one and each process' SM share, which the noisy-
    neighbour rule reads (a store of the default profile has no process_sm: see below)."""
    scenario = load_builtin(name)
    clock = sim_node.ManualClock()
    exporter = sim_node.build(Settings(simulate=name, metric_profile=profile), clock)  # type: ignore[arg-type]
    node, live = NodeSeries(), []
    try:
        t = 0.0
        while t <= scenario.duration:
            clock.t = t
            snap = exporter.step()  # the simulated allocator probes write their files too
            assert exporter.runner.published is not None
            store(node, snap.taken_at, exporter.runner.published.text)
            live.append(frame_of(snap))
            t += step_s
    finally:
        exporter.close()
    return Played(live, frames(node))


L4, H100 = "GPU-4c5f0000-0000-0000-0000-000000000001", "GPU-4c5f0000-0000-0000-0000-000000000002"
UP, DOWN = "http://10.0.0.5:8000/metrics", "http://10.0.0.6:8000/metrics"


def odd_node() -> Snapshot:
    """A node with what no shipped scenario plays: a GPU without NVLink, a failed row remap,
    XIDs, the power brake, MIG instances out of order, a probe on no GPU, an engine with two
    models and both of its limits declared, one that never answered."""
    facts = DeviceFacts(uuid=L4, labels={"name": "NVIDIA L4", "numa_node": "1"}, memory_total_bytes=24 << 30)
    l4 = GpuState(
        0,
        L4,
        True,
        readings={
            DeviceFacts: facts,
            Ecc: Ecc(uncorrected=3, remap_failed=1),
            Xid: Xid(counts={79: 0, 48: 2}),
            Clocks: Clocks(
                sm_hertz=1.0e9, event_active={"hw_slowdown": 1, "hw_power_brake": 1, "sw_thermal": 0}
            ),
        },
        supported={"nvlink": False},
    )
    mig = Mig(
        enabled=1,
        instances=(
            MigInstance(
                mig_uuid="MIG-b",
                gpu_instance=2,
                compute_instance=0,
                memory_used_bytes=5,
                memory_total_bytes=9,
            ),
            MigInstance(mig_uuid="MIG-a", gpu_instance=1, compute_instance=0, memory_total_bytes=9),
        ),
    )
    h100 = GpuState(
        1,
        H100,
        False,
        readings={
            DeviceFacts: DeviceFacts(uuid=H100, labels={"name": "NVIDIA H100 80GB HBM3", "numa_node": "-1"}),
            Mig: mig,
            Processes: Processes(count=0),
        },
    )
    series = tuple(
        EngineSeries(
            engine="vllm",
            model=model,
            requests_running=running,
            requests_waiting_by_reason={"deferred": 2.0, "capacity": 1.0},
            spec_decode_acceptance_ratio=ratio,
            cache_config={"gpu_memory_utilization": share, "kv_cache_max_concurrency": "4.5"},
            latency_quantiles=(
                LatencyQuantile(window="1m", quantile="0.5", ttft_seconds=0.1 * running, itl_seconds=0.02),
                LatencyQuantile(window="5m", quantile="0.5", ttft_seconds=9.0, itl_seconds=9.0),
                LatencyQuantile(window="1m", quantile="0.99", ttft_seconds=0.4 * running),
            ),
        )
        for model, running, ratio, share in (("org/a", 3.0, 0.7, "0.5"), ("org/b", 5.0, 0.6, "0.4"))
    )
    engines = Engines(
        targets=(
            EngineTargetReading(
                target=UP,
                status=(EngineUp(engine="vllm", model="org/a", up=1),),
                processes=(
                    ProcessCpu(role="api_server", cpu_ratio=0.9),
                    ProcessCpu(role="worker", cpu_ratio=2.0),
                ),
                series=series,
                max_num_seqs=128,
                max_num_batched_tokens=8192,
                kind="vllm",
                pids=frozenset({os.getpid()}),  # a real process: its pid namespace is read
                scraped_at=99.0,
            ),
            EngineTargetReading(target=DOWN, status=(EngineUp(engine="unknown", up=0),)),
        )
    )
    links = EngineGpus(
        links=(EngineGpu(engine="vllm", target=UP, model="org/a", uuid=L4, gpu="0", present=1),)
    )
    probes = AllocatorProbes(
        processes=(
            AllocatorProcess(gpu="0", uuid=L4, pid=7, reserved_bytes=10, fragmentation_ratio=0.25, ooms=1),
            AllocatorProcess(gpu="", uuid="", pid=8, reserved_bytes=10),  # the probe could not place it
        ),
        reports=(
            ProbeReport(
                timestamp=1.0,
                pid=7,
                state="sampling",
                cuda_available=True,
                interval_seconds=5,
                uuid=L4,
                pid_namespace="pid:[4026532000]",
            ),
        ),
    )
    node = {
        Engines: (engines,),
        EngineGpus: (links,),
        AllocatorProbes: (probes,),
        ExporterInfo: (ExporterInfo(simulated=0),),
    }
    return Snapshot(100.0, (l4, h100), node)


def through_a_store(snapshot: Snapshot, exposure: Exposure) -> Played:
    node = NodeSeries()
    store(node, snapshot.taken_at, render(snapshot, exposure).text)
    return Played([frame_of(snapshot)], frames(node))


@pytest.fixture(scope="module")
def scenarios() -> dict[str, Played]:
    played = {name: play(name) for name in builtin_names()}
    played["odd node, full profile"] = through_a_store(odd_node(), EVERYTHING)
    played["odd node, default profile"] = through_a_store(odd_node(), DEFAULT)
    return played


def test_the_odd_node_reads_as_meant(scenarios: dict[str, Played]) -> None:
    for name in ("odd node, full profile", "odd node, default profile"):
        (frame,) = scenarios[name].rebuilt
        l4, h100 = frame.gpus
        assert (l4.name, l4.numa_node, l4.nvlink_links_up, l4.remap_failed) == ("NVIDIA L4", 1, 0, True)
        assert l4.throttle_reasons == ("hw_power_brake",) and dict(l4.xid_counts or {}) == {48: 2}
        assert l4.allocators == (
            AllocFrame(pid=7, uuid=L4, reserved_bytes=10.0, fragmentation_ratio=0.25, ooms_total=1.0),
        )
        assert (h100.up, h100.numa_node, h100.nvlink_links_up, h100.process_count) == (False, -1, None, 0)
        assert [m.uuid for m in h100.mig] == ["MIG-a", "MIG-b"] and h100.mig_enabled
        up, down = frame.engines
        assert (up.model, up.running, up.waiting_deferred, up.spec_acceptance_ratio) == (
            "org/a, org/b",
            8.0,
            4.0,
            0.6,
        )
        assert (up.ttft_p50_seconds, up.ttft_p99_seconds, up.itl_p99_seconds) == (0.5, 2.0, None)
        assert (up.gpu_memory_utilization, up.kv_cache_max_concurrency, up.api_server_cpu_ratio) == (
            0.5,
            9.0,
            0.9,
        )
        assert (up.max_num_seqs, up.max_num_batched_tokens, up.gpus, up.gpu_uuids) == (128, 8192, (0,), (L4,))
        assert (down.up, down.kind, down.name) == (False, "", "engine @ 10.0.0.6:8000")


@pytest.mark.parametrize("name", builtin_names())
def test_rebuilt_frames_equal_live_frames(scenarios: dict[str, Played], name: str) -> None:
    played = scenarios[name]
    assert [f.taken_at for f in played.rebuilt] == [f.taken_at for f in played.live]
    for want, got in zip(map(blank, played.live), map(blank, played.rebuilt), strict=True):
        assert len(want.gpus) == len(got.gpus), f"{name} at {want.taken_at}"
        for a, b in zip(want.gpus, got.gpus, strict=True):
            for f in dataclasses.fields(GpuFrame):
                assert getattr(a, f.name) == getattr(b, f.name), (
                    f"{name} at {want.taken_at}: GPU {a.index} {f.name}"
                )
        assert want.engines == got.engines, f"{name} at {want.taken_at}: engines differ"
        assert want.simulated == got.simulated


def values(frames_: list[Frame], scope: str, field: str) -> Iterator[Any]:
    for f in frames_:
        if scope == "node":
            yield getattr(f, field)
        for g in f.gpus:
            if scope == "gpu":
                yield getattr(g, field)
            subjects = g.mig if scope == "mig" else g.allocators if scope == "allocator" else ()
            yield from (getattr(s, field) for s in subjects)
        if scope == "engine":
            yield from (getattr(e, field) for e in f.engines)


def informative(value: Any) -> bool:
    """A value the inputs' sources gave: not None, not empty, not the default False."""
    return value is not None and value is not False and value not in ((), "", frozenset(), NO_XIDS)


def test_every_declared_input_is_compared(scenarios: dict[str, Played]) -> None:
    """Each input has a value in some compared frame: the comparison above checks them all."""
    rebuilt = [f for p in scenarios.values() for f in p.rebuilt]
    live = [f for p in scenarios.values() for f in p.live]
    empty = [
        f"{i.scope}.{i.field}" for i in INPUTS if not any(map(informative, values(rebuilt, i.scope, i.field)))
    ]
    assert empty == []
    # and the ones that never come from a store do come live
    missing = [lo.field for lo in LIVE_ONLY if not any(map(informative, values(live, lo.scope, lo.field)))]
    assert missing == []


def test_every_frame_field_is_declared() -> None:
    """A frame field is an input, a live-only input, a subject's identity, or the diagnosis' own."""
    identity = {
        "gpu": {"index", "uuid", "mig", "allocators"},
        "mig": {"uuid"},
        "allocator": {"pid", "uuid"},
        "engine": {"target", "name", "model", "kind"},
        "node": {"taken_at", "gpus", "engines"},
    }
    diagnosis = {"down_since", "last_downtime_seconds", "recovered_at"}  # diagnosis/recovery.py
    for scope, cls in OF_SCOPE.items():
        declared = {i.field for i in INPUTS if i.scope == scope} | {
            lo.field for lo in LIVE_ONLY if lo.scope == scope
        }
        fields = {f.name for f in dataclasses.fields(cls)} - identity[scope] - diagnosis
        assert fields == declared, scope


def test_a_default_profile_store_has_no_process_sm_share() -> None:
    played = play("shared-time-slicing", step_s=60.0, profile="default")
    assert any(g.process_sm for f in played.live for g in f.gpus)
    assert all(g.process_sm is None for f in played.rebuilt for g in f.gpus)  # absent, not 0
    assert all(g.process_owner for f in played.rebuilt for g in f.gpus)  # owners ride on memory


def test_live_only_inputs_stay_empty_from_a_store(scenarios: dict[str, Played]) -> None:
    played = scenarios["fragmented-allocator"]
    assert any(e.pids for f in played.live for e in f.engines)
    for f in played.rebuilt:
        for e in f.engines:
            assert e.pids == frozenset() and e.ns_pids == frozenset() and e.cpu_numa_nodes is None
            assert e.scraped_at == (f.taken_at if e.up else None)  # the sample's time stands in
        assert all(a.pid_namespace is None for g in f.gpus for a in g.allocators)


# ---- the power brake ------------------------------------------------------------------------

BRAKE = """
    gpus: {count: 1, model: H100-80GB-SXM, driver: R470}
    phases: [{name: p, duration: 400, gpu: {util: 0.9, sm_clock_ratio: 0.4, power_ratio: 0.95,
              throttle_hw_slowdown: 1, throttle_power_brake: 1}}]
"""


def test_a_power_brake_is_not_heat_from_a_store(sim) -> None:  # type: ignore[no-untyped-def]
    """NVML raises HW slowdown with the power brake: the rebuilt frame, like the live one,
    leaves the slowdown to the brake, so a store's diagnosis is power throttling only."""
    s = sim(BRAKE)
    node = NodeSeries()
    for t in range(0, 301, 10):
        snap = s.at(float(t))
        store(node, snap.taken_at, s.runner.published.text)
    live = frame_of(snap).gpus[0].throttle_reasons
    rebuilt = frames(node)
    assert live is not None and "hw_power_brake" in live and "hw_slowdown" not in live
    assert rebuilt[-1].gpus[0].throttle_reasons == live
    diagnoser = Diagnoser()
    for frame in rebuilt:
        _, _, diagnosis = diagnoser.step(frame)
    found = {f.id for f in diagnosis.findings}
    assert "hardware/power_throttle" in found and "hardware/thermal_throttle" not in found


# ---- what the live frame keeps between cycles ---------------------------------------------


def test_what_the_live_frame_reuses_is_never_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles as `serve` runs them (each collector on its own interval, so slower ones leave
    their readings to the next cycles): each frame equals one made with nothing kept."""
    from exporter.diagnosis import frame as live

    clock = sim_node.ManualClock()
    exporter = sim_node.build(Settings(simulate="fragmented-allocator", interval=1.0), clock)
    runner, checked = exporter.runner, 0
    try:
        for t in range(0, 140, 7):  # the scenario's phases change at 120 s
            for second in range(t, t + 7):
                clock.t = float(second)
                if exporter.environment.before_step is not None:
                    exporter.environment.before_step()
                for slot in runner._slots:
                    if second % max(1, round(slot.collector.interval_s)) == 0:
                        slot.collector.refresh()
                        runner.run_collector(slot)
                snap = runner.publish().snapshot
                kept = frame_of(snap)
                with monkeypatch.context() as m:
                    m.setattr(live, "_REUSE", live._Reuse())
                    assert kept == frame_of(snap), f"at {second} s"
                checked += 1
    finally:
        exporter.close()
    assert checked == 140 and kept.gpus[0].allocators and kept.engines
