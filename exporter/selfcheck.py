"""`llm-gpu-exporter selfcheck`: the exporter's readings against nvidia-smi's, on this node.

One exporter is built as `serve` builds it (its GPU collectors; engine scraping and the
kubelet are left out) and takes two samples a little apart (GPM compares two).
nvidia-smi is then asked for `-q -x` and the compute processes, and every reading both
report is compared. Quantities that move on their own (memory in use,
power, temperature, clocks) pass when nvidia-smi's value lies between the exporter's two
samples widened by a stated slack; identities, limits and sizes must agree exactly, at
nvidia-smi's printed resolution. Then the NVML paths nvidia-smi does not exercise are
tried directly: GPM samples, field values and XID event registration.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check failed, 3 when
there is no NVIDIA driver to check against.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from exporter import __version__, smi
from exporter.config import Settings, replace
from exporter.gpu_readings import DeviceFacts, MigProfiling, NvLink, Profiling
from exporter.metricdef import has_value
from exporter.nvml import (
    FI_MEMORY_TEMP,
    FI_PCIE_COUNT_RX_BYTES,
    FI_PCIE_COUNT_TX_BYTES,
    FI_PCIE_REPLAY_COUNTER,
    FI_PERF_POLICY_POWER,
    FI_PERF_POLICY_THERMAL,
    INVALID_ARGUMENT,
    Nvml,
    NvmlError,
    NvmlUnavailable,
    decode,
    hw_slowdown_fields,
)
from exporter.nvml import const as N
from exporter.smi_compare import RULES, Check, compare
from exporter.snapshot import Snapshot

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_NO_DRIVER = 3
MIB = smi.MIB

# Field values the exporter reads (PCIe counters, HBM temperature, throttle durations);
# the HW slowdown durations join under the ids this driver gives them.
FIELD_IDS = {
    FI_PCIE_COUNT_TX_BYTES: "PCIE_COUNT_TX_BYTES",
    FI_PCIE_COUNT_RX_BYTES: "PCIE_COUNT_RX_BYTES",
    FI_PCIE_REPLAY_COUNTER: "PCIE_REPLAY_COUNTER",
    FI_MEMORY_TEMP: "MEMORY_TEMP",
    FI_PERF_POLICY_POWER: "PERF_POLICY_POWER",
    FI_PERF_POLICY_THERMAL: "PERF_POLICY_THERMAL",
}
HW_SLOWDOWN_NAMES = {
    "hw_thermal": "CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake": "CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
GPM_ARCHITECTURES = ("Hopper", "Blackwell")


@dataclass
class Report:
    source: str
    driver: str = ""
    cuda: str = ""
    binding: str = ""
    nvml_version: str = ""
    gpus: list[tuple[int, str, str, str]] = field(default_factory=list)  # index, name, uuid, bus id
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return EXIT_FAIL if self.failed else EXIT_PASS


class SmiUnavailable(RuntimeError):
    """nvidia-smi could not be run or gave no usable answer."""


def run_smi(path: str, args: Sequence[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            [path, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise SmiUnavailable(f"{path} not found (give its path with --nvidia-smi)") from None
    except PermissionError:
        raise SmiUnavailable(f"{path} is not executable") from None
    except subprocess.TimeoutExpired:
        raise SmiUnavailable(f"`{path} {' '.join(args)}` did not finish within {timeout:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SmiUnavailable(
            f"`{path} {' '.join(args)}` exited {done.returncode}" + (f": {said[-1]}" if said else "")
        )
    return done.stdout


# ---- comparing ---------------------------------------------------------------------------


def probe_gpm(nvml: Nvml, snap: Snapshot, log: smi.SmiLog | None) -> list[Check]:
    checks = []
    for g in snap.gpus:
        try:
            support = nvml.query(N.nvmlGpmQueryDeviceSupport, nvml.handle(g.index))
        except NvmlError as err:
            checks.append(Check("GPM", "fail", f"nvmlGpmQueryDeviceSupport: {err.name}", g.index))
            continue
        prof = g.get(Profiling)
        theirs = log.gpu(g.uuid) if log else None
        arch = theirs.architecture if theirs else None
        mig_on = (theirs is not None and theirs.mig_enabled) or (g.facts or DeviceFacts()).get(
            "mig_mode"
        ) == "enabled"
        if mig_on and support is not None and support.isSupportedDevice:
            checks.append(gpm_under_mig(g.index, prof, g.get(MigProfiling)))
        elif mig_on:
            checks.append(Check("GPM", "skip", "MIG is on and the driver reports no GPM support", g.index))
        elif support is None or not support.isSupportedDevice:
            if arch in GPM_ARCHITECTURES:
                checks.append(
                    Check("GPM", "warn", f"a {arch} GPU whose driver reports no GPM support", g.index)
                )
            else:
                checks.append(Check("GPM", "skip", "not supported (GPM needs Hopper or later)", g.index))
        elif prof is not None and has_value(prof):
            shown = "n/a" if prof.sm_active_ratio is None else f"{prof.sm_active_ratio:.2f}"
            checks.append(Check("GPM", "pass", f"two samples compared: SM active {shown}", g.index))
        else:
            checks.append(Check("GPM", "fail", "supported, but two samples gave no GPM metrics", g.index))
    return checks


def pid_namespace(host: bool | None) -> Check:
    """Whether NVML's process lists can be whole here (exporter/environment.py)."""
    if host is None:
        return Check("PID namespace", "warn", "/proc/self/ns/pid unreadable: process lists may be partial")
    if host:
        return Check("PID namespace", "pass", "the host's: NVML lists every GPU process")
    return Check(
        "PID namespace",
        "warn",
        "not the host's: the driver lists only processes visible here, so the process series "
        "are left out (run the pod with hostPID: true)",
    )


