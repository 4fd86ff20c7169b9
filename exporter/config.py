"""Settings: one declaration, read from flags, the environment (LLMGPU_*) and a YAML file.

Each setting is a field of `Settings` with its type, default, bounds and help; the
command line (`exporter.cli`) makes a flag of every one of them, the environment names
it `LLMGPU_<NAME>`, the YAML file by its name. Flags win over the environment, which
wins over the file. pydantic-settings reads and validates all three; a wrong value or an
unknown key is a `ConfigError` that names the key and where it came from.
"""

from __future__ import annotations

import contextvars
import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

DEFAULT_PORT = 9445  # dcgm-exporter keeps 9400; both can run on one node
ENV_PREFIX = "LLMGPU_"


class ConfigError(ValueError):
    """A setting of the wrong type, out of its range, or an unknown key; the message names it."""


def setting(
    default: Any, help: str, *, flag: str | None = None, metavar: str | None = None, **bounds: Any
) -> Any:
    """A field with its help text and its range (`ge`/`gt` and `le` for a number,
    `min_length`/`max_length` for text or a list); `flag` and `metavar` shape its
    command-line option (default: `--name-with-dashes`)."""
    extra: dict[str, Any] = {k: v for k, v in (("flag", flag), ("metavar", metavar)) if v is not None}
    return Field(default, description=help, json_schema_extra=extra or None, **bounds)


PATH_MAX = 4096  # Linux's PATH_MAX
URL_MAX = 2048
NAMES_MAX = 256  # entries of one list setting
# Pod labels copied onto one series at most: with the most labels a series of the exporter
# has of its own (docs/kubernetes.md), within the 30 that Mimir takes by default.
POD_LABELS_MAX = 16
# One entry of a list setting: a name or a URL.
Name = Annotated[str, Field(min_length=1, max_length=URL_MAX)]
Names = Annotated[tuple[Name, ...], NoDecode]  # YAML list, repeated flag, or "a,b" in the environment


def path(default: str | None, help: str, **kw: Any) -> Any:
    """A file or directory setting."""
    return setting(default, help, min_length=1, max_length=PATH_MAX, **kw)


