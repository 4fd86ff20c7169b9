"""Collectors, one per source. Importing a module registers its collectors."""

from __future__ import annotations

import importlib
import logging

from exporter.collectors.base import REGISTRY, Collector, Context

log = logging.getLogger(__name__)

NVML_MODULES = ("device", "status", "gpm", "interconnect", "ecc", "xid", "processes", "mig")
NODE_MODULES = ("engines", "allocator")


def load_all() -> None:
    for module in (*NVML_MODULES, *NODE_MODULES):
        importlib.import_module(f"exporter.collectors.{module}")


def build(ctx: Context) -> list[Collector]:
    """The enabled collectors; NVML ones only when NVML is there."""
    load_all()
    s = ctx.settings
    unknown = (set(s.collectors_disabled) | set(s.collectors_enabled)) - set(REGISTRY)
    if unknown:
        raise ValueError(
            f"unknown collector(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(REGISTRY))}"
        )
    nvml_names = {
        name for name, reg in REGISTRY.items() if reg.factory.__module__.rsplit(".", 1)[-1] in NVML_MODULES
    }
    out = []
    for name, reg in sorted(REGISTRY.items()):
        enabled = (reg.default_enabled or name in s.collectors_enabled) and name not in s.collectors_disabled
        if not enabled or (name in nvml_names and ctx.nvml is None):
            continue
        out.append(reg.factory(ctx))
    return out
