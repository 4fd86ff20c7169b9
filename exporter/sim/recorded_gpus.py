"""The keys of a scenario's `gpus` mapping that describe real GPUs rather than a built-in
model: a part given inline, a driver version string, and the identities and processes
of recorded GPUs (docs/scenarios.md). `smi_profile` writes them from nvidia-smi output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from functools import partial
from typing import Any, TypeVar

from exporter.sim.drivers import Driver, Part, inline_part, resolve_driver
from exporter.sim.scenario_input import number

Fail = Callable[[str, str], Exception]  # (key, what it must be) -> the error to raise
M = TypeVar("M")
_FIELD_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}
PART_KEYS = ("not_supported", "fields_not_supported")


def inline_model(raw: Mapping[str, Any], model: type[M], fail: Fail) -> tuple[M, Part]:
    """A GPU part no built-in model fits: the fields of `model` (a dataclass), and what
    the part cannot do (`not_supported` NVML functions, `fields_not_supported` field ids)."""
    values = {k: v for k, v in raw.items() if k not in PART_KEYS}
    known = {f.name: f for f in fields(model)}  # type: ignore[arg-type]
    if unknown := sorted(set(values) - set(known)):
        raise fail(f"gpus.model.{unknown[0]}", f"one of {', '.join([*known, *PART_KEYS])}")
    for name, f in known.items():
        kind = _FIELD_TYPES[str(f.type)]
        if name not in values:
            if f.default is MISSING:
                raise fail(f"gpus.model.{name}", f"given (a {kind.__name__}) for an inline model")
            continue
        v = values[name]
        if kind is float:
            values[name] = number(v, partial(fail, f"gpus.model.{name}", "a number from 0 to 1e18"))
        elif type(v) is not kind:  # and so no true/false for a count
            raise fail(f"gpus.model.{name}", f"a {kind.__name__}")
    try:
        part = inline_part(raw.get("not_supported") or (), raw.get("fields_not_supported") or ())
    except (TypeError, ValueError) as err:
        raise fail("gpus.model", str(err)) from None
    return model(**values), part


def recorded_driver(gpus: Mapping[str, Any], fail: Fail) -> Driver:
    """`driver` (a branch or a version) and `cuda`; YAML may read a version as a number."""
    spec, cuda = gpus.get("driver"), gpus.get("cuda")
    try:
        return resolve_driver(None if spec is None else str(spec), None if cuda is None else str(cuda))
    except ValueError as err:
        raise fail("gpus.driver/cuda", str(err)) from None


def identities(gpus: Mapping[str, Any], count: int, fail: Fail) -> dict[str, Any]:
    """`uuids`, `pci_bus_ids`, `processes` and `steady`, as Scenario's fields of those names."""
    out: dict[str, Any] = {}
    for key in ("uuids", "pci_bus_ids"):
        value = gpus.get(key, [])
        strings = isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not strings or (value and len(value) != count):
            raise fail(f"gpus.{key}", f"a list of {count} strings, one per GPU")
        out[key] = tuple(value)
    out["steady"] = gpus.get("steady", False)
    if not isinstance(out["steady"], bool):
        raise fail("gpus.steady", "true or false")
    try:
        out["processes"] = {
            int(g): tuple((int(p["pid"]), int(p["used_memory_bytes"])) for p in listed)
            for g, listed in (gpus.get("processes") or {}).items()
        }
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise fail("gpus.processes", "{gpu index: [{pid, used_memory_bytes}]}") from err
    if any(not 0 <= g < count for g in out["processes"]):
        raise fail("gpus.processes", f"keyed by GPU indexes below {count}")
    return out