class Settings(BaseSettings):
    """Everything the exporter can be told. Construct it directly for fixed values (tests,
    the simulator); `load()` reads flags, environment and file."""

    # Numbers must be finite: an infinite interval or timeout passes a `>= x` check and
    # then fails deep inside a running thread.
    model_config = SettingsConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    # ---- serving -------------------------------------------------------------------------
    listen: str = setting(
        f"0.0.0.0:{DEFAULT_PORT}", "HOST:PORT to serve on", metavar="HOST:PORT", min_length=1, max_length=300
    )
    # Past Prometheus' five-minute lookback a scrape would find gaps between snapshots.
    interval: float = setting(
        1.0, "seconds between snapshots; slow collectors run every 5-60 intervals", ge=0.05, le=300
    )
    web_config_file: str | None = path(
        None, "TLS, client certificates and basic auth, in the format Prometheus exporters share"
    )
    # Each one holds a file descriptor and its buffers.
    max_connections: int = setting(
        1024, "open HTTP connections at most; the longest idle makes room", ge=1, le=100_000
    )
    idle_timeout: float = setting(
        5.0, "seconds a connection may wait before or between requests", ge=0.1, le=3600
    )
    header_timeout: float = setting(
        10.0, "seconds from a request's first byte to its last header (and the TLS handshake)", ge=0.1, le=600
    )
    write_timeout: float = setting(
        30.0, "seconds from a request to the last byte of its response", ge=0.1, le=3600
    )
    log_level: Literal["debug", "info", "warning", "error"] = setting("info", "debug, info, warning or error")
    # ---- simulation ----------------------------------------------------------------------
    simulate: str | None = setting(
        None,
        "run on simulated GPUs and engines: a built-in scenario",
        metavar="NAME",
        min_length=1,
        max_length=100,
    )
    scenario_file: str | None = path(None, "run on simulated GPUs and engines: a scenario file")
    # At 10 a ten-minute story plays in a minute, and a finding that holds for two minutes
    # shows within 12 s of its condition. At 1000 a second of the story is a millisecond.
    speed: float = setting(10.0, "scenario seconds per wall second (1 plays in real time)", gt=0, le=1000)
    # ---- collectors and exposition -------------------------------------------------------
    collectors_disabled: Names = setting(
        (), "switch a collector off (repeatable)", flag="--no-collector", metavar="NAME", max_length=NAMES_MAX
    )
    collectors_enabled: Names = setting(
        (),
        "switch on a collector that is off by default (repeatable)",
        flag="--collector",
        metavar="NAME",
        max_length=NAMES_MAX,
    )
    metric_profile: Literal["default", "shared", "full"] = setting(
        "default",
        "default (what a fleet stores), shared (adds each process' and pod's part of shared GPUs) "
        "or full (everything: per-link and other detail)",
    )
    metrics_enabled: Names = setting(
        (),
        "expose a metric family the profile leaves out (repeatable)",
        flag="--metric",
        metavar="NAME",
        max_length=NAMES_MAX,
    )
    metrics_disabled: Names = setting(
        (), "leave a metric family out (repeatable)", flag="--no-metric", metavar="NAME", max_length=NAMES_MAX
    )
    # ---- engines -------------------------------------------------------------------------
    engines: Names = setting(
        (),
        "an engine's /metrics URL, optionally TYPE=URL (repeatable)",
        flag="--engine",
        metavar="URL",
        max_length=NAMES_MAX,
    )
    discover_processes: bool = setting(True, "find vLLM/SGLang/TGI servers on this host")
    discover_kubernetes: bool = setting(False, "scrape annotated engine pods on this node (NODE_NAME)")
    # A Kubernetes annotation key: a 253-character prefix, '/', a 63-character name.
    engine_annotation: str = setting(
        "llm-gpu-exporter.io/scrape", "pod annotation that marks an engine", min_length=1, max_length=317
    )
    engine_interval: float = setting(5.0, "seconds between scrapes of one engine target", ge=0.1, le=3600)
    engine_timeout: float = setting(3.0, "seconds one engine scrape may take", ge=0.1, le=300)
    engine_max_bytes: int = setting(
        8 * 1024 * 1024, "bytes of one engine page at most", ge=1024, le=256 * 1024 * 1024
    )
    engine_max_series: int = setting(20000, "samples on one engine page at most", ge=1, le=1_000_000)
    engine_max_labels: int = setting(64, "labels on one engine series at most", ge=1, le=1000)
    engine_max_label_length: int = setting(
        2048, "characters in one engine label value at most", ge=1, le=65536
    )
    engine_max_models: int = setting(
        16, "models on one engine page at most; the rest are dropped", ge=1, le=1000
    )
    # ---- allocator probe, attribution, diagnosis ---------------------------------------
    probe_dir: str = path("/run/llm-gpu-exporter/probes", "directory of the allocator probe files")
    probe_max_age: float = setting(120.0, "seconds after which a probe file is stale", ge=1, le=86400)
    kubelet_socket: str | None = path(None, "kubelet pod-resources socket: namespace/pod/container labels")
    process_owners: bool = setting(
        False, "name each GPU process' pod and container (needs hostPID, node_name, the API server)"
    )
    pod_labels: str | None = setting(
        None,
        "regular expression on pod label keys: the labels it matches are copied onto their "
        "GPUs' and processes' series",
        metavar="REGEX",
        min_length=1,
        max_length=1024,
    )
    pod_labels_max: int = setting(
        POD_LABELS_MAX,
        "pod labels copied onto a series at most (the rest are left out)",
        ge=0,
        le=POD_LABELS_MAX,
    )
    node_name: str | None = setting(
        None, "this node's name in Kubernetes (default: NODE_NAME)", min_length=1, max_length=253
    )
    # At least the longest window a rule looks back over (XID, ECC, recovery: 600 s); at
    # most six hours: about 2,300 frames, 135 MB at 72 GPUs.
    history_seconds: float = setting(900.0, "seconds of history the diagnosis keeps", ge=600, le=21600)
    # ---- dcgm-exporter -----------------------------------------------------------------
    dcgm_exporter: str | None = setting(
        None,
        "a co-located dcgm-exporter's /metrics for GPUs without GPM, or 'off' "
        "(default: this node's pod, else 127.0.0.1:9400)",
        metavar="URL",
        min_length=1,
        max_length=URL_MAX,
    )
    # three of dcgm-exporter's default 30 s sampling windows
    dcgm_exporter_max_age: float = setting(90.0, "seconds a dcgm-exporter value is used", ge=1, le=3600)
    # ---- cost --------------------------------------------------------------------------
    gpu_hour_price: float | None = setting(
        None,
        "price of one GPU-hour in any currency, for cost per million tokens (unset: no cost)",
        ge=0,
        le=1_000_000,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _plain(cls, value: Any, info: ValidationInfo) -> Any:
        """No true/false for a number (YAML's `true` would be 1), no control characters in
        text (a NUL byte fails every later open())."""
        if isinstance(value, bool) and info.field_name in NUMBERS:
            raise ValueError("a number, not true or false")
        texts = value if isinstance(value, tuple | list) else (value,)
        if any(isinstance(t, str) and _CONTROL.search(t) for t in texts):
            raise ValueError("text without control characters")
        return value

    @field_validator("pod_labels")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"a regular expression ({err})") from None
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator(
        "collectors_disabled",
        "collectors_enabled",
        "metrics_enabled",
        "metrics_disabled",
        "engines",
        mode="before",
    )
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment: comma-separated
            return tuple(v for v in value.split(",") if v)
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _whole(self) -> Settings:
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"listen: must be HOST:PORT, got {self.listen!r}")
        if self.simulate is not None and self.scenario_file is not None:
            raise ValueError("simulate: give either simulate or scenario_file, not both")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        given = _SOURCES.get()
        if given is None:  # constructed directly: the values given, nothing else
            return (init_settings,)
        return (init_settings, _Environment(settings_cls, given.env), _File(settings_cls, given.file))

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def simulated(self) -> bool:
        return self.simulate is not None or self.scenario_file is not None


