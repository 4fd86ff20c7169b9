"""Profiling counters from a co-located dcgm-exporter, for GPUs NVML GPM cannot profile.

NVML's GPM exists on Hopper and later only; on A100, A10, L4 and L40S the SM, tensor
and DRAM activity come from DCGM's profiling module, which operators run as NVIDIA's
dcgm-exporter (port 9400; the GPU Operator installs it on every GPU node). This
collector reads that page and gives its DCGM_FI_PROF_* values as the same `Profiling`
readings GPM gives, by GPU UUID. It runs on a thread of its own, and its fetch is
bounded like an engine scrape, so a dead, slow or hostile dcgm-exporter
delays nothing but itself; its state is in the llmgpu_dcgm_exporter_* self-metrics.

Where GPM answers too, GPM wins field by field (precedence below the default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from exporter.collectors.base import Collector, Context, Output, register
from exporter.config import ConfigError, Settings
from exporter.dcgm.location import LOCAL_URL, OFF, DcgmTarget, DcgmTargetError, kubernetes, normalize_url
from exporter.dcgm.source import DcgmSource
from exporter.dcgm.status import DcgmExporters
from exporter.engines.fetch import Limits
from exporter.gpu_readings import Profiling

log = logging.getLogger(__name__)

DISCOVERY_S = 60.0  # seconds between looks for this node's dcgm-exporter pod
Finder = Callable[[], list[DcgmTarget]]


class DcgmCollector(Collector):
    name = "dcgm"
    precedence = -1  # a fallback: GPM, read by this process from the driver, wins
    own_thread = True  # its fetch waits on the network

    def __init__(self, ctx: Context, finder: Finder | None = None) -> None:
        s = ctx.settings
        self.interval_s = s.engine_interval
        self.static, self.finder = resolve(s) if finder is None else (None, finder)
        self.source = DcgmSource(
            Limits(
                timeout_s=s.engine_timeout,
                max_bytes=s.engine_max_bytes,
                max_series=s.engine_max_series,
                max_labels=s.engine_max_labels,
                max_label_length=s.engine_max_label_length,
            ),
            max_age_s=s.dcgm_exporter_max_age,
            clock=ctx.clock,
        )
        self._found: DcgmTarget | None = None
        self._found_at = -1e18  # monotonic

    def target(self) -> tuple[DcgmTarget | None, dict[str, int]]:
        """The target to scrape now, and discovery errors met finding it."""
        if self.finder is None:
            return self.static, {}
        if time.monotonic() - self._found_at < DISCOVERY_S:
            return self._found, {}
        self._found_at = time.monotonic()
        try:
            found = self.finder()
        except Exception as err:  # keep the target we had: a flaky API server is no reason to stop
            log.warning("looking for this node's dcgm-exporter failed: %s", err)
            return self._found, {f"discovery_{type(err).__name__}": 1}
        self._found = found[0] if found else None
        return self._found, {}

    def collect(self) -> Output:
        target, errors = self.target()
        if target is None:
            return Output(node=(DcgmExporters(),), errors=errors)
        scrape = self.source.scrape(target)
        err = scrape.error
        # Loopback is only a guess when nothing is configured: nobody listening there is
        # a node without dcgm-exporter, not a failure (its up=0 still says so).
        guessed = target.source == "local" and err is not None and err.reason in ("refused", "dns")
        if err is not None and not guessed:
            errors = {**errors, err.reason: 1}
        return Output(
            by_uuid={uuid: (Profiling(**values),) for uuid, values in scrape.values.items()},
            node=(DcgmExporters((scrape.reading,)),),
            errors=errors,
        )

    def stop(self) -> None:
        self.source.close()


def resolve(s: Settings) -> tuple[DcgmTarget | None, Finder | None]:
    """(a fixed target, or a finder) from the settings: `dcgm_exporter` when set ("off"
    switches the source off); else this node's pod in Kubernetes; else loopback:9400.
    Simulating, only the scenario's own dcgm-exporter is read."""
    spec = s.dcgm_exporter
    if spec is not None and spec.strip():
        if spec.strip().lower() in OFF:
            return None, None
        try:
            url = normalize_url(spec)
        except DcgmTargetError as err:
            raise ConfigError(str(err)) from None
        return DcgmTarget(url, "simulated" if s.simulated else "configured"), None
    if s.simulated:
        return None, None
    if s.discover_kubernetes and s.node_name:
        return None, kubernetes(s.node_name)
    return DcgmTarget(LOCAL_URL, "local"), None


@register("dcgm", "DCGM profiling counters (SM, tensor, DRAM activity) from a co-located dcgm-exporter")
def _factory(ctx: Context) -> DcgmCollector:
    return DcgmCollector(ctx)