def clock_event_numbering(driver: str) -> Check:
    """Which ids the HW slowdown durations are read from on this driver, beside the
    binding's own constants (which follow the header it was made from, not the driver)."""
    numbered = hw_slowdown_fields(driver)
    theirs = getattr(N, "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN", None)
    binding = f"the binding's constant: {theirs}" if theirs is not None else "the binding has no constant"
    if numbered is None:
        return Check(
            "clock-event ids",
            "warn",
            f"driver {driver}: which ids hold the HW thermal and power brake durations is not "
            f"known, so they are not read ({binding})",
        )
    if not numbered:
        return Check("clock-event ids", "pass", f"driver {driver} has no HW slowdown duration fields")
    return Check(
        "clock-event ids",
        "pass",
        f"driver {driver}: HW thermal at {numbered['hw_thermal']}, HW power brake at "
        f"{numbered['hw_power_brake']} ({binding})",
    )


def gpm_under_mig(index: int, parent: Profiling | None, instances: MigProfiling | None) -> Check:
    """What GPM answers on a MIG-enabled GPU, recorded: no source says what a sample of the
    parent covers, and nvmlGpmMigSampleGet is what gives each GPU instance its activity."""
    shown = "no metrics"
    if parent is not None and parent.sm_active_ratio is not None:
        shown = f"SM active {parent.sm_active_ratio:.2f}, tensor {parent.tensor_active_ratio or 0:.2f}"
    per = [
        f"GI {i.gpu_instance} SM {i.sm_active_ratio:.2f}"
        for i in (instances.instances if instances else ())
        if i.sm_active_ratio is not None
    ]
    detail = (
        f"MIG on: the parent's samples gave {shown}; nvmlGpmMigSampleGet gave {', '.join(per) or 'nothing'}"
    )
    return Check("GPM", "pass" if per else "warn", detail, index)


