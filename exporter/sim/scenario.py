"""Scenario files: one timeline that drives the fake GPUs and the fake engines.

A scenario is a list of phases. Each phase sets target values (base units, ratios
0-1); a key not set keeps its previous value, and `ramp` seconds at the start of the
phase move linearly from the previous value to the new one (0 = a step). After the
last phase the values hold. Faults fire at scenario times. The schema is documented
in docs/scenarios.md.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml

from exporter.nvml import FI_MEMORY_TEMP
from exporter.sim.dcgm_spec import DcgmExporterSpec, parse_spec
from exporter.sim.drivers import NO_QUIRKS, PARTS, DriverProfile
from exporter.sim.engine_keys import ENGINE_KEYS, KINDS, NOT_ON_PAGE, ROLES
from exporter.sim.gpu_models import MODELS, POWER_LIMIT_MIN_RATIO, GpuModel
from exporter.sim.recorded_gpus import identities, inline_model, recorded_driver
from exporter.sim.scenario_input import (
    PROFILING_KEYS,
    SECONDS_MAX,
    bad_number,
    number,
    read_document,
    value_range,
)
from exporter.sim.sharing import SharingSpec
from exporter.sim.sharing import parse as parse_sharing


class ScenarioError(ValueError):
    """A scenario file that does not follow the schema; the message names the key."""


# Per-GPU quantities a phase may set (rates are per second, ratios 0-1).
GPU_KEYS: dict[str, float] = {
    "util": 0.0,  # NVML utilization.gpu: a kernel was running
    "mem_busy": 0.0,
    "sm_active": 0.0,
    "sm_occupancy": 0.0,
    "tensor_active": 0.0,
    "dram_active": 0.0,
    "fp16_active": 0.0,
    "fp32_active": 0.0,
    "fp64_active": 0.0,
    "gpm_nan": 0.0,  # 1: GPM answers NaN for SM activity and occupancy (DCGM takes NaN as blank)
    "memory_used_ratio": 0.01,  # of total framebuffer
    "power_ratio": 0.12,  # of the enforced limit
    "power_limit_watts": 0.0,  # the enforced limit; starts at the model's (Timeline)
    "temp_c": 35.0,
    "mem_temp_c": 40.0,
    "sm_clock_ratio": 0.5,  # of max
    "mem_clock_ratio": 1.0,
    "throttle_power_cap": 0.0,  # 1 while the reason is active
    "throttle_sw_thermal": 0.0,
    "throttle_hw_thermal": 0.0,
    "throttle_hw_slowdown": 0.0,
    "throttle_power_brake": 0.0,
    "pcie_tx_bps": 1e6,
    "pcie_rx_bps": 1e6,
    "pcie_replay_rate": 0.0,
    "pcie_counter_wrap": 0.0,  # bytes at which the PCIe byte counters wrap to 0 (0: never)
    "nvlink_tx_bps": 0.0,  # whole GPU, spread evenly over its links
    "nvlink_rx_bps": 0.0,
    "nvlink_error_rate": 0.0,
    "nvlink_links_sleeping": 0.0,  # links in SLEEP (NVML_NVLINK_STATE_SLEEP): the highest-numbered
    "nvlink_links_inactive": 0.0,  # links down (INACTIVE): the ones below the sleeping ones
    "ecc_corrected_rate": 0.0,
    "ecc_uncorrected_rate": 0.0,
    # Levels, not rates: what the GPU had counted before the scenario began, the current
    # PCIe link (0: trained to the part's maximum; an idle link trains down), row remapping.
    "ecc_corrected_base": 0.0,
    "ecc_uncorrected_base": 0.0,
    "pcie_link_gen": 0.0,
    "pcie_link_width": 0.0,
    "remapped_rows_correctable": 0.0,
    "remapped_rows_uncorrectable": 0.0,
    "remap_pending": 0.0,  # 1: a remapping waits for the next reset
    "remap_failed": 0.0,
}

FAULT_KINDS = ("error", "hang", "lost", "xid", "engine_down", "reload")

NVLINK_KEYS = tuple(k for k in GPU_KEYS if k.startswith("nvlink_"))
ECC_KEYS = ("ecc_corrected_rate", "ecc_uncorrected_rate")
PROFILING_SOURCE_KEY = "dcgm_exporter"  # a top-level key: DCGM's profiling fields stand in for GPM


def unprovided_keys(model: GpuModel, prof: DriverProfile, profiling_source: bool = False) -> dict[str, str]:
    """GPU keys this model on this driver cannot report, each with the reason."""
    out: dict[str, str] = {}
    if not profiling_source:
        if not model.gpm:
            why = "it has no GPM (profiling metrics: Hopper and later)"
        elif "nvmlGpmSampleGet" in prof.driver.missing:
            why = f"driver {prof.driver.branch} has no GPM (R525 and later)"
        else:
            why = ""
        if why:
            out.update(
                dict.fromkeys(PROFILING_KEYS, f"{why}, and no profiling source ({PROFILING_SOURCE_KEY})")
            )
    if model.nvlinks == 0 or "nvmlDeviceGetNvLinkState" in prof.part.not_supported:
        out.update(dict.fromkeys(NVLINK_KEYS, "it has no NVLink"))
    if "nvmlDeviceGetTotalEccErrors" in prof.part.not_supported:
        out.update(dict.fromkeys(ECC_KEYS, "it has no ECC memory"))
    if FI_MEMORY_TEMP in prof.part.fields_not_supported:
        out["mem_temp_c"] = "it has no memory temperature sensor"
    return out


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    until: float = float("inf")
    gpu: int | None = None  # None: every GPU
    function: str | None = None  # NVML function for error / hang
    error: str = "Unknown"  # NVML error name for `error`
    seconds: float = 0.0  # how long a hung call blocks
    xid: int = 0
    engine: str | None = None

    def active(self, t: float) -> bool:
        return self.at <= t < self.until


@dataclass(frozen=True)
class EngineSpec:
    name: str
    model: str
    gpus: tuple[int, ...]
    kind: str = "vllm"  # KINDS: whose page it serves
    role: str = "unified"  # ROLES: prefill/decode disaggregation
    block_size: int = 16
    num_gpu_blocks: int = 20000
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    cpu_numa_nodes: tuple[int, ...] | None = None  # NUMA nodes of its CPUs (its cpuset)


@dataclass(frozen=True)
class MigSpec:
    gpus: tuple[int, ...]
    instances: tuple[tuple[str, float, int], ...]  # (profile, memory ratio, SMs)


@dataclass(frozen=True)
class Phase:
    name: str
    duration: float
    ramp: float = 0.0
    gpu: Mapping[str, float] = field(default_factory=dict)
    gpus: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    engine: Mapping[str, float] = field(default_factory=dict)
    engines: Mapping[str, Mapping[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpu_count: int
    gpu_model: GpuModel
    phases: tuple[Phase, ...]
    faults: tuple[Fault, ...] = ()
    engines: tuple[EngineSpec, ...] = ()
    mig: MigSpec | None = None
    expect_findings: tuple[str, ...] = ()
    profile: DriverProfile = field(default_factory=DriverProfile)  # driver branch and part quirks
    dcgm_exporter: DcgmExporterSpec | None = None  # a simulated dcgm-exporter (sim/dcgm.py)
    # Identities of recorded GPUs, where the fake would make them up; `steady` drops the
    # fake's wobble so values are exactly the timeline's (replaying a recording).
    uuids: tuple[str, ...] = ()
    pci_bus_ids: tuple[str, ...] = ()
    steady: bool = False
    processes: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)  # (pid, bytes)
    sharing: SharingSpec | None = None  # shared GPUs, their tenants and pods (sim/sharing.py)

    @property
    def duration(self) -> float:
        return sum(p.duration for p in self.phases)

    def engine_pids(self, name: str) -> dict[int, int]:
        """GPU index -> the pid the fake NVML reports for this engine's worker there."""
        i = next(i for i, e in enumerate(self.engines) if e.name == name)
        return {gpu: SIM_PID_BASE + 100 * i + rank for rank, gpu in enumerate(self.engines[i].gpus)}


