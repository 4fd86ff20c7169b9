"""Collectors, one per source. Importing a module registers its collectors."""

from __future__ import annotations

import importlib
import pkgutil

from exporter.collectors.base import REGISTRY, Collector, Context
from exporter.config import ConfigError


def load_all() -> None:
    """Import every collector module, so each registers itself."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def build(ctx: Context) -> list[Collector]:
    """The enabled collectors; NVML ones only when NVML is there."""
    load_all()
    s = ctx.settings
    unknown = (set(s.collectors_disabled) | set(s.collectors_enabled)) - set(REGISTRY)
    if unknown:
        raise ConfigError(
            f"unknown collector(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(REGISTRY))}"
        )
    out = []
    for name, reg in sorted(REGISTRY.items()):
        enabled = (reg.default_enabled or name in s.collectors_enabled) and name not in s.collectors_disabled
        if not enabled or (reg.nvml and ctx.nvml is None):
            continue
        out.append(reg.factory(ctx))
    return out
