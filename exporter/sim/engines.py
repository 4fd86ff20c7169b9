"""Simulated inference engines: loopback HTTP servers that speak vLLM's, SGLang's or TGI's /metrics.

Each engine of a scenario gets a server on 127.0.0.1 (port 0, so the kernel picks
one). Every request renders the page from the scenario timeline at that instant, so
the fake GPUs (fakenvml) and the fake engines tell one story, and the exporter reads
them with the same scraper and parser it uses on a real engine. The engine's `kind`
picks the page (sim/engine_pages.py names and labels everything as that engine does).

- Gauges are the timeline's values (running, waiting, kv_usage).
- Counters are integrals of the timeline's rates; where a counter is a rate times a
  ratio (cached tokens, accepted draft tokens, errors), the product is integrated.
- Histograms keep each engine's bucket bounds. Observations arrive at the request rate
  (the token rate for vLLM's and SGLang's inter-token latency, the transfer rate for KV
  transfers) and fall into buckets by a log-normal law whose median is the timeline's
  value (ttft_s, itl_s, e2e_s, queue_s, kv_transfer_s) and, for the inter-token
  latency, whose p99/p50 is itl_jitter. TGI's token-length histograms have the mean
  prompt and output length, so their sums grow at prompt_tps and gen_tps.
- An active `engine_down` fault answers 503, or drops the connection without an
  answer when the fault's `error` is "refuse". One that ends is a restart: from its end
  the counters and histograms start again from zero, as a new process' do.
- process_cpu_seconds_total integrates api_cpu: the API server's CPU, which the
  exporter cannot read with psutil here because the simulated pids are not real.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporter.sim.engine_pages import Instant, histograms_of, write
from exporter.sim.scenario import EngineSpec, Timeline

Z99 = 2.3263478740408408  # standard normal 0.99 quantile
TTFT_SIGMA = 0.35  # log-normal spread of TTFT and request phases (p99/p50 about 2.3)
MAX_STEPS = 400  # integration sub-steps per render, whatever the time since the last


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0:
        return 0.0
    if median <= 0:
        return 1.0
    return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * math.sqrt(2.0))))


@dataclass(frozen=True)
class _Hist:
    key: str  # the law's key in engine_pages.HISTOGRAMS
    bounds: tuple[float, ...]
    rate: Callable[[float], float]  # observations per second at t
    median: Callable[[float], float]
    sigma: Callable[[float], float]


class _Integrals:
    """Running integrals of vector functions of scenario time, advanced on each render."""

    def __init__(self, fns: dict[str, Callable[[float], tuple[float, ...]]]) -> None:
        self.fns = fns
        self._reset()

    def _reset(self) -> None:
        self.t = 0.0
        self._last = {k: f(0.0) for k, f in self.fns.items()}
        self.values = {k: [0.0] * len(v) for k, v in self._last.items()}

    def at(self, t: float) -> dict[str, list[float]]:
        if t < self.t:  # time went back (a new timeline): start over
            self._reset()
        span = t - self.t
        if span > 0:
            steps = max(1, min(MAX_STEPS, math.ceil(span)))
            dt = span / steps
            for i in range(1, steps + 1):
                ti = self.t + dt * i
                for key, f in self.fns.items():
                    now, last, acc = f(ti), self._last[key], self.values[key]
                    for j, value in enumerate(now):
                        acc[j] += (last[j] + value) / 2 * dt
                    self._last[key] = now
            self.t = t
        return {k: list(v) for k, v in self.values.items()}


class SimEngine:
    """One simulated engine server; `url` is its /metrics."""

    def __init__(self, timeline: Timeline, spec: EngineSpec) -> None:
        self.timeline = timeline
        self.spec = spec
        self.name = spec.name
        self.kind = spec.kind
        self.pids = tuple(sorted(timeline.scenario.engine_pids(spec.name).values()))
        self._lock = threading.Lock()
        self._spec_decode = _sets(timeline, spec.name, "spec_draft_tps")
        self._estimates = any(_sets(timeline, spec.name, k) for k in ("flops_per_gpu", "read_bytes_per_gpu"))
        self._hists = self._histograms()
        counters = self._counters()
        fns: dict[str, Callable[[float], tuple[float, ...]]] = {
            "counters": lambda t: tuple(f(t) for f in counters.values())
        }
        for h in self._hists:
            fns[h.key] = _rates(h)
        self._counter_names = tuple(counters)
        self._integrals = _Integrals(fns)
        self._baselines: dict[float, dict[str, list[float]]] = {}  # restart time -> integrals then
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"sim-engine-{spec.name}",
            daemon=True,
        )
        self._thread.start()

    @property
    def target_spec(self) -> str:
        """The `engines` setting entry for this engine, carrying its simulated pids."""
        numa = self.spec.cpu_numa_nodes
        return (
            f"{self.kind}={self.url}#pids={','.join(str(p) for p in self.pids)}"
            f"&max_num_seqs={self.spec.max_num_seqs}"
            + (f"&numa={','.join(str(n) for n in numa)}" if numa else "")
        )

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    # ---- what the page says ----------------------------------------------------------

    def _v(self, key: str) -> Callable[[float], float]:
        name = self.spec.name
        return lambda t: max(self.timeline.engine(name, key, t), 0.0)

    def _counters(self) -> dict[str, Callable[[float], float]]:
        v = self._v
        req, err, prompt, hit = v("request_rate"), v("error_ratio"), v("prompt_tps"), v("prefix_hit_ratio")
        draft, accept = v("spec_draft_tps"), v("spec_accept_ratio")
        return {
            "prompt": prompt,
            "generation": v("gen_tps"),
            "cached": lambda t: prompt(t) * min(hit(t), 1.0),
            "preemptions": v("preemption_rate"),
            "ok": lambda t: req(t) * (1.0 - min(err(t), 1.0)),
            "errors": lambda t: req(t) * min(err(t), 1.0),
            "rejections": v("rejection_rate"),
            "draft": draft,
            "accepted": lambda t: draft(t) * min(accept(t), 1.0),
            "api_cpu": v("api_cpu"),
            "flops": v("flops_per_gpu"),
            "read_bytes": v("read_bytes_per_gpu"),
            "kv_failures": v("kv_transfer_failure_rate"),
        }

    def _histograms(self) -> list[_Hist]:
        """The laws of the histograms this engine's page carries, on its kind's bounds."""
        v = self._v
        req, gen = v("request_rate"), v("gen_tps")
        ttft, itl, jitter, e2e, queue = v("ttft_s"), v("itl_s"), v("itl_jitter"), v("e2e_s"), v("queue_s")
        transfer = v("kv_transfer_s")
        pulls = req if self.spec.role == "decode" else (lambda t: 0.0)  # vLLM: the decode side pulls
        spread = math.exp(TTFT_SIGMA**2 / 2)  # a log-normal's mean over its median

        def const(x: float) -> Callable[[float], float]:
            return lambda t: x

        def per_request(tps: Callable[[float], float]) -> Callable[[float], float]:
            return lambda t: tps(t) / req(t) / spread if req(t) > 0 else 0.0

        def steps(t: float) -> float:  # decode steps per second: each yields a token per sequence
            running = v("running")(t)
            return gen(t) / running if running > 0 else 0.0

        def itl_sigma(t: float) -> float:
            return max(math.log(max(jitter(t), 1.0001)) / Z99, 1e-3)

        s = const(TTFT_SIGMA)
        laws: dict[
            str, tuple[Callable[[float], float], Callable[[float], float], Callable[[float], float]]
        ] = {
            "ttft": (req, ttft, s),
            "itl": (gen, itl, itl_sigma),
            "itl_mean": (req, itl, itl_sigma),
            "e2e": (req, e2e, s),
            "queue": (req, queue, s),
            "prefill": (req, lambda t: max(ttft(t) - queue(t), 1e-4), s),
            "decode": (req, lambda t: max(e2e(t) - ttft(t), 1e-4), s),
            "kv_transfer": (pulls, transfer, s),
            "kv_bytes": (pulls, lambda t: v("kv_transfer_gbps")(t) * 1e9 * transfer(t), s),
            "prompt_len": (req, per_request(v("prompt_tps")), s),
            "gen_len": (req, per_request(gen), s),
            "batch_prefill": (req, lambda t: max(ttft(t) - queue(t), 1e-4), s),
            "batch_decode": (steps, itl, itl_sigma),
        }
        return [_Hist(key, bounds, *laws[key]) for key, (_, bounds) in histograms_of(self.spec).items()]

    def down(self) -> str | None:
        """'refuse' or '503' while an engine_down fault for this engine is active."""
        for fault in self.timeline.faults("engine_down"):
            if fault.engine in (None, self.name):
                return "refuse" if fault.error == "refuse" else "503"
        return None

    def restarted_at(self, t: float) -> float | None:
        """The end of the last engine_down fault of this engine before t: its restart."""
        ends = [
            f.until
            for f in self.timeline.scenario.faults
            if f.kind == "engine_down" and f.engine in (None, self.name) and f.until <= t
        ]
        return max(ends) if ends else None

    def _since_restart(self, t: float) -> dict[str, list[float]]:
        """The integrals at t, counted from the engine's last restart."""
        start = self.restarted_at(t)
        with self._lock:
            if start is not None and start not in self._baselines:
                # nothing renders while the engine is down, so the integrals are not past it yet
                self._baselines[start] = self._integrals.at(max(start, self._integrals.t))
            now = self._integrals.at(max(t, 0.0))
        if start is None:
            return now
        base = self._baselines[start]
        return {k: [max(0.0, a - b) for a, b in zip(v, base[k], strict=True)] for k, v in now.items()}

    def render(self, t: float | None = None) -> str:
        t = self.timeline.now() if t is None else t
        integrals = self._since_restart(t)
        name = self.name
        return write(
            Instant(
                spec=self.spec,
                value=lambda key: max(self.timeline.engine(name, key, t), 0.0),
                acc=dict(zip(self._counter_names, integrals["counters"], strict=True)),
                hists={h.key: integrals[h.key] for h in self._hists},
                spec_decode=self._spec_decode,
                estimates=self._estimates,
            )
        )