FIELDS: dict[str, Any] = {name: f.annotation for name, f in Settings.model_fields.items()}
NUMBERS = frozenset(n for n, a in FIELDS.items() if {int, float} & {a, *getattr(a, "__args__", ())})
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def bounds(f: FieldInfo) -> dict[str, Any]:
    """A field's `ge`, `gt`, `le`, `lt`, `min_length`, `max_length`, where it has them."""
    out: dict[str, Any] = {}
    for m in f.metadata:  # annotated_types' Ge, Le, MaxLen, ...
        for key in ("ge", "gt", "le", "lt", "min_length", "max_length"):
            if getattr(m, key, None) is not None:
                out[key] = getattr(m, key)
    return out


def _num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def range_text(name: str) -> str:
    """A setting's valid values in words, for the settings table and error messages."""
    f = Settings.model_fields[name]
    b = bounds(f)
    hint = f.annotation
    args = getattr(hint, "__args__", ())
    if args and all(isinstance(a, str) for a in args):  # a Literal
        return ", ".join(args)
    if hint is bool:
        return "true or false"
    if "ge" in b:
        return f"from {_num(b['ge'])} to {_num(b['le'])}"
    if "gt" in b:
        return f"above {_num(b['gt'])}, at most {_num(b['le'])}"
    if getattr(hint, "__origin__", None) is tuple:
        return f"at most {b['max_length']} entries"
    return f"{b.get('min_length', 0)} to {_num(b['max_length'])} characters"


# ---- sources -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Given:
    env: Mapping[str, str]
    file: Mapping[str, Any]


_SOURCES: contextvars.ContextVar[_Given | None] = contextvars.ContextVar("settings_sources", default=None)


