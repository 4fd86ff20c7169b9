"""Exposition is paid per scrape: publishing renders nothing, the first read of a body
renders it once per snapshot, and concurrent scrapes of one snapshot share that render."""

from __future__ import annotations

import gzip
import threading

from exporter.web.exposition import EVERYTHING, Rendered, render

TWO_H100 = """
gpus: {count: 2, model: H100-80GB-SXM}
phases: [{name: p, duration: 100, gpu: {util: 0.5, sm_active: 0.4, nvlink_tx_bps: 1.0e+10}}]
"""


def test_publishing_renders_nothing_until_a_body_is_read(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_H100)
    s.at(10)
    first = s.runner.published
    s.at(20)
    second = s.runner.published
    assert isinstance(first, Rendered) and isinstance(second, Rendered)
    assert first.made() == second.made() == () and first.renders == second.renders == 0

    body = second.openmetrics_gzip
    assert second.made() == ("openmetrics", "openmetrics_gzip", "text") and second.renders == 1
    assert gzip.decompress(body) == second.openmetrics
    assert second.openmetrics.endswith(b"# EOF\n") and b"llmgpu_gpu_up{" in second.text
    assert second.text_gzip and second.renders == 1  # the other format came with the pass
    assert first.made() == ()  # an unscraped snapshot stays unrendered


def test_concurrent_scrapes_of_one_snapshot_render_once(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_H100)
    s.at(10)
    snapshot = s.at(20)
    rendered = render(snapshot, EVERYTHING)
    start = threading.Barrier(8)
    got: list[bytes] = []

    def scrape(gzip_body: bool) -> None:
        start.wait()
        got.append(rendered.openmetrics_gzip if gzip_body else rendered.text)

    threads = [threading.Thread(target=scrape, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and rendered.renders == 1
    assert len({id(b) for b in got}) == 2  # every thread got one of the two cached bodies
    assert b"llmgpu_gpu_nvlink_link_up{" in rendered.text  # the full profile was asked for