SIM_PID_BASE = 4_000_000  # above Linux's pid_max, so never a real process


Track = tuple[list[float], list[float]]  # breakpoint times and values


class Timeline:
    """Piecewise-linear value tracks, evaluated at scenario time."""

    def __init__(
        self, scenario: Scenario, speed: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.scenario = scenario
        self.speed = speed
        self._clock = clock
        self._start = clock()
        start = {**GPU_KEYS, "power_limit_watts": scenario.gpu_model.power_limit_watts}
        self._gpu = [_tracks(scenario, start, "gpu", i) for i in range(scenario.gpu_count)]
        self._engine = {e.name: _tracks(scenario, ENGINE_KEYS, "engine", e.name) for e in scenario.engines}

    def now(self) -> float:
        return (self._clock() - self._start) * self.speed

    def phase_at(self, t: float) -> str:
        """The phase playing at scenario time t; after the end, the last one (its values hold)."""
        end = 0.0
        for phase in self.scenario.phases:
            end += phase.duration
            if t < end:
                return phase.name
        return self.scenario.phases[-1].name

    def gpu(self, index: int, key: str, t: float | None = None) -> float:
        return _at(self._gpu[index][key], self.now() if t is None else t)

    def gpu_integral(self, index: int, key: str, t: float | None = None) -> float:
        return _integral(self._gpu[index][key], self.now() if t is None else t)

    def gpu_integral_of_product(self, index: int, key: str, by: str, t: float | None = None) -> float:
        """Area under key x by from 0 to t: the energy of a power ratio times a limit."""
        a, b = self._gpu[index][key], self._gpu[index][by]
        t = self.now() if t is None else t
        if len(set(b[1])) == 1:  # a constant factor
            return _integral(a, t) * b[1][0]
        cuts = sorted({0.0, t, *(x for x in (*a[0], *b[0]) if 0.0 < x < t)})
        total = 0.0
        for t0, t1 in pairwise(cuts):
            # both are linear inside a piece: two-point Gauss-Legendre is exact for the product
            mid, d = (t0 + t1) / 2, (t1 - t0) / (2 * 3**0.5)
            total += (t1 - t0) / 2 * sum(_at(a, x) * _at(b, x) for x in (mid - d, mid + d))
        return total

    def engine(self, name: str, key: str, t: float | None = None) -> float:
        return _at(self._engine[name][key], self.now() if t is None else t)

    def engine_integral(self, name: str, key: str, t: float | None = None) -> float:
        return _integral(self._engine[name][key], self.now() if t is None else t)

    def faults(self, kind: str, t: float | None = None) -> list[Fault]:
        t = self.now() if t is None else t
        return [f for f in self.scenario.faults if f.kind == kind and f.active(t)]


def _tracks(scn: Scenario, keys: Mapping[str, float], scope: str, who: int | str) -> dict[str, Track]:
    tracks: dict[str, Track] = {k: ([0.0], [v]) for k, v in keys.items()}
    t = 0.0
    for phase in scn.phases:
        common = phase.gpu if scope == "gpu" else phase.engine
        per: Mapping[Any, Mapping[str, float]] = phase.gpus if scope == "gpu" else phase.engines
        own = per.get(who, {})
        for key, target in {**common, **own}.items():
            times, values = tracks[key]
            prev = _at((times, values), t)
            times.append(t)
            values.append(prev)
            times.append(t + min(phase.ramp, phase.duration))
            values.append(float(target))
        t += phase.duration
    return tracks


def _at(track: Track, t: float) -> float:
    times, values = track
    i = bisect.bisect_right(times, t)
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    v0, v1 = values[i - 1], values[i]
    return v1 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def _integral(track: Track, t: float) -> float:
    """Area under the track from 0 to t: what a counter of that rate has reached."""
    times, values = track
    total = 0.0
    for i in range(1, len(times)):
        t0, t1 = times[i - 1], min(times[i], t)
        if t0 >= t:
            break
        if t1 <= t0:  # a step: no width, no area
            continue
        # the segment's own end value: at a step, _at would give the value after it
        end = values[i - 1] + (values[i] - values[i - 1]) * (t1 - t0) / (times[i] - t0)
        total += (values[i - 1] + end) / 2 * (t1 - t0)
    if t > times[-1]:
        total += values[-1] * (t - times[-1])
    return total


# ---- loading -------------------------------------------------------------------------


def builtin_names() -> list[str]:
    files = resources.files("exporter.sim").joinpath("scenarios")
    return sorted(p.name.removesuffix(".yaml") for p in files.iterdir() if p.name.endswith(".yaml"))


def load_builtin(name: str) -> Scenario:
    if name not in builtin_names():
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(builtin_names())}")
    text = resources.files("exporter.sim").joinpath("scenarios", f"{name}.yaml").read_text()
    return parse(yaml.safe_load(text), source=f"{name}.yaml")


