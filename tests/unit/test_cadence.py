"""Bytes made ahead of a steady scraper: the next scrape of a client that scrapes on a
fixed interval finds its body made by the publisher; anyone else renders on request."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from exporter.web.cadence import Cadence
from exporter.web.server import create_app

PROM = {"accept": "application/openmetrics-text;version=1.0.0", "accept-encoding": "gzip"}
TWO_H100 = """
gpus: {count: 2, model: H100-80GB-SXM}
phases: [{name: p, duration: 100, gpu: {util: 0.5, sm_active: 0.4}}]
"""


def steady(c: Cadence, client: str, body: str, last: float, period: float, n: int = 4) -> None:
    for i in range(n):
        c.seen(client, body, last - (n - 1 - i) * period)


def test_a_steady_client_is_due_one_period_after_its_last_scrape() -> None:
    c = Cadence()
    steady(c, "prom", "openmetrics_gzip", last=100.0, period=15.0)
    assert c.due(114.5, cycle=1.0) == {"openmetrics_gzip"}  # next at 115.0
    assert c.due(112.0, cycle=1.0) == set()
    assert c.due(128.0, cycle=1.0) == set()  # between two scrapes
    assert c.due(144.6, cycle=1.0) == {"openmetrics_gzip"}  # a missed one: 130, then 145
    assert c.due(160.0, cycle=1.0) == set()  # three periods without a scrape: no longer expected


def test_irregular_or_too_few_scrapes_make_nothing_ahead() -> None:
    c = Cadence()
    for t in (100.0, 101.0, 105.0, 106.0):  # someone with curl
        c.seen("me", "text", t)
    c.seen("prom", "openmetrics_gzip", 100.0)
    c.seen("prom", "openmetrics_gzip", 115.0)  # one interval is not a cadence yet
    assert all(not c.due(t / 10, cycle=1.0) for t in range(1000, 1300))


def test_a_client_asking_faster_than_the_cycle_is_due_every_cycle() -> None:
    c = Cadence()
    for t in (100.10, 100.13, 100.31, 100.62, 100.64):  # back to back, irregularly
        c.seen("bench", "text_gzip", t)
    assert c.due(100.9, cycle=1.0) == {"text_gzip"}
    assert c.due(101.5, cycle=1.0) == set()  # quiet for a cycle: no longer
    for t in (200.0, 200.7):  # twice in a cycle is not yet busy
        c.seen("me", "text", t)
    assert c.due(200.9, cycle=1.0) == set()


def test_two_prometheus_replicas_each_keep_their_own_phase() -> None:
    c = Cadence()
    for k in range(3):  # interleaved: a scrape every 7.5 s in all, each replica's every 15 s
        c.seen("prom-a", "openmetrics_gzip", 100.0 + 15 * k)
        c.seen("prom-b", "text_gzip", 107.5 + 15 * k)
    assert c.due(144.5, cycle=1.0) == {"openmetrics_gzip"}
    assert c.due(152.0, cycle=1.0) == {"text_gzip"}


def test_the_publisher_makes_the_body_a_steady_scraper_will_ask_for(sim) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_H100)
    s.at(10)
    runner = s.runner
    assert runner.published.made() == ()
    now = time.monotonic()
    steady(runner.cadence, "testclient", "openmetrics_gzip", last=now - 14.8, period=15.0)
    runner.publish()  # the next scrape is due in 0.2 s: before the next cycle
    made = runner.published
    assert made.made() == ("openmetrics", "openmetrics_gzip", "text") and made.renders == 1
    with TestClient(create_app(runner)) as client:
        r = client.get("/metrics", headers=PROM)
    assert r.status_code == 200 and r.content.endswith(b"# EOF\n")  # served decompressed
    assert runner.published is made and made.renders == 1  # the scrape rendered nothing
    runner.publish()  # that scrape left the cadence irregular (0.2 s after the last): none
    assert runner.published.made() == ()


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"accept-encoding": "identity"}, "text"),
        ({"accept-encoding": "gzip"}, "text_gzip"),
        ({"accept": PROM["accept"], "accept-encoding": "identity"}, "openmetrics"),
        (PROM, "openmetrics_gzip"),
    ],
)
def test_each_scrape_is_noted_under_the_body_it_was_served(sim, headers, body) -> None:  # type: ignore[no-untyped-def]
    s = sim(TWO_H100)
    s.at(10)
    with TestClient(create_app(s.runner)) as client:
        for _ in range(3):
            assert client.get("/metrics", headers=headers).status_code == 200
    assert [b for _, b in s.runner.cadence._seen] == [body]
