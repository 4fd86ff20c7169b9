"""`selfcheck` end to end on the simulator, against an nvidia-smi stand-in that prints XML.

The stand-in's XML is written from the simulated GPUs' own readings (a separate exporter
built on the same scenario), in the shape a 535+ driver prints; mutations of it must fail
the check that covers the changed value, and only that one.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

from exporter import app, cli
from exporter.config import Settings
from exporter.gpu_readings import Clocks, Ecc, Memory, Pcie, Power, Processes
from exporter.selfcheck import EXIT_NO_DRIVER
from exporter.snapshot import Snapshot

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out

MIB = 1024 * 1024
ARGS = ["selfcheck", "--simulate", "healthy", "--interval", "0.2", "--xid-seconds", "0.3"]


def _simulated() -> Snapshot:
    exporter = app.build(Settings(simulate="healthy", interval=0.2))
    try:
        exporter.runner.step()
        return exporter.runner.step().snapshot
    finally:
        exporter.close()


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    return _simulated()


def _sub(parent: ET.Element, path: str, text: str) -> None:
    node = parent
    for tag in path.split("/"):
        found = node.find(tag)
        node = found if found is not None else ET.SubElement(node, tag)
    node.text = text


def smi_xml(snap: Snapshot) -> ET.Element:
    """What nvidia-smi -q -x would print for these GPUs, in its units and its formats."""
    root = ET.Element("nvidia_smi_log")
    facts0 = snap.gpus[0].facts
    assert facts0 is not None
    _sub(root, "driver_version", facts0.get("driver_version"))
    _sub(root, "cuda_version", facts0.get("cuda_version"))
    _sub(root, "attached_gpus", str(len(snap.gpus)))
    for g in snap.gpus:
        f, mem, power, clocks = g.facts, g.get(Memory), g.get(Power), g.get(Clocks)
        ecc, pcie, procs = g.get(Ecc), g.get(Pcie), g.get(Processes)
        assert f and mem and power and clocks and ecc and pcie and procs
        assert f.memory_total_bytes and mem.used_bytes is not None and mem.reserved_bytes is not None
        assert power.usage_watts and power.limit_watts and power.gpu_celsius and power.memory_celsius
        assert clocks.sm_hertz and clocks.memory_hertz and f.sm_clock_max_hertz and f.memory_clock_max_hertz
        x = ET.SubElement(root, "gpu", id=f.get("pci_bus_id"))
        _sub(x, "product_name", f.get("name"))
        _sub(x, "product_architecture", "Hopper")
        _sub(x, "uuid", g.uuid)
        _sub(x, "mig_mode/current_mig", "Disabled")
        _sub(x, "pci/pci_bus_id", f.get("pci_bus_id"))
        _sub(x, "pci/pci_gpu_link_info/pcie_gen/max_link_gen", str(f.pcie_link_generation_max))
        _sub(x, "pci/pci_gpu_link_info/pcie_gen/current_link_gen", str(pcie.link_generation))
        _sub(x, "pci/pci_gpu_link_info/link_widths/max_link_width", f"{f.pcie_link_width_max}x")
        _sub(x, "pci/pci_gpu_link_info/link_widths/current_link_width", f"{pcie.link_width}x")
        reasons = ET.SubElement(x, "clocks_event_reasons")
        for reason, on in (clocks.event_active or {}).items():
            name = {"hw_thermal": "hw_thermal_slowdown", "sw_thermal": "sw_thermal_slowdown"}.get(
                reason, reason
            )
            name = {"applications_clocks": "applications_clocks_setting"}.get(name, name)
            name = {"hw_power_brake": "hw_power_brake_slowdown"}.get(name, name)
            _sub(reasons, f"clocks_event_reason_{name}", "Active" if on else "Not Active")
        total = f.memory_total_bytes // MIB
        used, reserved = mem.used_bytes // MIB, mem.reserved_bytes // MIB
        _sub(x, "fb_memory_usage/total", f"{total} MiB")
        _sub(x, "fb_memory_usage/reserved", f"{reserved} MiB")
        _sub(x, "fb_memory_usage/used", f"{used} MiB")
        _sub(x, "fb_memory_usage/free", f"{total - reserved - used} MiB")
        _sub(x, "ecc_errors/volatile/sram_correctable", "0")
        _sub(x, "ecc_errors/volatile/dram_correctable", str(ecc.corrected))
        _sub(x, "ecc_errors/volatile/sram_uncorrectable_parity", "0")
        _sub(x, "ecc_errors/volatile/sram_uncorrectable_secded", "0")
        _sub(x, "ecc_errors/volatile/dram_uncorrectable", str(ecc.uncorrected))
        rows = ecc.remapped_rows or {}
        _sub(x, "remapped_rows/remapped_row_corr", str(rows["correctable"]))
        _sub(x, "remapped_rows/remapped_row_unc", str(rows["uncorrectable"]))
        _sub(x, "remapped_rows/remapped_row_pending", "Yes" if ecc.remap_pending else "No")
        _sub(x, "remapped_rows/remapped_row_failure", "Yes" if ecc.remap_failed else "No")
        _sub(x, "temperature/gpu_temp", f"{power.gpu_celsius:.0f} C")
        _sub(x, "temperature/memory_temp", f"{power.memory_celsius:.0f} C")
        _sub(x, "gpu_power_readings/average_power_draw", f"{power.usage_watts:.2f} W")
        _sub(x, "gpu_power_readings/instant_power_draw", f"{power.usage_watts:.2f} W")
        _sub(x, "gpu_power_readings/current_power_limit", f"{power.limit_watts:.2f} W")
        _sub(x, "gpu_power_readings/max_power_limit", f"{f.power_limit_max_watts:.2f} W")
        _sub(x, "clocks/sm_clock", f"{clocks.sm_hertz / 1e6:.0f} MHz")
        _sub(x, "clocks/mem_clock", f"{clocks.memory_hertz / 1e6:.0f} MHz")
        _sub(x, "max_clocks/sm_clock", f"{f.sm_clock_max_hertz / 1e6:.0f} MHz")
        _sub(x, "max_clocks/mem_clock", f"{f.memory_clock_max_hertz / 1e6:.0f} MHz")
        processes = ET.SubElement(x, "processes")
        for p in procs.items:
            info = ET.SubElement(processes, "process_info")
            _sub(info, "pid", str(p.pid))
            _sub(info, "type", "C")
            _sub(info, "used_memory", f"{(p.used_bytes or 0) // MIB} MiB")
    return root


def compute_apps(snap: Snapshot) -> list[str]:
    """--query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits"""
    out = []
    for g in snap.gpus:
        procs = g.get(Processes)
        for p in procs.items if procs else ():
            out.append(f"{g.uuid}, {p.pid}, {(p.used_bytes or 0) // MIB}")
    return out


def stand_in(tmp_path: Path, xml: ET.Element, apps: list[str], body: str | None = None) -> str:
    """An executable that answers like nvidia-smi: XML for -q -x, CSV for the process query."""
    (tmp_path / "smi.xml").write_bytes(b'<?xml version="1.0" ?>\n' + ET.tostring(xml))
    (tmp_path / "apps.csv").write_text("".join(line + "\n" for line in apps))
    script = tmp_path / "nvidia-smi"
    script.write_text(
        body
        or "#!/bin/sh\n"
        'case "$*" in\n'
        f'  *query-compute-apps*) cat "{tmp_path}/apps.csv" ;;\n'
        f'  "-q -x") cat "{tmp_path}/smi.xml" ;;\n'
        '  *) echo "unexpected arguments: $*" >&2; exit 2 ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return str(script)


def selfcheck(capsys: pytest.CaptureFixture[str], smi_path: str, *extra: str) -> tuple[int, str]:
    code = cli.main([*ARGS, "--nvidia-smi", smi_path, *extra])
    return code, capsys.readouterr().out


def test_passes_when_nvidia_smi_agrees(
    tmp_path: Path, snapshot: Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = selfcheck(capsys, stand_in(tmp_path, smi_xml(snapshot), compute_apps(snapshot)))
    assert code == 0, out
    assert "FAIL" not in out
    assert "selfcheck (simulated: healthy)" in out
    assert "driver 580.65.06, CUDA 13.0" in out and "nvidia-ml-py 1" in out
    assert out.count("NVIDIA H100 80GB HBM3  GPU-") == 8
    for name in (
        "memory total",
        "memory used",
        "memory reserved",
        "power limit",
        "power draw",
        "GPU temperature",
        "SM clock",
        "max clocks",
        "ECC corrected",
        "remapped rows",
        "PCIe link",
        "processes",
        "GPM",
        "field values",
    ):
        line = next(line for line in out.splitlines() if line.startswith(f"PASS  {name} "))
        assert "8 GPU(s): " in line, line
    assert "PASS  XID events" in out and "registered on 8 of 8 GPUs" in out
    assert "PASS  PID namespace" in out and "NVML lists every GPU process" in out
    # links 12-17 lack the data CRC counter: answered, listed, not a warning
    assert "PASS  PCIe counter width" in out and "64-bit on GPU [0, 1, 2, 3, 4, 5, 6, 7]" in out
    assert "PASS  NVLink states" in out and "GPU 7: 18 active, 0 asleep, 0 inactive" in out
    assert "PASS  NVML calls" in out and "nvmlDeviceGetNvLinkErrorCounter InvalidArgument" in out
    assert out.rstrip().splitlines()[-1].startswith("PASS: ")


def test_a_pid_namespace_not_the_hosts_is_a_warning_naming_hostpid() -> None:
    from exporter.selfcheck import pid_namespace

    check = pid_namespace(False)
    assert check.status == "warn" and "hostPID: true" in check.detail
    assert pid_namespace(None).status == "warn" and pid_namespace(True).status == "pass"


def _gpu(root: ET.Element, index: int) -> ET.Element:
    return root.findall("gpu")[index]


def _set(path: str, value: str, gpu: int) -> Callable[[ET.Element], None]:
    def change(root: ET.Element) -> None:
        node = _gpu(root, gpu).find(path)
        assert node is not None, path
        node.text = value

    return change


@pytest.mark.parametrize(
    ("change", "failed"),
    [
        (_set("fb_memory_usage/total", "40960 MiB", 3), "memory total on GPU 3"),
        (_set("fb_memory_usage/used", "1 MiB", 2), "memory used on GPU 2"),
        (_set("gpu_power_readings/current_power_limit", "500.00 W", 1), "power limit on GPU 1"),
        (_set("gpu_power_readings/average_power_draw", "690.00 W", 0), "power draw on GPU 0"),
        (_set("temperature/gpu_temp", "91 C", 4), "GPU temperature on GPU 4"),
        (_set("max_clocks/sm_clock", "1410 MHz", 6), "max clocks on GPU 6"),
        (_set("pci/pci_gpu_link_info/link_widths/current_link_width", "8x", 5), "PCIe link on GPU 5"),
        (_set("product_name", "NVIDIA A100-SXM4-80GB", 7), "name on GPU 7"),
        (lambda root: root.remove(_gpu(root, 7)), "GPU UUIDs; GPU count"),
    ],
)
def test_a_mismatch_fails_naming_the_check(
    tmp_path: Path,
    snapshot: Snapshot,
    capsys: pytest.CaptureFixture[str],
    change: Callable[[ET.Element], None],
    failed: str,
) -> None:
    xml = smi_xml(snapshot)
    change(xml)
    code, out = selfcheck(capsys, stand_in(tmp_path, xml, compute_apps(snapshot)))
    assert code == 1, out
    assert out.rstrip().splitlines()[-1].endswith(f"checks failed: {failed}"), out


def test_missing_gpu_names_its_uuid(
    tmp_path: Path, snapshot: Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = smi_xml(snapshot)
    xml.remove(_gpu(xml, 7))
    code, out = selfcheck(capsys, stand_in(tmp_path, xml, compute_apps(snapshot)))
    assert code == 1
    assert "FAIL  GPU count" in out and "exporter 8, nvidia-smi 7" in out
    assert f"not listed by nvidia-smi: {snapshot.gpus[7].uuid}" in out


def test_a_process_only_nvidia_smi_sees_fails(
    tmp_path: Path, snapshot: Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    apps = [*compute_apps(snapshot), f"{snapshot.gpus[2].uuid}, 31337, 2048"]
    code, out = selfcheck(capsys, stand_in(tmp_path, smi_xml(snapshot), apps))
    assert code == 1
    assert "FAIL  GPU 2 processes" in out and "seen only by nvidia-smi: [31337]" in out


def test_processes_hidden_from_nvidia_smi_are_a_warning(
    tmp_path: Path, snapshot: Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    # nvidia-smi in a container without hostPID lists none; the simulated pids exist nowhere.
    code, out = selfcheck(capsys, stand_in(tmp_path, smi_xml(snapshot), []))
    assert code == 0, out
    assert all(f"WARN  GPU {i} processes" in out for i in range(8))
    assert "PASS: 170 checks, 8 warning(s)" in out
    assert "none of them is visible from here" in out


def test_a_counter_that_grew_since_is_a_warning(
    tmp_path: Path, snapshot: Snapshot, capsys: pytest.CaptureFixture[str]
) -> None:
    xml = smi_xml(snapshot)
    _set("ecc_errors/volatile/sram_correctable", "4", 1)(xml)
    code, out = selfcheck(capsys, stand_in(tmp_path, xml, compute_apps(snapshot)))
    assert code == 0, out
    assert "WARN  GPU 1 ECC corrected" in out and "errors are accruing right now" in out


def test_nvidia_smi_that_hangs_or_is_missing_fails_with_a_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hung = stand_in(tmp_path, ET.Element("nvidia_smi_log"), [], body="#!/bin/sh\nexec sleep 30\n")
    code, out = selfcheck(capsys, hung, "--smi-timeout", "0.5")
    assert code == 1
    assert "FAIL  nvidia-smi" in out and "did not finish within 0.5 s" in out
    assert "PASS  XID events" in out  # the NVML-only checks still ran
    code, out = selfcheck(capsys, str(tmp_path / "no-such-nvidia-smi"))
    assert code == 1 and "no-such-nvidia-smi not found" in out


def test_unreadable_xml_fails_with_the_parse_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = stand_in(tmp_path, ET.Element("x"), [], body="#!/bin/sh\necho '<nvidia_smi_log><gpu>'\n")
    code, out = selfcheck(capsys, broken)
    assert code == 1 and "FAIL  nvidia-smi" in out and "does not parse" in out


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver is installed")
def test_no_driver_exits_3() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "selfcheck", "--xid-seconds", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == EXIT_NO_DRIVER == 3
    assert "no NVIDIA driver" in r.stderr and "nothing to check" in r.stderr


def test_compare_on_a_recorded_a10g() -> None:
    """The recorded A10G (driver 515, older schema) against readings NVML would give for it."""
    from exporter import smi
    from exporter.gpu_readings import DeviceFacts
    from exporter.smi_compare import compare
    from exporter.snapshot import GpuState

    fixture = Path(__file__).parent.parent / "fixtures" / "nvidia-smi" / "a10g-515.105.01.xml"
    log = smi.parse_xml(fixture.read_bytes())
    t = log.gpus[0]
    labels = {"name": t.name, "pci_bus_id": t.pci_bus_id, "driver_version": "515.105.01"}
    facts = DeviceFacts(
        uuid=t.uuid,
        labels=labels,
        memory_total_bytes=23028 * MIB,
        sm_clock_max_hertz=1710e6,
        memory_clock_max_hertz=6251e6,
        power_limit_max_watts=300.0,
        pcie_link_generation_max=4,
        pcie_link_width_max=16,
    )
    reasons = {"sw_power_cap": 0, "hw_slowdown": 0, "sw_thermal": 0, "hw_thermal": 0, "hw_power_brake": 0}
    readings = {
        DeviceFacts: facts,
        Memory: Memory(used_bytes=22 * MIB, free_bytes=22569 * MIB, reserved_bytes=435 * MIB),
        Power: Power(usage_watts=25.1, limit_watts=300.0, gpu_celsius=17.0, memory_celsius=None),
        Clocks: Clocks(sm_hertz=210e6, memory_hertz=405e6, event_active=reasons),
        Ecc: Ecc(
            corrected=0,
            uncorrected=0,
            remapped_rows={"correctable": 0, "uncorrectable": 0},
            remap_pending=0,
            remap_failed=0,
        ),
        Pcie: Pcie(link_generation=1, link_width=8),
        Processes: Processes(count=0, items=()),  # Xorg is a graphics process: not counted
    }
    gpu = GpuState(index=0, uuid=t.uuid, up=True, readings=readings)
    one = Snapshot(taken_at=0.0, gpus=(gpu,))
    checks = {(c.name, c.status) for c in compare(one, one, log, None)}
    assert {c for c in checks if c[1] != "pass"} == {("memory temperature", "skip")}
    assert ("PCIe link", "pass") in checks  # gen 1 x8 of gen 4 x16, as recorded, agrees
    assert ("clock events", "pass") in checks  # GpuIdle is active, and is no throttle
    # the same readings against an older nvidia-smi that counts reserved memory as used
    old = smi.SmiLog("515.105.01", None, (dataclasses.replace(t, memory_reserved_bytes=None),))
    old = dataclasses.replace(old, gpus=(dataclasses.replace(old.gpus[0], memory_used_bytes=457 * MIB),))
    assert ("memory used", "pass") in {(c.name, c.status) for c in compare(one, one, old, None)}


def test_the_clock_event_ids_line_names_the_drivers_numbering() -> None:
    from exporter.selfcheck import clock_event_numbering

    assert "HW thermal at 252" in clock_event_numbering("580.65.06").detail
    assert "HW thermal at 270" in clock_event_numbering("590.48.01").detail
    assert clock_event_numbering("580.76.05").status == "warn"
    assert "no HW slowdown" in clock_event_numbering("535.216.03").detail


def test_gpm_under_mig_records_what_the_parent_and_each_instance_answer() -> None:
    from exporter.gpu_readings import MigActivity, MigProfiling, Profiling
    from exporter.selfcheck import gpm_under_mig

    check = gpm_under_mig(
        1,
        Profiling(sm_active_ratio=0.5),
        MigProfiling(instances=(MigActivity(gpu_instance=1, sm_active_ratio=0.25),)),
    )
    assert check.status == "pass" and "parent's samples gave SM active 0.50" in check.detail
    assert "GI 1 SM 0.25" in check.detail
    assert gpm_under_mig(1, None, None).status == "warn"