def probe_fields(nvml: Nvml, gpus: Iterable[int], driver: str = "") -> list[Check]:
    checks = []
    names = dict(FIELD_IDS)
    for reason, fid in (hw_slowdown_fields(driver) or {}).items():
        names[fid] = HW_SLOWDOWN_NAMES[reason]
    ids = [(fid, 0) for fid in names]
    for index in gpus:
        try:
            got = nvml.field_values(nvml.handle(index), ids)
        except NvmlError as err:
            checks.append(Check("field values", "fail", f"nvmlDeviceGetFieldValues: {err.name}", index))
            continue
        absent = [names[fid] for fid, _ in ids if (fid, 0) not in got]
        if len(absent) == len(ids):
            checks.append(Check("field values", "fail", "nvmlDeviceGetFieldValues answered none", index))
        else:
            detail = f"{len(ids) - len(absent)} of {len(ids)} answered"
            checks.append(
                Check(
                    "field values",
                    "pass",
                    detail + (f" (absent: {', '.join(absent)})" if absent else ""),
                    index,
                )
            )
    return checks


# nvml.h nvmlValueType_t, by number (the oldest binding lacks the later names)
VALUE_TYPE_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32, 6: 16}  # uint, ulong, ull, sll, int, ushort
PCIE_BYTES = [(FI_PCIE_COUNT_TX_BYTES, 0), (FI_PCIE_COUNT_RX_BYTES, 0)]


def pcie_counter_width(nvml: Nvml, gpus: Iterable[int]) -> Check:
    """The width the PCIe byte counters are answered in: nvml.h says they "can be wrapped"
    and gives none. 64 bits never wrap in practice; 32 bits wrap every 4 GiB."""
    widths: dict[int, set[int]] = {}
    for index in gpus:
        try:
            types = nvml.field_types(nvml.handle(index), PCIE_BYTES)
        except NvmlError:
            continue
        for value_type in types.values():
            widths.setdefault(VALUE_TYPE_BITS.get(value_type, 0), set()).add(index)
    if not widths:
        return Check("PCIe counter width", "skip", "no GPU answers the PCIe byte counters")
    said = "; ".join(
        f"{bits or 'unknown'}-bit on GPU {sorted(gpus)}" for bits, gpus in sorted(widths.items())
    )
    narrow = any(bits < 64 for bits in widths)
    return Check("PCIe counter width", "warn" if narrow else "pass", f"TX/RX bytes answered {said}")


def nvlink_states(snap: Snapshot) -> Check:
    """The states the links are in (field 165: ACTIVE, SLEEP, INACTIVE), GPU by GPU."""
    seen = []
    down = False
    for g in snap.gpus:
        links = g.get(NvLink)
        if links is None or not links.link_count:
            continue
        asleep = links.links_sleeping or 0
        inactive = links.link_count - (links.links_up or 0) - asleep
        down = down or inactive > 0
        seen.append(f"GPU {g.index}: {links.links_up} active, {asleep} asleep, {inactive} inactive")
    if not seen:
        return Check("NVLink states", "skip", "no GPU reports NVLink link states")
    return Check("NVLink states", "warn" if down else "pass", "; ".join(seen))


def failed_calls(snap: Snapshot) -> Check:
    """The NVML calls that failed on their own: InvalidArgument is the driver saying a
    part lacks a link or counter (which the fake only supposes); anything else is a warning."""
    failed = [
        (c.collector, call.function, error, n)
        for c in snap.collectors
        for call in c.calls
        for error, n in (call.errors or {}).items()
    ]
    if not failed:
        return Check("NVML calls", "pass", "no call failed on its own")
    listed = "; ".join(f"{col}: {fn} {error} x{n}" for col, fn, error, n in failed)
    bad = any(error != INVALID_ARGUMENT for _, _, error, _ in failed)
    return Check("NVML calls", "warn" if bad else "pass", f"failed on their own, values absent: {listed}")


