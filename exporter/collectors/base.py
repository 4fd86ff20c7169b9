"""The collector contract, and the registry that names collectors and their defaults."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from exporter.config import Settings
    from exporter.nvml import Nvml


@dataclass(frozen=True)
class Output:
    """What one run of a collector found.

    `gpus` maps a GPU index to its readings; `gpu_errors` names the error that kept a
    GPU from being read (that GPU is then reported down); `node` holds readings that
    belong to no single GPU (engines, allocator probes). `errors` counts this run's
    failures by name; a run with none is a success.
    """

    gpus: Mapping[int, tuple[object, ...]] = field(default_factory=dict)
    node: tuple[object, ...] = ()
    gpu_errors: Mapping[int, str] = field(default_factory=dict)
    errors: Mapping[str, int] = field(default_factory=dict)
    unsupported: Mapping[int, tuple[str, ...]] = field(default_factory=dict)  # gpu -> families


class Collector(Protocol):
    name: str
    interval_s: float

    def collect(self) -> Output: ...


class Startable(Protocol):
    """Collectors with a thread of their own (XID events) also start and stop."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class Context:
    """What a collector factory may use."""

    settings: Settings
    nvml: Nvml | None
    # Wall time, or scenario time mapped onto the epoch when simulating: rates and
    # windows must use this clock so accelerated scenarios stay consistent.
    clock: Callable[[], float] = time.time


Factory = Callable[[Context], Collector]


@dataclass(frozen=True)
class Registration:
    name: str
    factory: Factory
    default_enabled: bool
    help: str


REGISTRY: dict[str, Registration] = {}


def register(name: str, help: str, *, default: bool = True) -> Callable[[Factory], Factory]:
    """Decorator: `@register("memory", "...")` on a factory taking a Context."""

    def wrap(factory: Factory) -> Factory:
        REGISTRY[name] = Registration(name, factory, default, help)
        return factory

    return wrap
