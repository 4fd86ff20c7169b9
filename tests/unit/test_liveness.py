"""/healthz fails once a thread that collects or publishes has ended, or publishing keeps
failing: the liveness probe restarts a process whose /metrics would stay stale for good."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from exporter import runner as runner_module
from exporter.collectors.base import Collector, Output
from exporter.gpu_readings import Utilization
from exporter.runner import Runner
from exporter.web.server import create_app


class Fine(Collector):
    name = "fine"
    interval_s = 0.05

    def collect(self) -> Output:
        return Output(gpus={0: (Utilization(gpu_busy_ratio=0.5),)})


class Fatal(BaseException):
    """Not an Exception: the runner's per-run isolation does not catch it."""


class Dies(Collector):
    name = "dies"
    interval_s = 0.05

    def __init__(self, error: BaseException, own_thread: bool = False) -> None:
        self.error = error
        self.own_thread = own_thread
        self.runs = 0

    def collect(self) -> Output:
        self.runs += 1
        if self.runs >= 3:
            raise self.error
        return Output()


def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _healthz(runner: Runner) -> tuple[int, str]:
    r = TestClient(create_app(runner)).get("/healthz")
    return r.status_code, r.text


@pytest.mark.parametrize("error", [Fatal("out of luck"), SystemExit(3), KeyboardInterrupt()])
def test_the_publishing_thread_dying_fails_healthz(error: BaseException) -> None:
    runner = Runner([Fine(), Dies(error)], interval=0.05, gpu_count=1)
    runner.start()
    try:
        _until(lambda: runner.published is not None)
        assert _healthz(runner) == (200, "ok\n")
        _until(lambda: bool(runner.health()))
        status, text = _healthz(runner)
        assert status == 503
        assert text.startswith("thread collectors (fine, dies, publishing) ended: ")
        assert type(error).__name__ in text
    finally:
        runner.stop()
    assert runner.health() == []  # a stopped runner is not a dead one


def test_a_collector_of_its_own_thread_dying_fails_healthz() -> None:
    runner = Runner([Fine(), Dies(Fatal("gone"), own_thread=True)], interval=0.05, gpu_count=1)
    runner.start()
    try:
        _until(lambda: bool(runner.health()))
        assert runner.health() == ["thread collector-dies (dies) ended: Fatal: gone"]
        assert _healthz(runner)[0] == 503
        # the other lane still publishes: readiness alone would not have seen it
        age = time.monotonic() - runner.published.rendered_at  # type: ignore[union-attr]
        assert age < 1.0
    finally:
        runner.stop()


def test_a_thread_that_just_returns_fails_healthz(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = Runner([Fine()], interval=0.05, gpu_count=1)
    monkeypatch.setattr(runner, "_watch", lambda: None)  # the watchdog's loop ends at once
    runner.start()
    try:
        _until(lambda: bool(runner.health()))
        assert runner.health() == ["thread watchdog ended: returned"]
        assert _healthz(runner) == (503, "thread watchdog ended: returned\n")
    finally:
        runner.stop()


def test_publishing_that_keeps_failing_fails_healthz(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner_module, "FAILING_S", 0.3)
    runner = Runner([Fine()], interval=0.05, gpu_count=1)
    failing = [True]
    compose = runner.compose

    def broken() -> object:
        if failing[0]:
            raise ValueError("a bug in composing")
        return compose()

    monkeypatch.setattr(runner, "compose", broken)
    runner.start()
    try:
        time.sleep(0.15)
        assert runner.health() == []  # a failure or two is not yet a reason
        _until(lambda: bool(runner.health()))
        (reason,) = runner.health()
        assert reason.startswith("publishing has failed for ") and reason.endswith(
            ": ValueError: a bug in composing"
        )
        assert _healthz(runner)[0] == 503
        failing[0] = False
        _until(lambda: not runner.health())  # one good cycle and it is sound again
    finally:
        runner.stop()