def probe_xid(nvml: Nvml, seconds: float) -> list[Check]:
    """Register for XID events on every GPU and listen a while, as the XID collector does."""
    try:
        event_set = nvml.query(N.nvmlEventSetCreate)
    except NvmlError as err:
        return [Check("XID events", "fail", f"nvmlEventSetCreate: {err.name}")]
    if event_set is None:
        return [Check("XID events", "fail", "nvmlEventSetCreate is not supported: no XID counters")]
    registered: list[int] = []
    refused: list[str] = []
    seen: list[str] = []
    try:
        for index in range(nvml.count):
            try:
                h = nvml.handle(index)
                ok = nvml.supported(N.nvmlDeviceRegisterEvents, h, N.nvmlEventTypeXidCriticalError, event_set)
            except NvmlError as err:
                refused.append(f"GPU {index} ({err.name})")
                continue
            if ok:
                registered.append(index)
            else:
                refused.append(f"GPU {index} (not supported)")
        deadline = time.monotonic() + seconds
        while registered and (left := deadline - time.monotonic()) > 0:
            try:
                data = nvml.query(N.nvmlEventSetWait_v2, event_set, max(1, int(left * 1000)))
            except NvmlError as err:
                if err.name != "Timeout":
                    return [Check("XID events", "fail", f"nvmlEventSetWait_v2: {err.name}")]
                break
            if data is not None:
                seen.append(f"XID {data.eventData} on GPU {nvml.index_of(data.device)}")
    finally:
        with contextlib.suppress(N.NVMLError):
            N.nvmlEventSetFree(event_set)
    checks = []
    if registered:
        checks.append(
            Check(
                "XID events",
                "pass",
                f"registered on {len(registered)} of {nvml.count} GPUs; listened {seconds:g} s",
            )
        )
    if refused:
        checks.append(
            Check("XID events", "warn" if registered else "fail", f"refused by {', '.join(refused)}")
        )
    if seen:
        checks.append(Check("XID events", "warn", f"reported during the check: {', '.join(seen)}"))
    return checks


# ---- the command --------------------------------------------------------------------------


def _binding_version() -> str:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def run(
    settings: Settings, nvidia_smi: str = "nvidia-smi", smi_timeout: float = 20.0, xid_seconds: float = 3.0
) -> Report:
    """Sample, ask nvidia-smi, compare. Raises NvmlUnavailable without a driver."""
    from exporter import app

    source = f"simulated: {settings.simulate or settings.scenario_file}" if settings.simulated else "NVML"
    report = Report(source=source, binding=_binding_version())
    # Only the GPU side is checked: no engine scrapes, no kubelet, nothing off this host.
    disabled = tuple(sorted({*settings.collectors_disabled, "engines", "allocator"}))
    exporter = app.build(
        replace(
            settings, collectors_disabled=disabled, kubelet_socket=None, process_owners=False, pod_labels=None
        )
    )
    try:
        nvml = exporter.nvml
        with contextlib.suppress(N.NVMLError):  # absent from old drivers
            report.nvml_version = decode(N.nvmlSystemGetNVMLVersion())
        first = exporter.runner.step().snapshot
        # XID listening runs while the samples are a little apart.
        xid: list[Check] = []
        listener = threading.Thread(target=lambda: xid.extend(probe_xid(nvml, xid_seconds)), daemon=True)
        listener.start()
        time.sleep(min(1.0, settings.interval))  # GPM compares two samples
        second = exporter.runner.step().snapshot
        log: smi.SmiLog | None = None
        processes: tuple[smi.SmiProcess, ...] | None = None
        try:
            log = smi.parse_xml(run_smi(nvidia_smi, ["-q", "-x"], smi_timeout))
            report.checks.append(Check("nvidia-smi", "pass", f"{nvidia_smi} -q -x: {len(log.gpus)} GPU(s)"))
        except (SmiUnavailable, smi.SmiError) as err:
            report.checks.append(Check("nvidia-smi", "fail", str(err)))
        if log is not None:
            fields = ",".join(smi.COMPUTE_APPS_FIELDS)
            args = [f"--query-compute-apps={fields}", "--format=csv,noheader,nounits"]
            try:
                processes = smi.parse_compute_apps_csv(
                    run_smi(nvidia_smi, args, smi_timeout), smi.COMPUTE_APPS_FIELDS
                )
            except (SmiUnavailable, smi.SmiError) as err:
                report.checks.append(
                    Check("nvidia-smi", "warn", f"compute processes: {err}; using -q -x's list")
                )
            report.checks.extend(compare(first, second, log, processes))
            report.driver, report.cuda = log.driver_version or "", log.cuda_version or ""
        facts = [(g.index, g.facts or DeviceFacts(), g.uuid) for g in second.gpus]
        report.gpus = [(i, f.get("name"), uuid, f.get("pci_bus_id")) for i, f, uuid in facts]
        if facts:
            report.driver = report.driver or facts[0][1].get("driver_version")
            report.cuda = report.cuda or facts[0][1].get("cuda_version")
        report.checks.append(pid_namespace(exporter.environment.host_pid_namespace))
        report.checks.extend(probe_gpm(nvml, second, log))
        driver = decode(nvml.query(N.nvmlSystemGetDriverVersion) or "")
        report.checks.append(clock_event_numbering(driver))
        report.checks.extend(probe_fields(nvml, (g.index for g in second.gpus if g.up), driver))
        report.checks.append(pcie_counter_width(nvml, (g.index for g in second.gpus if g.up)))
        report.checks.append(nvlink_states(second))
        report.checks.append(failed_calls(second))
        listener.join(xid_seconds + 10)
        report.checks.extend(xid or [Check("XID events", "fail", "the event wait did not return")])
    finally:
        exporter.close()
    return report