def _sets(timeline: Timeline, engine: str, key: str) -> bool:
    """True when any phase gives this engine a nonzero value for `key`."""
    for phase in timeline.scenario.phases:
        for values in (phase.engine, phase.engines.get(engine, {})):
            if values.get(key, 0.0):
                return True
    return False


def _rates(h: _Hist) -> Callable[[float], tuple[float, ...]]:
    """Observation rate, sum rate and per-bucket rates of a histogram at time t."""

    def rates(t: float) -> tuple[float, ...]:
        rate, median, sigma = h.rate(t), h.median(t), h.sigma(t)
        # the mean of a log-normal law is median * exp(sigma^2 / 2)
        mean = median * math.exp(sigma**2 / 2)
        return (rate, rate * mean, *(rate * lognormal_cdf(b, median, sigma) for b in h.bounds))

    return rates


def _handler(engine: SimEngine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state = engine.down()
            if state == "refuse":
                self.close_connection = True
                self.connection.close()
                return
            if state == "503" or self.path.split("?")[0] not in ("/metrics", "/metrics/"):
                self.send_error(503 if state else 404)
                return
            body = engine.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def start_sim_engines(timeline: Timeline) -> list[SimEngine]:
    """One loopback /metrics server per engine of the scenario, already serving."""
    started: list[SimEngine] = []
    try:
        for spec in timeline.scenario.engines:
            started.append(SimEngine(timeline, spec))
    except OSError:
        for engine in started:
            engine.stop()
        raise
    return started
