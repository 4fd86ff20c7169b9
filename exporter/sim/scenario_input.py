"""What a scenario file may hold: UTF-8 YAML of a sane size, every number finite and
within its range.

A scenario drives threads that run for hours: a NaN duration, an infinite rate or a
hang of 1e308 seconds would pass a `> 0` check and fail later, inside the simulator, as
a traceback in a running process. The file is checked whole first (every number finite
and of a sane size, wherever it is), then each key against its own range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

FILE_MAX = 16 * 1024 * 1024  # bytes: a recorded scenario is a few KiB

MAGNITUDE_MAX = 1e18  # no quantity a scenario describes comes near it (FLOP/s per GPU: ~1e15)
SECONDS_MAX = 1e7  # a phase, a ramp, a fault's time: about four months of scenario time
INFINITE_KEYS = ("until",)  # a fault that never ends may say so

# Ranges of the per-GPU and per-engine quantities a phase sets (GPU_KEYS, ENGINE_KEYS):
# ratios and switches from 0 to 1, temperatures in degrees Celsius, the rest rates,
# levels, sizes and seconds from 0 to MAGNITUDE_MAX.
# GPU keys only some parts and drivers can report: a scenario that sets one where the
# node cannot provide it is refused, instead of the value silently going nowhere.
PROFILING_KEYS = (
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp16_active",
    "fp32_active",
    "fp64_active",
)
RATIO_KEYS = frozenset(
    {
        "util",
        "mem_busy",
        *PROFILING_KEYS,
        "memory_used_ratio",
        "sm_clock_ratio",
        "mem_clock_ratio",
        "throttle_power_cap",
        "throttle_sw_thermal",
        "throttle_hw_thermal",
        "throttle_hw_slowdown",
        "throttle_power_brake",
        "remap_pending",
        "remap_failed",
        "kv_usage",
        "prefix_hit_ratio",
        "spec_accept_ratio",
        "error_ratio",
    }
)
RANGES: dict[str, tuple[float, float]] = {
    "temp_c": (-50.0, 200.0),
    "mem_temp_c": (-50.0, 200.0),
    "power_ratio": (0.0, 2.0),  # of the enforced limit: a draw may spike past it
    "pcie_link_gen": (0.0, 6.0),  # 0: the part's maximum
    "pcie_link_width": (0.0, 32.0),
    "itl_jitter": (1.0, 1000.0),  # p99 over p50: at least 1; its log-normal spread stays finite
    "api_cpu": (0.0, 1024.0),  # cores
    "gpm_nan": (0.0, 1.0),
    "nvlink_links_sleeping": (0.0, 18.0),  # NVML_NVLINK_MAX_LINKS
    "nvlink_links_inactive": (0.0, 18.0),
}


def value_range(key: str) -> tuple[float, float]:
    """The values a phase may give the quantity `key`."""
    if key in RATIO_KEYS:
        return 0.0, 1.0
    return RANGES.get(key, (0.0, MAGNITUDE_MAX))


def bad_number(data: Any, where: str = "") -> str | None:
    """The key path of the first number in the document that is NaN, infinite (outside
    INFINITE_KEYS) or larger than MAGNITUDE_MAX; None when there is none."""
    if isinstance(data, dict):
        for k, v in data.items():
            inner = f"{where}.{k}" if where else str(k)
            if isinstance(v, float) and math.isinf(v) and str(k) in INFINITE_KEYS:
                continue
            found = bad_number(v, inner)
            if found is not None:
                return found
    elif isinstance(data, list):
        for i, v in enumerate(data):
            found = bad_number(v, f"{where}[{i}]")
            if found is not None:
                return found
    elif (
        isinstance(data, int | float)
        and not isinstance(data, bool)
        and not (math.isfinite(data) and abs(data) <= MAGNITUDE_MAX)
    ):
        return where or "<top level>"
    return None


def number(
    v: Any, err: Callable[[], Exception], lo: float = 0.0, hi: float = MAGNITUDE_MAX, integer: bool = False
) -> float:
    """`v` as a finite number from `lo` to `hi` (an int with `integer`), else `err()`.
    YAML 1.1 reads `2e8` as text, so numeric text counts too; true and false do not."""
    if isinstance(v, bool) or (integer and not isinstance(v, int)):
        raise err()
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        raise err() from None
    if not (math.isfinite(f) and lo <= f <= hi):
        raise err()
    return f


def read_document(path: str | Path) -> Any:
    """The YAML document in the file; ValueError, on one line, for a file that cannot be
    read or is too large, binary, not UTF-8 or not YAML."""
    try:
        with open(path, "rb") as f:
            raw = f.read(FILE_MAX + 1)
        if len(raw) > FILE_MAX:
            raise ValueError(f"larger than {FILE_MAX // 1024**2} MiB; not a scenario")
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 text (byte {err.start}); not a scenario") from None
    except RecursionError:
        raise ValueError("nested too deeply; not a scenario") from None
    except (OSError, yaml.YAMLError) as err:
        raise ValueError(" ".join(str(err).split())) from None
