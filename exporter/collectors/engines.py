"""Inference engines (vLLM, SGLang, TGI): scraped in the background, normalized to llmgpu_engine_*."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from exporter.collectors.base import Collector, Context, Output, register
from exporter.config import ConfigError, Settings
from exporter.engines import discovery
from exporter.engines.scraper import Discoverer, EngineScraper, ScrapeConfig
from exporter.engines.targets import Target, TargetError, parse_spec


class EnginesCollector(Collector):
    """Owns an EngineScraper; `collect()` returns what it last published, never scrapes."""

    name = "engines"

    def __init__(
        self,
        ctx: Context,
        extra: Iterable[Target] = (),
        discover: Sequence[Discoverer] | None = None,  # None: from the settings
    ) -> None:
        s = ctx.settings
        self.interval_s = s.engine_interval
        self.scraper = EngineScraper(
            ScrapeConfig(
                interval_s=s.engine_interval,
                timeout_s=s.engine_timeout,
                max_bytes=s.engine_max_bytes,
                max_series=s.engine_max_series,
                max_labels=s.engine_max_labels,
                max_label_length=s.engine_max_label_length,
                max_models=s.engine_max_models,
            ),
            static=[*targets_from_settings(s), *extra],
            discoverers=discoverers(s) if discover is None else discover,
            clock=ctx.clock,
            pace=ctx.pace,
        )
        self._reported: dict[str, int] = {}

    def collect(self) -> Output:
        errors = self.scraper.discovery_errors
        new = {k: v - self._reported.get(k, 0) for k, v in errors.items() if v > self._reported.get(k, 0)}
        self._reported = dict(errors)
        return Output(node=(self.scraper.readings(),), errors=new)

    def refresh(self) -> None:
        self.scraper.refresh()

    def add(self, target: Target) -> None:
        self.scraper.add(target)

    def start(self) -> None:
        self.scraper.start()

    def stop(self) -> None:
        self.scraper.stop()


def targets_from_settings(s: Settings) -> list[Target]:
    """Settings.engines ("URL" or "TYPE=URL"); a bad entry is a configuration error."""
    out = []
    for spec in s.engines:
        try:
            out.append(parse_spec(spec))
        except TargetError as err:
            raise ConfigError(f"setting 'engines': {err}") from None
    return out


def discoverers(s: Settings) -> list[Discoverer]:
    """Local process and Kubernetes discovery; neither while simulating (the demo shows
    the simulated engines only)."""
    if s.simulated:
        return []
    found: list[Discoverer] = []
    if s.discover_processes:
        found.append(discovery.local_processes)
    if s.discover_kubernetes:
        if not s.node_name:
            raise ConfigError("setting 'discover_kubernetes' needs 'node_name' (NODE_NAME)")
        found.append(discovery.kubernetes(s.node_name, s.engine_annotation))
    return found


@register("engines", "vLLM, SGLang and TGI /metrics, scraped in the background and normalized")
def _factory(ctx: Context) -> EnginesCollector:
    return EnginesCollector(ctx)
