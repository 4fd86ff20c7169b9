"""Settings from flags, environment (LLMGPU_*) and a YAML file, in that order of precedence."""

from __future__ import annotations

import dataclasses
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

DEFAULT_PORT = 9445  # dcgm-exporter keeps 9400; both can run on one node


class ConfigError(ValueError):
    """A setting of the wrong type or an unknown key; the message names it."""


@dataclass(frozen=True)
class Settings:
    listen: str = f"0.0.0.0:{DEFAULT_PORT}"
    interval: float = 1.0  # seconds between snapshots; fast collectors follow it
    simulate: str | None = None  # built-in scenario name
    scenario_file: str | None = None
    # Scenario seconds per wall second: at 10 a ten-minute story plays in a minute, and a
    # finding that holds for two minutes shows within 12 s of its condition.
    speed: float = 10.0
    web_config_file: str | None = None
    # HTTP server limits: what one client, or many, can hold of the server
    max_connections: int = 1024  # open connections; the oldest idle one makes room
    idle_timeout: float = 5.0  # s a connection may wait before (or between) requests
    header_timeout: float = 10.0  # s from a request's first byte to its last header
    write_timeout: float = 30.0  # s from a request to the last byte of its response
    log_level: str = "info"
    collectors_disabled: tuple[str, ...] = ()
    collectors_enabled: tuple[str, ...] = ()  # those off by default, switched on
    # engines
    engines: tuple[str, ...] = ()  # URLs of /metrics, optionally "type=url"
    discover_processes: bool = True
    discover_kubernetes: bool = False
    engine_annotation: str = "llm-gpu-exporter.io/scrape"
    engine_interval: float = 5.0
    engine_timeout: float = 3.0
    engine_max_bytes: int = 8 * 1024 * 1024
    engine_max_series: int = 20000
    engine_max_labels: int = 64  # labels on one series
    engine_max_label_length: int = 2048  # characters in one label value
    # allocator probe and attribution
    probe_dir: str = "/run/llm-gpu-exporter/probes"
    probe_max_age: float = 120.0
    kubelet_socket: str | None = None  # pod-resources socket; None = no pod attribution
    node_name: str | None = None
    history_seconds: float = 900.0  # diagnosis ring buffer span
    # What one GPU costs per hour, in any currency (cost per million tokens is in the same);
    # None: no cost figures
    gpu_hour_price: float | None = None

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def simulated(self) -> bool:
        return self.simulate is not None or self.scenario_file is not None


_HINTS = get_type_hints(Settings)
FIELDS = {f.name: _HINTS[f.name] for f in dataclasses.fields(Settings)}


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """Convert a YAML or environment value to the field's type, or fail naming the key."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(key, value, args[0])
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, list | tuple):
            raise ConfigError(f"setting '{key}' must be a list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(f"setting '{key}' must be a boolean, got {value!r}")
    if hint in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"setting '{key}' must be a number, got {value!r}")
        try:
            number = hint(value)
        except (TypeError, ValueError):
            raise ConfigError(f"setting '{key}' must be a {hint.__name__}, got {value!r}") from None
        if number < 0:
            raise ConfigError(f"setting '{key}' must not be negative, got {value!r}")
        return number
    if hint is str:
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(f"setting '{key}' must be a string, got {value!r}")
        return str(value)
    raise ConfigError(f"setting '{key}' has an unsupported type")  # pragma: no cover


def load(
    flags: dict[str, Any], config_file: str | None = None, env: dict[str, str] | None = None
) -> Settings:
    """Merge the three sources; flags set to None count as not given."""
    env = dict(os.environ) if env is None else env
    merged: dict[str, Any] = {}
    path = config_file or env.get("LLMGPU_CONFIG")
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"config file {path}: {err}") from err
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path}: must be a mapping of setting -> value")
        for key, value in data.items():
            key = str(key).replace("-", "_")
            if key not in FIELDS:
                raise ConfigError(f"config file {path}: unknown setting '{key}'")
            merged[key] = _coerce(key, value, FIELDS[key])
    for key, hint in FIELDS.items():
        raw = env.get(f"LLMGPU_{key.upper()}")
        if raw is not None:
            merged[key] = _coerce(f"LLMGPU_{key.upper()}", raw, hint)
    if "node_name" not in merged and env.get("NODE_NAME"):
        merged["node_name"] = env["NODE_NAME"]
    for key, value in flags.items():
        if value is not None and key in FIELDS:
            merged[key] = _coerce(f"--{key.replace('_', '-')}", value, FIELDS[key])
    settings = Settings(**merged)
    validate(settings)
    return settings


def validate(s: Settings) -> None:
    if ":" not in s.listen or not s.listen.rsplit(":", 1)[1].isdigit():
        raise ConfigError(f"setting 'listen' must be HOST:PORT, got {s.listen!r}")
    if s.interval < 0.05:
        raise ConfigError(f"setting 'interval' must be at least 0.05 s, got {s.interval}")
    if s.speed <= 0:
        raise ConfigError(f"setting 'speed' must be positive, got {s.speed}")
    if s.max_connections < 1:
        raise ConfigError(f"setting 'max_connections' must be at least 1, got {s.max_connections}")
    for key in ("idle_timeout", "header_timeout", "write_timeout"):
        if getattr(s, key) <= 0:
            raise ConfigError(f"setting '{key}' must be positive, got {getattr(s, key)}")
    if s.engine_max_labels < 1 or s.engine_max_label_length < 1:
        raise ConfigError("settings 'engine_max_labels' and 'engine_max_label_length' must be at least 1")
    if s.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"setting 'log_level' must be debug, info, warning or error, got {s.log_level!r}")


def replace(s: Settings, **changes: Any) -> Settings:
    return dataclasses.replace(s, **changes)


__all__ = ["DEFAULT_PORT", "ConfigError", "Settings", "load", "replace"]
