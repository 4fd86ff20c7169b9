"""The incremental writer writes, byte for byte, what a full render of the same snapshot
writes: through GPUs that fall off and come back, engines that restart, MIG, both
profiles, and snapshots rendered out of order."""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator

import pytest

from exporter.config import Settings
from exporter.metricdef import Histogram, Labels, MetricDef, samples
from exporter.sim import node
from exporter.snapshot import GpuUp, Snapshot
from exporter.web.exposition import DEFAULT, EVERYTHING, Exposure, render

pytestmark = pytest.mark.slow  # plays scenarios or starts servers: `make unit` leaves it out


def _readings(snapshot: Snapshot) -> Iterator[tuple[object, Labels]]:
    for gpu in snapshot.gpus:
        base = gpu.base_labels
        yield GpuUp(up=int(gpu.up), supported={f: int(s) for f, s in sorted(gpu.supported.items())}), base
        for reading in gpu.readings.values():
            yield reading, base
    for readings in snapshot.node.values():
        for reading in readings:
            yield reading, ()
    for status in snapshot.collectors:
        yield status, ()


def _num(v: object) -> str:
    f = float(v)  # type: ignore[arg-type]
    return "NaN" if math.isnan(f) else ("+Inf" if f > 0 else "-Inf") if math.isinf(f) else repr(f)


def _labels(labels: Labels) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in sorted(labels)) + "}" if labels else ""


def reference(snapshot: Snapshot, exposure: Exposure) -> tuple[bytes, bytes]:
    """The whole render, sample by sample, with nothing kept between calls."""
    by_name: dict[str, tuple[MetricDef, list[str]]] = {}
    for reading, base in _readings(snapshot):
        for metric, labels, value in samples(reading, base, exposure.plan):
            lines = by_name.setdefault(metric.name, (metric, []))[1]
            name = metric.name
            if metric.kind == "info":
                lines.append(f"{name}{_labels(labels + tuple((k, str(v)) for k, v in value.items()))} 1.0\n")
            elif metric.kind == "histogram":
                assert isinstance(value, Histogram)
                for bound, count in value.buckets:
                    le = "+Inf" if bound == math.inf else repr(float(bound))
                    lines.append(f"{name}_bucket{_labels((*labels, ('le', le)))} {_num(count)}\n")
                lines.append(f"{name}_count{_labels(labels)} {_num(value.count)}\n")
                lines.append(f"{name}_sum{_labels(labels)} {_num(value.sum)}\n")
            else:
                lines.append(f"{name}{_labels(labels)} {_num(value)}\n")
    text, om = [], []
    for name in sorted(by_name):
        metric, lines = by_name[name]
        help_ = metric.help.replace("\\", "\\\\").replace("\n", "\\n")
        om_help = help_.replace('"', '\\"')  # OpenMetrics escapes a quote in HELP too
        if metric.kind in ("counter", "info"):
            short = name.removesuffix("_total" if metric.kind == "counter" else "_info")
            text.append(
                f"# HELP {name} {help_}\n# TYPE {name} {'counter' if metric.kind == 'counter' else 'gauge'}\n"
            )
            om.append(f"# HELP {short} {om_help}\n# TYPE {short} {metric.kind}\n")
        else:
            text.append(f"# HELP {name} {help_}\n# TYPE {name} {metric.kind}\n")
            om.append(f"# HELP {name} {om_help}\n# TYPE {name} {metric.kind}\n")
        text.append("".join(lines))
        om.append("".join(lines))
    return "".join(text).encode(), ("".join(om) + "# EOF\n").encode()


def _snapshots(scenario: str, step_s: float) -> list[Snapshot]:
    return list(node.play(Settings(simulate=scenario), step_s=step_s))


@pytest.mark.parametrize(
    ("scenario", "step_s"),
    [("gpu-lost", 15.0), ("engine-restart", 30.0), ("mig", 60.0), ("fragmented-allocator", 60.0)],
)
def test_every_render_is_the_full_render(scenario: str, step_s: float) -> None:
    snaps = _snapshots(scenario, step_s)
    assert len(snaps) >= 5
    for exposure in (Exposure(), Exposure("full")):  # fresh writers: nothing kept from other tests
        # in order, then out of order (a slow scrape of an older snapshot after a newer one)
        order = [*range(len(snaps)), len(snaps) - 1, 0, len(snaps) // 2, 1, 1]
        for i in order:
            rendered = render(snaps[i], exposure)
            text, om = reference(snaps[i], exposure)
            assert rendered.text == text, (scenario, exposure.profile, i)
            assert rendered.openmetrics == om, (scenario, exposure.profile, i)
            assert gzip.decompress(rendered.openmetrics_gzip) == om
            assert gzip.decompress(rendered.text_gzip) == text


def test_what_changed_is_written_and_what_did_not_is_reused() -> None:
    snaps = _snapshots("gpu-lost", 15.0)
    exposure = Exposure()
    first = exposure.writer.families(snaps[0])
    again = exposure.writer.families(snaps[0])
    assert all(a is b for a, b in zip(first, again, strict=True))  # nothing changed: every family kept
    after = {f.metric.name: f for f in exposure.writer.families(snaps[1])}
    before = {f.metric.name: f for f in again}
    assert after["llmgpu_gpu_info"] is before["llmgpu_gpu_info"]  # device facts do not move
    assert after["llmgpu_gpu_power_watts"] is not before["llmgpu_gpu_power_watts"]


def test_the_module_defaults_render_too() -> None:
    snap = _snapshots("healthy", 300.0)[-1]
    for exposure in (DEFAULT, EVERYTHING):
        assert render(snap, exposure).text == reference(snap, exposure)[0]
