"""Energy per token and cost per million tokens: pure functions over frames, no HTTP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from exporter.diagnosis.diagnoser import Diagnoser
from exporter.diagnosis.efficiency import efficiency, interpolate
from exporter.diagnosis.frame import Frame
from exporter.diagnosis.history import History
from exporter.diagnosis.model import EngineEfficiencies
from tests.support.diagnosis_builders import T0, engine, frame, gpu


def serving(
    n: int,
    watts: float = 500.0,
    tokens_per_s: float = 1000.0,
    gpus: int = 2,
    scrape_every: float = 5.0,
    every: float = 1.0,
) -> list[Frame]:
    """n frames `every` s apart: `gpus` GPUs at `watts` each, one engine generating tokens,
    its counter read every `scrape_every` s (as the scraper does), not at every frame."""
    out = []
    for i in range(n):
        t = i * every
        scraped = (t // scrape_every) * scrape_every
        gs = tuple(gpu(k, energy_joules_total=1e6 + watts * t) for k in range(gpus))
        e = engine(
            gpus=tuple(range(gpus)),
            generation_tokens_total=5e5 + tokens_per_s * scraped,
            scraped_at=T0 + scraped,
        )
        out.append(frame(t, gs, (e,)))
    return out


def run(frames: list[Frame], price: float | None = None, window: float = 60.0):  # type: ignore[no-untyped-def]
    history = History(900.0)
    for f in frames:
        history.add(f)
    last = frames[-1]
    return efficiency(last, history, last.engines[0], window, price)


def test_energy_per_token_is_the_gpus_energy_over_the_tokens_of_the_same_span() -> None:
    eff = run(serving(90, watts=500.0, tokens_per_s=1000.0, gpus=2))
    # two GPUs at 500 W over 1000 tokens/s: 1 J per token, whatever the scrape cadence
    assert eff.energy_per_token_joules == pytest.approx(1.0, rel=1e-9)
    assert eff.cost_per_million_tokens is None  # no price configured: absent, not 0
    assert eff.span_s is not None and 50.0 <= eff.span_s <= 60.0


def test_cost_per_million_tokens_follows_the_price_per_gpu_hour() -> None:
    # 2 GPUs at 3.6 per hour = 0.002 per second; 1000 tokens/s -> 2e-6 per token -> 2 per 1M
    eff = run(serving(90, tokens_per_s=1000.0, gpus=2), price=3.6)
    assert eff.cost_per_million_tokens == pytest.approx(2.0, rel=1e-9)
    cheaper = run(serving(90, tokens_per_s=4000.0, gpus=2), price=3.6)
    assert cheaper.cost_per_million_tokens == pytest.approx(0.5, rel=1e-9)


def test_no_tokens_no_figure() -> None:
    eff = run(serving(90, tokens_per_s=0.0), price=2.0)
    assert eff.energy_per_token_joules is None and eff.cost_per_million_tokens is None


def test_shared_gpus_give_no_figure() -> None:
    frames = serving(90)
    other = engine("http://10.0.0.2:8000/metrics", gpus=(1,), generation_tokens_total=1.0, scraped_at=T0)
    shared = [replace(f, engines=(*f.engines, other)) for f in frames]
    assert run(shared, price=2.0).energy_per_token_joules is None
    mig = [replace(f, gpus=(f.gpus[0], replace(f.gpus[1], mig_enabled=True))) for f in frames]
    assert run(mig, price=2.0).cost_per_million_tokens is None


def test_a_gpu_without_an_energy_counter_gives_no_energy_figure() -> None:
    frames = [replace(f, gpus=(f.gpus[0], replace(f.gpus[1], energy_joules_total=None))) for f in serving(90)]
    eff = run(frames, price=2.0)
    assert eff.energy_per_token_joules is None


def test_a_counter_reset_counts_from_zero() -> None:
    frames = serving(90)
    # the engine restarted at 60 s: its counter starts again from 0
    reset = [
        replace(f, engines=(replace(f.engines[0], generation_tokens_total=1000.0 * (f.taken_at - T0 - 60)),))
        if f.taken_at - T0 >= 60
        else f
        for f in frames
    ]
    eff = run(reset)
    assert eff.energy_per_token_joules is not None and eff.energy_per_token_joules > 0


def test_interpolate() -> None:
    s = [(0.0, 0.0), (10.0, 100.0)]
    assert interpolate(s, 2.5) == 25.0
    assert interpolate(s, 11.0) is None and interpolate([], 1.0) is None


def test_the_diagnoser_exports_the_figures_and_shows_them_on_the_engine_card() -> None:
    d = Diagnoser(gpu_hour_price=3.6)
    out: tuple[object, ...] = ()
    for f in serving(90):
        out = d.readings(f)
    effs = next(x for x in out if isinstance(x, EngineEfficiencies))
    (item,) = effs.items
    assert item.target == "http://10.0.0.1:8000/metrics"
    assert item.energy_per_token_joules == pytest.approx(1.0)
    assert item.cost_per_million_tokens == pytest.approx(2.0)
    assert d.latest is not None
    numbers = {n.name: n for n in d.latest.engines[0].numbers}
    assert numbers["energy per generated token"].value == pytest.approx(1.0)
    assert numbers["cost per million tokens"].value == pytest.approx(2.0)
    card = d.latest.to_json()["engines"][0]
    texts = {n["name"]: n["text"] for n in card["numbers"]}
    assert texts["energy per generated token"] == "1 J"
    # without a price the cost is not on the card
    d2 = Diagnoser()
    for f in serving(90):
        d2.readings(f)
    assert d2.latest is not None
    assert "cost per million tokens" not in {n.name for n in d2.latest.engines[0].numbers}


def test_an_engine_scraped_less_often_than_the_window_still_has_its_figures() -> None:
    # scrapes 90 s apart, a 60 s window: the span reaches back to the scrape before
    eff = run(serving(40, scrape_every=90.0, every=10.0))
    assert eff.energy_per_token_joules == pytest.approx(1.0, rel=1e-9)
    assert eff.span_s == 90.0  # 270 -> 360 s: the last scrape and the newest one 60 s older
