"""A fake NVML library that stands where libnvidia-ml.so would, under pynvml.

`install(timeline)` puts a `FakeLibrary` in `pynvml.nvmlLib`: pynvml then calls its
functions with the same ctypes arguments it passes to the real library, and they fill
the same out-parameters and return the same status codes. Everything above pynvml —
the exporter's NVML layer and collectors — runs unchanged. Values come from the
scenario timeline; faults (errors, hangs, lost GPUs, XID events) from its fault list.
How it differs by driver branch and part (missing symbols, refused fields, struct sizes,
NotSupported functions) comes from the scenario's profile (exporter/sim/drivers.py).

One module per NVML area answers that area's C functions, named like the collector that
reads them: `device` (library init, versions, handles, identity, NUMA), `utilization`,
`memory`, `clocks` (clocks and clock-event reasons), `power` (draw, limits, energy,
temperatures), `pcie`, `nvlink`, `ecc`, `gpm`, `processes`, `events` (XIDs) and `mig`.
`abi` holds what they share (status codes, handles, out-parameters, the symbol table);
`library` makes the library of them (faults, quirks, hidden symbols, CPU accounting).

To answer a C function, register it in its area (pcie.py has this one); pynvml finds it
by that name:

    @symbol("nvmlDeviceGetCurrPcieLinkWidth")
    def link_width(lib: Library, h: Any, ref: Any) -> int:
        trained = round(lib.t.gpu(lib.gpu_of(h), "pcie_link_width"))
        out(ref).value = trained or lib.model.pcie_width
        return OK

It gets the library and the C arguments (handles, by-value numbers: `val(x)`, byref()
out-parameters: `out(ref)`) and returns an NVML status. A function of a GPU handle gets
the scenario's faults and the part's NotSupported answer before it runs; a symbol a
driver branch lacks goes into that branch's `Driver.missing` (drivers.py), nowhere here.
To answer a field id of nvmlDeviceGetFieldValues, register it in its area too:

    @field(FI_PCIE_REPLAY_COUNTER)
    def replays(lib: Library, g: int, fid: int, scope: int) -> float | None:
        return lib.t.gpu_integral(g, "pcie_replay_rate")

None means this GPU does not support it; an id the driver does not know yet goes into
`Driver.unknown_fields`. A symbol or field id registered twice fails at import. State an
area keeps between calls is a class of that area, reached with `lib.state(TheClass)`. A
value that moves over time is a timeline key (exporter/sim/scenario.py GPU_KEYS), read
with `lib.t.gpu(g, key)`, `lib.v(g, key)` (with the wobble) or `lib.t.gpu_integral(g,
key)` (the counter of a rate). A new area module joins `AREAS` in library.py.
"""

from __future__ import annotations

from exporter.sim.fakenvml.library import FakeLibrary, install, installed, uninstall

__all__ = ["FakeLibrary", "install", "installed", "uninstall"]