STATUS_WORD = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skip": "SKIP"}


def render(report: Report) -> str:
    """Failures, warnings and skips one per line; checks that passed everywhere, one line each."""
    lines = [
        f"llm-gpu-exporter {__version__} selfcheck ({report.source})",
        f"driver {report.driver or '?'}, CUDA {report.cuda or '?'}, NVML {report.nvml_version or '?'}, "
        f"nvidia-ml-py {report.binding}",
    ]
    lines += [f"  GPU {i}  {name}  {uuid}  {bus}" for i, name, uuid, bus in report.gpus]
    lines.append("")
    width = max((len(c.name) for c in report.checks), default=10) + 8
    by_name: dict[str, list[Check]] = {}
    for c in report.checks:
        by_name.setdefault(c.name, []).append(c)
    for name, checks in by_name.items():
        passed = [c for c in checks if c.status == "pass"]
        shown = checks if len(checks) == 1 or name not in RULES else [c for c in checks if c.status != "pass"]
        if len(shown) < len(checks):
            others = "other " if shown else ""
            lines.append(f"PASS  {name:<{width}}{len(passed)} {others}GPU(s): {RULES[name]}")
        for c in shown:
            where = f"GPU {c.gpu} {name}" if c.gpu is not None else name
            lines.append(f"{STATUS_WORD[c.status]}  {where:<{width}}{c.detail}")
    failed, warned = report.failed, [c for c in report.checks if c.status == "warn"]
    lines.append("")
    if failed:
        names = sorted({c.name + ("" if c.gpu is None else f" on GPU {c.gpu}") for c in failed})
        lines.append(f"FAIL: {len(failed)} of {len(report.checks)} checks failed: {'; '.join(names)}")
    else:
        lines.append(f"PASS: {len(report.checks)} checks, {len(warned)} warning(s)")
    return "\n".join(lines)


def main(
    settings: Settings,
    nvidia_smi: str = "nvidia-smi",
    smi_timeout: float = 20.0,
    xid_seconds: float = 3.0,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    try:
        report = run(settings, nvidia_smi, smi_timeout, xid_seconds)
    except NvmlUnavailable as err:
        print(f"llm-gpu-exporter selfcheck: {err}; nothing to check", file=sys.stderr)
        return EXIT_NO_DRIVER
    print(render(report), file=out)
    return report.exit_code