class _Environment(EnvSettingsSource):
    """LLMGPU_* from a given mapping (the process environment, or a test's)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._given = dict(env)
        super().__init__(settings_cls, env_prefix=ENV_PREFIX, case_sensitive=False)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._given, False, False, None)


class _File(PydanticBaseSettingsSource):
    """The YAML file's mapping, already read."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self._values = dict(values)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _read_file(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"config file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: must be a mapping of setting -> value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load(
    flags: Mapping[str, Any], config_file: str | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Flags (None counts as not given) over the environment over the YAML file."""
    env = dict(os.environ) if env is None else dict(env)
    path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    file = _read_file(path) if path else {}
    given = {k: v for k, v in flags.items() if v is not None}
    if "node_name" not in given and f"{ENV_PREFIX}NODE_NAME" not in env and env.get("NODE_NAME"):
        given["node_name"] = env["NODE_NAME"]  # the downward API's name, below LLMGPU_NODE_NAME
    token = _SOURCES.set(_Given(env, file))
    try:
        return Settings(**given)
    except ValidationError as err:
        raise ConfigError(_explain(err, given, env, file, path)) from None
    finally:
        _SOURCES.reset(token)


EXPECTED = {
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "a boolean",
    "bool_type": "a boolean",
    "string_type": "a string",
    "tuple_type": "a list of strings",
}


def _explain(
    err: ValidationError,
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    file: Mapping[str, Any],
    path: str | None,
) -> str:
    """The first error, with the key as its source spells it, on one line."""
    e = err.errors()[0]
    key = str(e["loc"][0]) if e["loc"] else ""
    if e["type"] == "extra_forbidden":
        shown = _shown(key)
        return f"config file {path}: unknown setting {shown}" if key in file else f"unknown setting {shown}"
    if not key:  # a whole-model check: its message starts with the key
        key, _, message = str(e["msg"]).removeprefix("Value error, ").partition(": ")
        return f"setting '{key}' {message}"
    if key in flags:
        where = f"'{flag_of(key)}'"
    elif f"{ENV_PREFIX}{key.upper()}" in {k.upper() for k in env}:
        where = f"'{ENV_PREFIX}{key.upper()}'"
    elif key in file:
        where = f"config file {path}: '{key}'"
    else:
        where = f"setting '{key}'"
    return f"{where} {_must(e, key)}, got {_shown(e.get('input'))}"


def flag_of(name: str) -> str:
    """The command-line option of a setting."""
    extra = Settings.model_fields[name].json_schema_extra
    flag = extra.get("flag") if isinstance(extra, dict) else None
    return str(flag or "--" + name.replace("_", "-"))


SHOWN_MAX = 80  # characters of a rejected value the message repeats


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_MAX else f"{text[: SHOWN_MAX - 20]}... ({len(text)} characters)"


RANGE_ERRORS = {
    "greater_than",
    "greater_than_equal",
    "less_than",
    "less_than_equal",
    "string_too_short",
    "string_too_long",
    "too_long",
}


def _must(e: Any, key: str) -> str:
    ctx = e.get("ctx") or {}
    if len(e["loc"]) > 1:  # one entry of a list
        if e["type"] in ("string_too_short", "string_too_long"):
            return f"entries must be 1 to {URL_MAX:,} characters"
        return f"entries must be {EXPECTED.get(e['type'], 'strings')}"
    if e["type"] in EXPECTED:
        return f"must be {EXPECTED[e['type']]}"
    if e["type"] in RANGE_ERRORS:
        return f"must be {range_text(key)}"
    if e["type"] == "value_error":  # a check of ours: its message says what the value must be
        return f"must be {str(e['msg']).removeprefix('Value error, ')}"
    if e["type"] == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    return f"is wrong: {' '.join(str(e['msg']).split())}"


# LLMGPU_* variables that are no setting: the file (`load`), the password of `diagnose
# --prometheus` (exporter.cli) and the allocator probe's, read inside the engine's process
# (exporter.probe.plugin) and so often set beside the exporter's in one pod spec.
OTHER_VARIABLES = ("CONFIG", "PROMETHEUS_PASSWORD", "PROBE_INTERVAL", "PROBE_ENGINE_PORT")


def unknown_variables(env: Mapping[str, str] | None = None) -> list[str]:
    """A line for each LLMGPU_* variable that names nothing the exporter reads, with the
    closest name it knows: an operator's typo is seen, and nothing stops on it."""
    env = dict(os.environ) if env is None else env
    known = [n.upper() for n in (*Settings.model_fields, *OTHER_VARIABLES)]
    out = []
    for var in sorted(env):
        name = var.upper().removeprefix(ENV_PREFIX)
        if not var.upper().startswith(ENV_PREFIX) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"; did you mean {ENV_PREFIX}{close[0]}?" if close else ""
        out.append(f"environment variable {_shown(var)} is no setting and is ignored{hint}")
    return out


def replace(s: Settings, **changes: Any) -> Settings:
    """A copy with some settings changed (values the program made, not user input)."""
    return s.model_copy(update=changes)


__all__ = [
    "DEFAULT_PORT",
    "FIELDS",
    "NUMBERS",
    "ConfigError",
    "Settings",
    "bounds",
    "flag_of",
    "load",
    "range_text",
    "replace",
    "unknown_variables",
]