def load_file(path: str | Path) -> Scenario:
    """The scenario in a YAML file; a file that is none is a ScenarioError of one line."""
    try:
        data = read_document(path)
    except ValueError as err:
        raise ScenarioError(f"{path}: {err}") from None
    return parse(data, source=str(path))


def parse(data: Any, source: str = "<scenario>") -> Scenario:
    where = source

    def fail(key: str, expected: str) -> ScenarioError:
        return ScenarioError(f"{where}: '{key}' must be {expected}")

    if not isinstance(data, dict):
        raise fail("<top level>", "a mapping")
    if (bad := bad_number(data)) is not None:
        raise fail(bad, "a finite number of sane size (NaN, infinity and over 1e18 are not)")
    known = {"name", "description", "gpus", "phases", "faults", "engines", "mig", "expect", "dcgm_exporter"}
    known.add("sharing")
    for key in data:
        if key not in known:
            raise ScenarioError(f"{where}: unknown key '{key}' (known: {', '.join(sorted(known))})")
    gpus = data.get("gpus", {})
    if not isinstance(gpus, dict):
        raise fail("gpus", "a mapping with count and model")
    count = gpus.get("count", 8)
    if type(count) is not int or not 1 <= count <= 1024:
        raise fail("gpus.count", "an integer from 1 to 1024")
    model_name = gpus.get("model", "H100-80GB-SXM")
    if isinstance(model_name, dict):
        gpu_model, part = inline_model(model_name, GpuModel, fail)
    elif model_name in MODELS:
        gpu_model, part = MODELS[model_name], PARTS.get(model_name, NO_QUIRKS)
    else:
        raise fail("gpus.model", f"one of {', '.join(MODELS)}, or a mapping of GpuModel fields")
    driver = recorded_driver(gpus, fail)
    mig_monitor, host_pid = (gpus.get(k, True) for k in ("mig_monitor", "host_pid"))
    for key, flag in (("mig_monitor", mig_monitor), ("host_pid", host_pid)):
        if not isinstance(flag, bool):
            raise fail(f"gpus.{key}", "true or false")
    phases = tuple(_phase(p, i, fail, count) for i, p in enumerate(_list(data, "phases", fail)))
    if not phases:
        raise fail("phases", "a non-empty list")
    engines = tuple(_engine(e, i, fail, count) for i, e in enumerate(_list(data, "engines", fail)))
    names = {e.name for e in engines}
    for p in phases:
        for n in p.engines:
            if n not in names:
                raise fail(f"phases.{p.name}.engines.{n}", f"the name of a declared engine ({names})")
    _check_on_page(phases, engines, where)
    prof = DriverProfile(driver, part, mig_monitor, host_pid)
    label = model_name if isinstance(model_name, str) else gpu_model.name
    _check_provided(phases, gpu_model, label, prof, PROFILING_SOURCE_KEY in data, where)
    faults = tuple(_fault(f, i, fail, count) for i, f in enumerate(_list(data, "faults", fail)))
    expect = data.get("expect", {}) or {}
    findings = expect.get("findings", []) if isinstance(expect, dict) else None
    if not isinstance(findings, list) or not all(isinstance(f, str) for f in findings):
        raise fail("expect.findings", "a list of rule ids")
    mig = None
    if data.get("mig") is not None:
        m = data["mig"]
        shape = partial(fail, "mig", "{gpus: [GPU indexes], instances: [{profile, memory_ratio (0-1], sms}]}")
        try:
            inst = tuple(
                (
                    str(i["profile"]),
                    number(i["memory_ratio"], shape, 1e-6, 1.0),
                    int(number(i["sms"], shape, 1, 4096, True)),
                )
                for i in m["instances"]
            )
            mig = MigSpec(
                tuple(int(number(g, shape, 0, count - 1, True)) for g in m.get("gpus", range(count))), inst
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise shape() from err
    dcgm = None
    if data.get("dcgm_exporter") is not None:
        try:
            dcgm = parse_spec(data["dcgm_exporter"])
        except ValueError as err:
            raise ScenarioError(f"{where}: 'dcgm_exporter' {err}") from None
    return Scenario(
        name=str(data.get("name", Path(source).stem)),
        description=str(data.get("description", "")),
        gpu_count=count,
        gpu_model=gpu_model,
        phases=phases,
        faults=faults,
        engines=engines,
        mig=mig,
        expect_findings=tuple(findings),
        profile=prof,
        **identities(gpus, count, fail),
        dcgm_exporter=dcgm,
        sharing=parse_sharing(data.get("sharing"), count, [e.name for e in engines], fail),
    )


def _check_provided(
    phases: tuple[Phase, ...], model: GpuModel, label: str, prof: DriverProfile, profiling: bool, where: str
) -> None:
    """Refuse a phase value the simulated GPUs could not report (it would vanish unseen),
    and a power limit outside what the part lets be set."""
    missing = unprovided_keys(model, prof, profiling)
    low, high = model.power_limit_watts * POWER_LIMIT_MIN_RATIO, model.power_limit_watts
    for p in phases:
        scopes = [("gpu", p.gpu), *((f"gpus.{i}", v) for i, v in p.gpus.items())]
        for scope, values in scopes:
            if not low <= values.get("power_limit_watts", high) <= high:
                raise ScenarioError(
                    f"{where}: 'phases.{p.name}.{scope}.power_limit_watts' must be from {low:g} to "
                    f"{high:g} W, the limits the {model.name} ({label}) can be set to"
                )
            for key in values:
                if key in missing:
                    raise ScenarioError(
                        f"{where}: 'phases.{p.name}.{scope}.{key}': the simulated {model.name} ({label}) "
                        f"cannot report {key}: {missing[key]}; remove it or pick a model that has it"
                    )


def _check_on_page(phases: tuple[Phase, ...], engines: tuple[EngineSpec, ...], where: str) -> None:
    """Refuse an engine value that no page of the engines it is set for carries."""
    kinds = {e.name: e.kind for e in engines}
    for p in phases:
        scopes = [("engine", p.engine, set(kinds.values()))]
        scopes += [(f"engines.{n}", values, {kinds[n]}) for n, values in p.engines.items()]
        for scope, values, of in scopes:
            for key in values:
                if of and all(key in NOT_ON_PAGE[k] for k in of):
                    raise ScenarioError(
                        f"{where}: 'phases.{p.name}.{scope}.{key}': the page of {'/'.join(sorted(of))} "
                        "has no metric for it; remove it or pick an engine kind that reports it"
                    )


def _list(data: dict[str, Any], key: str, fail: Callable[[str, str], ScenarioError]) -> list[Any]:
    value = data.get(key, []) or []
    if not isinstance(value, list):
        raise fail(key, "a list")
    return value


def _values(
    raw: Any, keys: Mapping[str, float], where: str, fail: Callable[[str, str], ScenarioError]
) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(where, "a mapping of quantity -> number")
    out = {}
    for k, v in raw.items():
        if k not in keys:
            raise fail(f"{where}.{k}", f"one of the known quantities ({', '.join(keys)})")
        lo, hi = value_range(k)
        out[k] = number(v, partial(fail, f"{where}.{k}", f"a number from {lo:g} to {hi:g}"), lo, hi)
    return out


def _phase(raw: Any, i: int, fail: Callable[[str, str], ScenarioError], count: int) -> Phase:
    if not isinstance(raw, dict):
        raise fail(f"phases[{i}]", "a mapping")
    name = str(raw.get("name", f"phase{i}"))
    seconds = f"seconds from {{}} to {SECONDS_MAX:g}"
    duration = number(
        raw.get("duration"),
        partial(fail, f"phases.{name}.duration", seconds.format(0.001)),
        0.001,
        SECONDS_MAX,
    )
    ramp = number(raw.get("ramp", 0), partial(fail, f"phases.{name}.ramp", seconds.format(0)), hi=SECONDS_MAX)
    per_gpu = {}
    for g, vals in (raw.get("gpus") or {}).items():
        if type(g) is not int or not 0 <= g < count:
            raise fail(f"phases.{name}.gpus.{g}", f"a GPU index below {count}")
        per_gpu[g] = _values(vals, GPU_KEYS, f"phases.{name}.gpus.{g}", fail)
    per_engine = {
        str(e): _values(vals, ENGINE_KEYS, f"phases.{name}.engines.{e}", fail)
        for e, vals in (raw.get("engines") or {}).items()
    }
    return Phase(
        name=name,
        duration=duration,
        ramp=ramp,
        gpu=_values(raw.get("gpu"), GPU_KEYS, f"phases.{name}.gpu", fail),
        gpus=per_gpu,
        engine=_values(raw.get("engine"), ENGINE_KEYS, f"phases.{name}.engine", fail),
        engines=per_engine,
    )


def _engine(raw: Any, i: int, fail: Callable[[str, str], ScenarioError], count: int) -> EngineSpec:
    if not isinstance(raw, dict) or "name" not in raw:
        raise fail(f"engines[{i}]", "a mapping with at least a name")
    gpus = raw.get("gpus", list(range(count)))
    if not isinstance(gpus, list) or not all(type(g) is int and 0 <= g < count for g in gpus):
        raise fail(f"engines.{raw['name']}.gpus", f"a list of GPU indexes below {count}")
    numa = raw.get("cpu_numa_nodes")
    if numa is not None and (
        not isinstance(numa, list) or not numa or not all(type(n) is int and 0 <= n < 1024 for n in numa)
    ):
        raise fail(f"engines.{raw['name']}.cpu_numa_nodes", "a list of NUMA node numbers")
    kind, role = raw.get("kind", "vllm"), raw.get("role", "unified")
    if kind not in KINDS:
        raise fail(f"engines.{raw['name']}.kind", f"one of {', '.join(KINDS)}")
    if role not in ROLES or (role != "unified" and kind == "tgi"):
        raise fail(f"engines.{raw['name']}.role", f"one of {', '.join(ROLES)} (TGI: unified only)")

    def size(key: str, default: float, lo: float, hi: float, integer: bool = True) -> float:
        what = f"{'an integer' if integer else 'a number'} from {lo:g} to {hi:g}"
        return number(
            raw.get(key, default), partial(fail, f"engines.{raw['name']}.{key}", what), lo, hi, integer
        )

    return EngineSpec(
        name=str(raw["name"]),
        model=str(raw.get("model", "meta-llama/Llama-3.1-8B-Instruct")),
        gpus=tuple(gpus),
        kind=kind,
        role=role,
        block_size=int(size("block_size", 16, 1, 4096)),
        num_gpu_blocks=int(size("num_gpu_blocks", 20000, 1, 1e9)),
        gpu_memory_utilization=size("gpu_memory_utilization", 0.9, 0.01, 1.0, integer=False),
        max_num_seqs=int(size("max_num_seqs", 256, 1, 1e6)),
        cpu_numa_nodes=tuple(numa) if numa is not None else None,
    )


def _fault(raw: Any, i: int, fail: Callable[[str, str], ScenarioError], count: int) -> Fault:
    if not isinstance(raw, dict):
        raise fail(f"faults[{i}]", "a mapping")
    kind = raw.get("kind")
    if kind not in FAULT_KINDS:
        raise fail(f"faults[{i}].kind", f"one of {', '.join(FAULT_KINDS)}")
    gpu = raw.get("gpu")
    if gpu is not None and (type(gpu) is not int or not 0 <= gpu < count):
        raise fail(f"faults[{i}].gpu", f"a GPU index below {count}")
    when = partial(fail, f"faults[{i}].at/until", f"numbers of seconds up to {SECONDS_MAX:g} with until > at")
    at = number(raw.get("at", 0), when, hi=SECONDS_MAX)
    until = raw.get("until", float("inf"))
    until = until if until == float("inf") else number(until, when, hi=SECONDS_MAX)
    if until <= at:
        raise when()
    if kind in ("error", "hang") and not isinstance(raw.get("function"), str):
        raise fail(f"faults[{i}].function", "the name of an NVML function")
    hang = number(
        raw.get("seconds", 0.0), partial(fail, f"faults[{i}].seconds", "seconds from 0 to 86400"), hi=86400
    )
    xid = number(
        raw.get("xid", 0), partial(fail, f"faults[{i}].xid", "an XID from 0 to 65535"), hi=65535, integer=True
    )
    return Fault(
        kind=kind,
        at=at,
        until=until,
        gpu=gpu,
        function=raw.get("function"),
        error=str(raw.get("error", "DriverNotLoaded" if kind == "reload" else "Unknown")),
        seconds=hang,
        xid=int(xid),
        engine=raw.get("engine"),
    )
