"""The fake NVML library is made of its areas' registrations: each C symbol and field id
answered once, by the module of its area, and hidden where a driver branch lacks it."""

from __future__ import annotations

import pynvml
import pytest

from exporter.sim import fakenvml
from exporter.sim.drivers import DRIVERS
from exporter.sim.fakenvml import abi, library
from exporter.sim.scenario import Timeline, parse


def test_every_area_registers_its_symbols_and_the_library_exports_them_all() -> None:
    by_area = {sym.fn.__module__.rsplit(".", 1)[-1] for sym in abi.SYMBOLS.values()}
    assert by_area == {m.__name__.rsplit(".", 1)[-1] for m in library.AREAS} | {"library"}
    assert {n for n in vars(fakenvml.FakeLibrary) if n.startswith("nvml")} == set(abi.SYMBOLS)
    assert abi.SYMBOLS["nvmlDeviceGetPowerUsage"].fn.__module__ == "exporter.sim.fakenvml.power"
    assert abi.FIELDS[pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER].__module__ == "exporter.sim.fakenvml.pcie"


def test_a_symbol_or_field_registered_twice_fails_naming_it() -> None:
    with pytest.raises(ValueError, match=r"nvmlDeviceGetPowerUsage is registered twice.*power"):
        abi.symbol("nvmlDeviceGetPowerUsage")(lambda lib, h, ref: abi.OK)
    with pytest.raises(ValueError, match=r"field id 94 is registered twice.*pcie"):
        abi.field(pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER)(lambda lib, g, fid, scope: 0)


def test_a_symbol_the_branch_lacks_is_function_not_found_and_the_rest_answer() -> None:
    r470 = DRIVERS["R470"]
    lib = fakenvml.install(
        Timeline(parse({"gpus": {"count": 1, "driver": "R470"}, "phases": [{"duration": 10}]}))
    )
    try:
        assert type(lib).__dict__.keys() >= r470.missing  # hidden on the class, no lookup hook
        assert "__getattr__" not in vars(type(lib)) and "__getattribute__" not in vars(type(lib))
        for name in r470.missing:
            with pytest.raises(AttributeError):
                getattr(lib, name)
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert pynvml.nvmlDeviceGetMemoryInfo(h).total == 80 * 1024**3
    finally:
        fakenvml.uninstall()


def test_an_error_code_nvml_has_no_name_for_reads_as_the_library_says() -> None:
    # pynvml sets restype on nvmlErrorString's entry point and asks it for codes it has
    # no text of its own for
    fakenvml.install(Timeline(parse({"gpus": {"count": 1}, "phases": [{"duration": 10}]})))
    try:
        assert str(pynvml.NVMLError(12345)) == "Unknown Error"
        assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GpuIsLost"
    finally:
        fakenvml.uninstall()
