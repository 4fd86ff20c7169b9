"""Hardware: lost GPUs, XIDs, ECC, throttling, busy-but-idle SMs, DRAM bandwidth, PCIe, NUMA."""

from __future__ import annotations

from collections.abc import Iterator

from exporter.diagnosis.fmt import value_text
from exporter.diagnosis.frame import POWER_REASONS, THERMAL_REASONS, Frame
from exporter.diagnosis.history import History, increase, rate
from exporter.diagnosis.model import Candidate, Evidence, Subject
from exporter.diagnosis.rules.base import (
    Th,
    _engine_gpus,
    _live,
    _pct,
    _xid_candidates,
    gpu_subject,
    rule,
)


@rule(
    "hardware/gpu_lost",
    severity="critical",
    scope="gpu",
    hold="gpu_lost_hold_s",
    title="GPU stopped answering",
    condition="NVML calls for the GPU fail (GpuIsLost, timeouts) for gpu_lost_hold_s",
    advice=(
        "Drain the node, collect `nvidia-bug-report.sh`, reset or replace the GPU; engines on it are down."
    ),
)
def gpu_lost(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in frame.gpus:
        if not g.up:
            yield Candidate(
                gpu_subject(g),
                (Evidence("NVML answers", "no"), Evidence("UUID", g.uuid or "unknown")),
                f"GPU {g.index} stopped answering NVML",
            )


@rule(
    "hardware/xid_fatal",
    severity="critical",
    scope="gpu",
    hold=0.0,
    clear=0.0,
    title="Fatal XID error",
    condition="an XID listed in xid_fatal seen in the last xid_window_s",
    advice="Drain the GPU and reset it (`nvidia-smi -r`); a repeat means an RMA.",
)
def xid_fatal(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    return _xid_candidates(frame, history, th, th.xid_fatal, "needs a reset or replacement")


@rule(
    "hardware/ecc_uncorrectable",
    severity="critical",
    scope="gpu",
    hold=0.0,
    clear=0.0,
    title="Uncorrectable ECC errors",
    condition="the volatile uncorrected ECC counter grew in the last ecc_window_s, or a row remap failed",
    advice="Drain the GPU; reset it to remap the rows; replace it when remapping failed.",
)
def ecc_uncorrectable(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    since = frame.taken_at - th.ecc_window_s
    oldest = history.oldest
    for g in _live(frame):
        n = 0.0
        now = g.ecc_uncorrected_total
        if now is not None and oldest is not None:
            # the counter is volatile (since driver load): count only growth seen here
            then = history.last_gpu(
                g.index, lambda x: x.ecc_uncorrected_total, at=max(since, oldest.taken_at)
            )
            n = max(0.0, now - then) if then is not None else 0.0
        if n <= 0 and not g.remap_failed:
            continue
        ev = [Evidence("new uncorrectable ECC errors", n, "count", "> 0")]
        if g.remap_failed:
            ev.append(Evidence("row remapping failed", "yes"))
        yield Candidate(gpu_subject(g), tuple(ev), f"GPU {g.index} hit uncorrectable memory errors")


@rule(
    "hardware/thermal_throttle",
    severity="warning",
    scope="gpu",
    hold="throttle_hold_s",
    title="Clocks throttled by heat",
    condition="a thermal clock-event reason (sw_thermal, hw_thermal, hw_slowdown) active for throttle_hold_s",
    advice="Check fans, airflow and inlet temperature of the chassis; compare with the GPU's neighbours.",
)
def thermal_throttle(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        reasons = [r for r in g.throttle_reasons or () if r in THERMAL_REASONS]
        if not reasons:
            continue
        ev = [Evidence("clock-event reasons", ", ".join(reasons))]
        if g.temperature_celsius is not None:
            ev.append(Evidence("GPU temperature", g.temperature_celsius, "celsius"))
        if g.sm_clock_ratio is not None:
            ev.append(Evidence("SM clock / max", g.sm_clock_ratio, "ratio"))
        yield Candidate(gpu_subject(g), tuple(ev), f"GPU {g.index} clocks held down by {', '.join(reasons)}")


@rule(
    "hardware/power_throttle",
    severity="warning",
    scope="gpu",
    hold="throttle_hold_s",
    title="Clocks held down by the power limit",
    condition=(
        "a power clock-event reason (sw_power_cap, hw_power_brake) active with SM clock < "
        "power_throttle_clock_max_ratio of max, for throttle_hold_s"
    ),
    advice="Check the enforced power limit (`nvidia-smi -q -d POWER`) and the PSU/rack power budget.",
)
def power_throttle(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        reasons = [r for r in g.throttle_reasons or () if r in POWER_REASONS]
        if not reasons or g.sm_clock_ratio is None:
            continue
        if g.sm_clock_ratio >= th.power_throttle_clock_max_ratio:
            continue
        ev = [
            Evidence("clock-event reasons", ", ".join(reasons)),
            Evidence(
                "SM clock / max", g.sm_clock_ratio, "ratio", f"< {_pct(th.power_throttle_clock_max_ratio)}"
            ),
        ]
        if g.power_watts is not None:
            ev.append(Evidence("power", g.power_watts, "watts"))
        if g.power_limit_watts is not None:
            ev.append(Evidence("power limit", g.power_limit_watts, "watts"))
        yield Candidate(
            gpu_subject(g), tuple(ev), f"GPU {g.index} power-capped to {_pct(g.sm_clock_ratio)} of its clock"
        )


@rule(
    "hardware/busy_idle_sms",
    severity="warning",
    scope="gpu",
    hold="busy_idle_hold_s",
    title="GPU busy but SMs idle",
    condition="NVML utilization >= busy_util_min_ratio while GPM SM active < busy_sm_active_max_ratio",
    advice=(
        "Batch more work per kernel: raise max_num_seqs / batch size, enable CUDA graphs, look for "
        "serial small kernels."
    ),
)
def busy_idle_sms(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.util_ratio is None or g.sm_active_ratio is None:
            continue
        if g.util_ratio >= th.busy_util_min_ratio and g.sm_active_ratio < th.busy_sm_active_max_ratio:
            yield Candidate(
                gpu_subject(g),
                (
                    Evidence(
                        "GPU utilization (NVML)", g.util_ratio, "ratio", f">= {_pct(th.busy_util_min_ratio)}"
                    ),
                    Evidence(
                        "SM active (GPM)",
                        g.sm_active_ratio,
                        "ratio",
                        f"< {_pct(th.busy_sm_active_max_ratio)}",
                    ),
                ),
                f"GPU {g.index} reads {_pct(g.util_ratio)} busy, yet only "
                f"{_pct(g.sm_active_ratio)} of its SMs work",
            )


@rule(
    "hardware/dram_bandwidth_bound",
    severity="info",
    scope="gpu",
    hold="dram_bound_hold_s",
    title="Memory-bandwidth bound",
    condition="GPM DRAM bandwidth / peak >= dram_bound_ratio",
    advice=(
        "Decode is bandwidth bound: quantize weights or KV cache (FP8), raise batch size per weight "
        "read, or add tensor-parallel GPUs."
    ),
)
def dram_bandwidth_bound(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.dram_active_ratio is None or g.dram_active_ratio < th.dram_bound_ratio:
            continue
        peak = g.dram_peak_bytes_per_second
        ev = [
            Evidence("DRAM bandwidth / peak", g.dram_active_ratio, "ratio", f">= {_pct(th.dram_bound_ratio)}")
        ]
        if peak:
            ev.append(Evidence("DRAM bandwidth", g.dram_active_ratio * peak, "bytes_per_second"))
            ev.append(Evidence(f"peak ({g.name or 'this model'})", peak, "bytes_per_second"))
        if g.sm_active_ratio is not None:
            ev.append(Evidence("SM active", g.sm_active_ratio, "ratio"))
        yield Candidate(
            gpu_subject(g),
            tuple(ev),
            f"GPU {g.index} moves {_pct(g.dram_active_ratio)} of its peak memory bandwidth",
        )


@rule(
    "hardware/pcie_replays",
    severity="warning",
    scope="gpu",
    hold="pcie_replay_hold_s",
    window="pcie_replay_window_s",
    title="PCIe link replaying packets",
    condition="PCIe replay counter rising faster than pcie_replays_per_minute over pcie_replay_window_s",
    advice="Reseat the GPU or riser, check the link speed/width (`nvidia-smi -q -d PCIE`), update firmware.",
)
def pcie_replays(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for g in _live(frame):
        if g.pcie_replays_total is None:
            continue
        series = history.gpu_points(g.index, lambda x: x.pcie_replays_total, th.pcie_replay_window_s)
        if len(series) < 2 or series[0][1] == series[-1][1]:
            continue  # the usual case: not one replay in the window
        span = series[-1][0] - series[0][0]
        if span < min(60.0, th.pcie_replay_window_s):
            continue
        r = rate(series)
        if r is None or r * 60 <= th.pcie_replays_per_minute:
            continue
        yield Candidate(
            gpu_subject(g),
            (
                Evidence("replays per minute", r * 60, "", f"> {th.pcie_replays_per_minute:g}"),
                Evidence(
                    f"replays in the last {value_text(span, 'seconds')}",
                    increase(series[1:], baseline=series[0][1]),
                ),
            ),
            f"GPU {g.index}'s PCIe link replays {r * 60:.0f} packets a minute",
        )


@rule(
    "hardware/numa_mismatch",
    severity="warning",
    scope="gpu_engine",
    hold="numa_hold_s",
    title="GPU on a different NUMA node from the engine's CPUs",
    condition="the GPU's NUMA node is not among the NUMA nodes of the CPUs the engine may run on",
    advice="Pin the engine to the GPU's NUMA node (numactl / CPU manager static policy / topology manager).",
)
def numa_mismatch(frame: Frame, history: History, th: Th) -> Iterator[Candidate]:
    for e in frame.engines:
        if not e.cpu_numa_nodes:
            continue
        for g in _engine_gpus(frame, e):
            if g.numa_node is None or g.numa_node in e.cpu_numa_nodes:
                continue
            yield Candidate(
                Subject(gpu=str(g.index), target=e.target),
                (
                    Evidence("GPU NUMA node", g.numa_node, "id"),
                    Evidence("engine CPUs on NUMA nodes", ", ".join(str(n) for n in e.cpu_numa_nodes)),
                ),
                f"{e.name} runs on CPUs of NUMA node {e.cpu_numa_nodes[0]}, GPU "
                f"{g.index} hangs off node {g.numa_node}",
            )
