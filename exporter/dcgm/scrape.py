"""One dcgm-exporter page, parsed: the profiling values of each whole GPU, by UUID.

The page is fetched and parsed by the same bounded code as engine targets
(exporter.engines.fetch); this module only picks the DCGM_FI_PROF_* samples out of the
metric families and groups them by the GPU's UUID, which is how they are joined to the
GPUs NVML sees. Samples of MIG instances (`GPU_I_ID`) describe a slice, not the GPU:
they are counted and left out. A value DCGM marks blank, or a ratio that is no ratio,
is absent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from exporter.dcgm.fields import (
    BY_NAME,
    DCGM_FP64_BLANK,
    HOSTNAME_LABELS,
    MIG_LABEL,
    RATIO,
    RATIO_MAX,
    UUID_LABELS,
    Field,
)


@dataclass(frozen=True)
class DcgmGpu:
    """What the page says about one whole GPU."""

    uuid: str
    gpu: str = ""  # dcgm-exporter's `gpu` label: DCGM's GPU id, not necessarily NVML's index
    model: str = ""  # `modelName`
    hostname: str = ""
    values: Mapping[str, float] = field(default_factory=dict)  # Profiling field -> value
    oldest_timestamp: float | None = None  # when samples carry timestamps


@dataclass(frozen=True)
class DcgmPage:
    gpus: Mapping[str, DcgmGpu] = field(default_factory=dict)  # by UUID
    fields: frozenset[str] = frozenset()  # DCGM_FI_PROF_* names the page carries
    listed: frozenset[str] = frozenset()  # every GPU UUID on the page, any metric
    mig_samples: int = 0  # profiling samples of MIG instances, left out
    dropped: int = 0  # samples whose value was blank or out of range
    samples: int = 0  # every sample on the page


def _value(spec: Field, raw: float) -> float | None:
    if math.isnan(raw) or math.isinf(raw) or raw < 0 or raw >= DCGM_FP64_BLANK:
        return None
    if spec.unit == RATIO and raw > RATIO_MAX:
        return None
    return float(raw)


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    return next((labels[n] for n in names if labels.get(n)), "")


def read_page(families: Iterable[Metric]) -> DcgmPage:
    values: dict[str, dict[str, float]] = {}
    meta: dict[str, tuple[str, str, str]] = {}
    stamps: dict[str, float] = {}
    seen: set[str] = set()
    listed: set[str] = set()
    mig = dropped = total = 0
    for family in families:
        for sample in family.samples:
            total += 1
            labels = sample.labels
            uuid = _first(labels, UUID_LABELS)
            if uuid:
                listed.add(uuid)
            spec = BY_NAME.get(sample.name)
            if spec is None:
                continue
            seen.add(spec.dcgm)  # a 1.x-mode page's lower-case name, as the field's own
            if not uuid:
                dropped += 1
                continue
            if labels.get(MIG_LABEL):
                mig += 1
                continue
            value = _value(spec, sample.value)
            if value is None:
                dropped += 1
                continue
            values.setdefault(uuid, {})[spec.target] = value
            meta.setdefault(
                uuid, (labels.get("gpu", ""), labels.get("modelName", ""), _first(labels, HOSTNAME_LABELS))
            )
            if sample.timestamp is not None:
                ts = float(sample.timestamp)
                stamps[uuid] = min(ts, stamps.get(uuid, ts))
    gpus = {
        uuid: DcgmGpu(uuid, *meta[uuid], values=vals, oldest_timestamp=stamps.get(uuid))
        for uuid, vals in sorted(values.items())
    }
    return DcgmPage(
        gpus=gpus,
        fields=frozenset(seen),
        listed=frozenset(listed),
        mig_samples=mig,
        dropped=dropped,
        samples=total,
    )
