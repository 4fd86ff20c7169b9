"""nvidia-smi outputs of real GPUs, parsed into base units (fixtures: tests/fixtures/nvidia-smi)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter import smi
from exporter.smi import MIB, SmiError, SmiProcess

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"
MHZ = 1e6


def _xml(name: str) -> smi.SmiLog:
    return smi.parse_xml((FIXTURES / name).read_bytes())


def _csv(name: str) -> smi.SmiLog:
    return smi.parse_query_gpu_csv((FIXTURES / name).read_text())


def test_a100_sxm4_535_xml_schema_v12() -> None:
    log = _xml("a100-sxm4-80gb-535.54.03.xml")
    assert (log.driver_version, log.cuda_version) == ("535.54.03", "12.2")
    (g,) = log.gpus
    assert g.name == "NVIDIA A100-SXM4-80GB"
    assert g.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert g.pci_bus_id == "00000000:01:00.0"
    assert g.architecture == "Ampere" and g.mig_enabled is True
    assert g.memory_total_bytes == 81920 * MIB
    assert (g.memory_used_bytes, g.memory_free_bytes, g.memory_reserved_bytes) == (
        50 * MIB,
        80999 * MIB,
        869 * MIB,
    )
    # 535 moved power under gpu_power_readings and calls the enforced limit current_power_limit
    assert (g.power_draw_watts, g.power_limit_watts, g.power_limit_max_watts) == (67.03, 500.0, 500.0)
    assert g.power_draw_instant_watts is None
    assert (g.sm_clock_hertz, g.memory_clock_hertz) == (1275 * MHZ, 1593 * MHZ)
    assert (g.sm_clock_max_hertz, g.memory_clock_max_hertz) == (1410 * MHZ, 1593 * MHZ)
    assert (g.gpu_celsius, g.memory_celsius) == (27.0, 44.0)
    assert g.clock_events_active == frozenset()  # clocks_event_reasons, all "Not Active"
    assert (g.ecc_corrected, g.ecc_uncorrected) == (0, 0)
    # <remapped_rows>N/A</remapped_rows>
    assert g.remapped_rows_correctable is None and g.remap_pending is None
    assert (g.pcie_generation, g.pcie_generation_max, g.pcie_width, g.pcie_width_max) == (4, 4, 16, 16)
    assert g.processes == ()  # <processes />


def test_a10g_515_xml_schema_v11_idle() -> None:
    log = _xml("a10g-515.105.01.xml")
    assert (log.driver_version, log.cuda_version) == ("515.105.01", "11.7")
    (g,) = log.gpus
    assert (g.name, g.uuid, g.pci_bus_id) == (
        "NVIDIA A10G",
        "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",
        "00000000:00:1E.0",
    )
    assert g.mig_enabled is None  # current_mig N/A: the part has no MIG
    assert (g.memory_total_bytes, g.memory_used_bytes, g.memory_reserved_bytes) == (
        23028 * MIB,
        22 * MIB,
        435 * MIB,
    )
    # before 535: power_readings with enforced_power_limit
    assert (g.power_draw_watts, g.power_limit_watts, g.power_limit_max_watts) == (25.58, 300.0, 300.0)
    assert (g.sm_clock_hertz, g.memory_clock_hertz) == (210 * MHZ, 405 * MHZ)
    assert (g.sm_clock_max_hertz, g.memory_clock_max_hertz) == (1710 * MHZ, 6251 * MHZ)
    assert g.gpu_celsius == 17.0 and g.memory_celsius is None  # GDDR6: memory_temp N/A
    assert g.clock_events_active == frozenset({"gpu_idle"})  # clocks_throttle_reasons, older name
    assert (g.ecc_corrected, g.ecc_uncorrected) == (0, 0)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable) == (0, 0)
    assert (g.remap_pending, g.remap_failed) == (False, False)
    # an idle PCIe link trains down: gen 1 x8 of gen 4 x16
    assert (g.pcie_generation, g.pcie_generation_max, g.pcie_width, g.pcie_width_max) == (1, 4, 8, 16)
    assert g.processes == (
        SmiProcess(725, 22 * MIB, "/usr/lib/xorg/Xorg", "G", "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"),
    )
    assert not g.processes[0].compute


def test_t4_515_xml_graphics_and_compute_processes() -> None:
    (g,) = _xml("t4-515.105.01.xml").gpus
    assert (g.name, g.architecture) == ("Tesla T4", "Turing")
    assert (g.memory_total_bytes, g.memory_used_bytes, g.memory_free_bytes) == (
        15360 * MIB,
        1032 * MIB,
        13939 * MIB,
    )
    assert (g.power_draw_watts, g.power_limit_watts, g.power_limit_max_watts) == (26.78, 70.0, 70.0)
    assert (g.sm_clock_hertz, g.sm_clock_max_hertz, g.memory_clock_max_hertz) == (
        585 * MHZ,
        1590 * MHZ,
        5001 * MHZ,
    )
    assert g.gpu_celsius == 40.0
    assert g.remapped_rows_correctable is None  # Turing has no row remapper
    assert (g.pcie_generation, g.pcie_generation_max, g.pcie_width, g.pcie_width_max) == (3, 3, 8, 16)
    assert g.processes is not None
    assert [(p.pid, p.type, p.used_memory_bytes, p.compute) for p in g.processes] == [
        (675, "G", 22 * MIB, False),
        (5762, "C", 1005 * MIB, True),
    ]


def test_h100_query_gpu_csv_idle_and_load() -> None:
    idle = _csv("h100-80gb-hbm3-590.48.01-idle.query-gpu.csv")
    load = _csv("h100-80gb-hbm3-590.48.01-load.query-gpu.csv")
    assert idle.driver_version == load.driver_version == "590.48.01"
    (i,), (g,) = idle.gpus, load.gpus
    assert (g.name, g.pci_bus_id, g.mig_enabled) == ("NVIDIA H100 80GB HBM3", "00000000:00:09.0", False)
    assert g.uuid == "GPU-00000000-0000-0000-0000-000000000000"  # masked when recorded
    assert g.memory_total_bytes == i.memory_total_bytes == 81559 * MIB
    assert (i.memory_used_bytes, g.memory_used_bytes) == (0, 19818 * MIB)
    assert (g.memory_free_bytes, g.memory_reserved_bytes) == (61263 * MIB, 479 * MIB)
    assert (i.power_draw_watts, i.power_draw_instant_watts) == (69.85, 69.62)
    assert (g.power_draw_watts, g.power_draw_instant_watts) == (631.95, 625.68)
    assert (g.power_limit_watts, g.power_limit_max_watts) == (700.0, 700.0)
    assert (i.sm_clock_hertz, g.sm_clock_hertz, g.memory_clock_hertz) == (345 * MHZ, 1980 * MHZ, 2619 * MHZ)
    assert (g.sm_clock_max_hertz, g.memory_clock_max_hertz) == (1980 * MHZ, 2619 * MHZ)
    assert (i.gpu_celsius, i.memory_celsius, g.gpu_celsius, g.memory_celsius) == (41, 48, 59, 54)
    # clocks_event_reasons.active: 0x1 (GpuIdle) at idle, 0x0 under load
    assert (i.clock_events_active, g.clock_events_active) == (frozenset({"gpu_idle"}), frozenset())
    assert (g.ecc_corrected, g.ecc_uncorrected) == (0, 0)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable, g.remap_pending) == (0, 0, False)
    assert (g.pcie_generation, g.pcie_generation_max, g.pcie_width, g.pcie_width_max) == (5, 5, 16, 16)
    assert g.processes is None  # query-gpu lists no processes


def test_h200_and_l40s_query_gpu_csv() -> None:
    (h,) = _csv("h200-590.48.01-load.query-gpu.csv").gpus
    assert (h.name, h.memory_total_bytes, h.memory_used_bytes) == ("NVIDIA H200", 143771 * MIB, 32362 * MIB)
    assert (h.power_draw_watts, h.power_limit_watts, h.memory_celsius) == (627.40, 700.0, 40.0)
    assert (h.memory_clock_max_hertz, h.pcie_generation) == (3201 * MHZ, 5)
    (s,) = _csv("l40s-595.80-load.query-gpu.csv").gpus
    assert (s.name, s.pci_bus_id, s.mig_enabled) == ("NVIDIA L40S", "00000000:01:00.0", None)
    assert (s.memory_total_bytes, s.memory_used_bytes, s.memory_reserved_bytes) == (
        46068 * MIB,
        1235 * MIB,
        609 * MIB,
    )
    assert (s.power_draw_watts, s.power_draw_instant_watts, s.power_limit_max_watts) == (110.23, 112.38, 350)
    assert (s.sm_clock_hertz, s.memory_clock_hertz) == (2520 * MHZ, 9001 * MHZ)
    assert s.gpu_celsius == 54.0 and s.memory_celsius is None  # temperature.memory N/A on GDDR6
    assert (s.pcie_generation_max, s.pcie_width) == (4, 16)


def test_compute_apps_csv_with_header() -> None:
    procs = smi.parse_compute_apps_csv(
        (FIXTURES / "h100-80gb-hbm3-590.48.01-load.compute-apps.csv").read_text()
    )
    assert [(p.pid, p.name, p.used_memory_bytes) for p in procs] == [
        (11327, "/root/tools/memhog", 2566 * MIB),
        (11328, "/root/tools/memhog", 1542 * MIB),
        (11345, "./gpu_burn", 15690 * MIB),
    ]
    assert {p.gpu_uuid for p in procs} == {"GPU-00000000-0000-0000-0000-000000000000"}
    l40s = smi.parse_compute_apps_csv((FIXTURES / "l40s-595.80-load.compute-apps.csv").read_text())
    assert [(p.pid, p.used_memory_bytes) for p in l40s] == [(20037, 538 * MIB), (20038, 681 * MIB)]


def test_compute_apps_noheader_nounits_and_not_available_memory() -> None:
    text = "GPU-a, 4242, 15690\nGPU-b, 77, [N/A]\n"
    procs = smi.parse_compute_apps_csv(text, smi.COMPUTE_APPS_FIELDS)
    assert procs == (SmiProcess(4242, 15690 * MIB, gpu_uuid="GPU-a"), SmiProcess(77, None, gpu_uuid="GPU-b"))
    assert smi.parse_compute_apps_csv("", smi.COMPUTE_APPS_FIELDS) == ()


def test_query_gpu_nounits_takes_units_from_the_header() -> None:
    text = (
        "uuid, memory.total [MiB], power.draw [W], clocks.sm [MHz], temperature.gpu\n"
        "GPU-x, 81559, 69.85, 345, [Not Supported]\n"
    )
    (g,) = smi.parse_query_gpu_csv(text).gpus
    assert (g.memory_total_bytes, g.power_draw_watts, g.sm_clock_hertz) == (81559 * MIB, 69.85, 345 * MHZ)
    assert g.gpu_celsius is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<nvidia_smi_log><gpu>", "does not parse"),
        ("<html></html>", "root element is <html>"),
        (
            "<nvidia_smi_log><gpu id='00000000:01:00.0'><fb_memory_usage><total>lots</total>"
            "</fb_memory_usage></gpu></nvidia_smi_log>",
            "GPU 00000000:01:00.0: expected a number, got 'lots'",
        ),
        (
            "<nvidia_smi_log><gpu><clocks><sm_clock>1410 furlongs</sm_clock></clocks></gpu></nvidia_smi_log>",
            "unknown unit 'furlongs'",
        ),
    ],
)
def test_bad_xml_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(SmiError, match=message):
        smi.parse_xml(text)


def test_bad_csv_is_a_clear_error() -> None:
    with pytest.raises(SmiError, match="row 1 has 2 values for 3 fields"):
        smi.parse_compute_apps_csv("GPU-a, 1\n", smi.COMPUTE_APPS_FIELDS)
    with pytest.raises(SmiError, match="lacks the uuid field"):
        smi.parse_query_gpu_csv("name, memory.total [MiB]\nNVIDIA L4, 23034 MiB\n")
    with pytest.raises(SmiError, match="no header"):
        smi.parse_query_gpu_csv("")


def test_old_ecc_tables_and_split_sram_counts() -> None:
    old = (
        "<nvidia_smi_log><gpu><uuid>GPU-o</uuid><ecc_errors><volatile>"
        "<single_bit><device_memory>3</device_memory><total>5</total></single_bit>"
        "<double_bit><device_memory>0</device_memory><total>1</total></double_bit>"
        "</volatile></ecc_errors></gpu></nvidia_smi_log>"
    )
    (g,) = smi.parse_xml(old).gpus
    assert (g.ecc_corrected, g.ecc_uncorrected) == (5, 1)
    new = (
        "<nvidia_smi_log><gpu><uuid>GPU-n</uuid><ecc_errors><volatile>"
        "<sram_correctable>2</sram_correctable><sram_uncorrectable_parity>1</sram_uncorrectable_parity>"
        "<sram_uncorrectable_secded>2</sram_uncorrectable_secded><dram_correctable>4</dram_correctable>"
        "<dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors></gpu></nvidia_smi_log>"
    )
    (g,) = smi.parse_xml(new).gpus
    assert (g.ecc_corrected, g.ecc_uncorrected) == (6, 3)
    (none,) = smi.parse_xml("<nvidia_smi_log><gpu><uuid>GPU-e</uuid></gpu></nvidia_smi_log>").gpus
    assert none.ecc_corrected is None and none.memory_total_bytes is None and none.processes is None
