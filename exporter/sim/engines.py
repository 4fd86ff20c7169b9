"""Simulated inference engines: loopback HTTP servers that speak vLLM 0.32's /metrics.

Each engine of a scenario gets a server on 127.0.0.1 (port 0, so the kernel picks
one). Every request renders the page from the scenario timeline at that instant, so
the fake GPUs (fakenvml) and the fake engines tell one story, and the exporter reads
them with the same scraper and parser it uses on a real vLLM.

- Gauges are the timeline's values (running, waiting, kv_usage).
- Counters are integrals of the timeline's rates; where a counter is a rate times a
  ratio (cached tokens, accepted draft tokens, errors), the product is integrated.
- Histograms keep vLLM's bucket bounds. Observations arrive at the request rate (the
  token rate for inter-token latency) and fall into buckets by a log-normal law whose
  median is the timeline's value (ttft_s, itl_s, e2e_s, queue_s) and, for the
  inter-token latency, whose p99/p50 is itl_jitter.
- An active `engine_down` fault answers 503, or drops the connection without an
  answer when the fault's `error` is "refuse". One that ends is a restart: from its end
  the counters and histograms start again from zero, as a new process' do.
- process_cpu_seconds_total integrates api_cpu: the API server's CPU, which the
  exporter cannot read with psutil here because the simulated pids are not real.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporter.sim.scenario import EngineSpec, Timeline

# vLLM 0.32's bucket bounds (vllm/v1/metrics/loggers.py), +Inf added by the renderer.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
Z99 = 2.3263478740408408  # standard normal 0.99 quantile
TTFT_SIGMA = 0.35  # log-normal spread of TTFT and request phases (p99/p50 about 2.3)
# The context length the simulated engines are started with (scenarios cannot set it):
# vLLM's kv_cache_max_concurrency is the KV cache's tokens over it.
SIM_MAX_MODEL_LEN = 32768
MAX_STEPS = 400  # integration sub-steps per render, whatever the time since the last


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0:
        return 0.0
    if median <= 0:
        return 1.0
    return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * math.sqrt(2.0))))


@dataclass(frozen=True)
class _Hist:
    name: str
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
        self.kind = "vllm"  # the page is vLLM's whatever the scenario calls the engine
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
            fns[h.name] = _rates(h)
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
        }

    def _histograms(self) -> list[_Hist]:
        v = self._v
        req, gen = v("request_rate"), v("gen_tps")
        ttft, itl, jitter, e2e, queue = v("ttft_s"), v("itl_s"), v("itl_jitter"), v("e2e_s"), v("queue_s")

        def const(x: float) -> Callable[[float], float]:
            return lambda t: x

        return [
            _Hist("time_to_first_token_seconds", TTFT_BUCKETS, req, ttft, const(TTFT_SIGMA)),
            _Hist(
                "inter_token_latency_seconds",
                ITL_BUCKETS,
                gen,
                itl,
                lambda t: max(math.log(max(jitter(t), 1.0001)) / Z99, 1e-3),
            ),
            _Hist("e2e_request_latency_seconds", REQUEST_BUCKETS, req, e2e, const(TTFT_SIGMA)),
            _Hist("request_queue_time_seconds", REQUEST_BUCKETS, req, queue, const(TTFT_SIGMA)),
            _Hist(
                "request_prefill_time_seconds",
                REQUEST_BUCKETS,
                req,
                lambda t: max(ttft(t) - queue(t), 1e-4),
                const(TTFT_SIGMA),
            ),
            _Hist(
                "request_decode_time_seconds",
                REQUEST_BUCKETS,
                req,
                lambda t: max(e2e(t) - ttft(t), 1e-4),
                const(TTFT_SIGMA),
            ),
        ]

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
        acc = dict(zip(self._counter_names, integrals["counters"], strict=True))
        name, spec = self.name, self.spec
        model = _esc(spec.model)
        labels = f'engine="0",model_name="{model}"'
        g = self.timeline.engine
        out: list[str] = []

        def metric(metric_name: str, kind: str, help_text: str, rows: Sequence[tuple[str, float]]) -> None:
            out.append(f"# HELP vllm:{metric_name} {help_text}")
            out.append(f"# TYPE vllm:{metric_name} {kind}")
            for lbl, value in rows:
                out.append(f"vllm:{metric_name}{{{lbl}}} {_num(value)}")

        running, waiting = max(g(name, "running", t), 0.0), max(g(name, "waiting", t), 0.0)
        metric(
            "num_requests_running",
            "gauge",
            "Number of requests in model execution batches.",
            [(labels, round(running))],
        )
        metric(
            "num_requests_waiting",
            "gauge",
            "Number of requests waiting to be processed.",
            [(labels, round(waiting))],
        )
        metric(
            "num_requests_waiting_by_reason",
            "gauge",
            "Number of waiting requests by reason.",
            [(f'{labels},reason="capacity"', round(waiting)), (f'{labels},reason="deferred"', 0)],
        )
        metric(
            "kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [(labels, min(max(g(name, "kv_usage", t), 0.0), 1.0))],
        )
        metric(
            "prefix_cache_queries_total",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(labels, acc["prompt"])],
        )
        metric(
            "prefix_cache_hits_total",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(labels, acc["cached"])],
        )
        metric(
            "num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            [(labels, acc["preemptions"])],
        )
        metric(
            "prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(labels, acc["prompt"])]
        )
        metric(
            "prompt_tokens_cached_total",
            "counter",
            "Number of cached prompt tokens (local + external).",
            [(labels, acc["cached"])],
        )
        metric(
            "generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            [(labels, acc["generation"])],
        )
        ok = acc["ok"]
        model = _esc(spec.model)
        metric(
            "request_success_total",
            "counter",
            "Count of successfully processed requests.",
            [
                (f'engine="0",finished_reason="{reason}",model_name="{model}"', value)
                for reason, value in (
                    ("stop", ok * 0.8),
                    ("length", ok * 0.2),
                    ("abort", 0.0),
                    ("error", acc["errors"]),
                    ("repetition", 0.0),
                )
            ],
        )
        metric(
            "admission_rejections_total",
            "counter",
            "Number of admission attempts rejected by a queue limit, by reason.",
            [
                (f'model_name="{model}",reason="max_num_queued_reqs"', acc["rejections"]),
                (f'model_name="{model}",reason="max_num_queued_tokens"', 0.0),
            ],
        )
        if self._estimates:
            metric(
                "estimated_flops_per_gpu_total",
                "counter",
                "Estimated number of floating point operations per GPU (for Model Flops Utilization).",
                [(labels, acc["flops"])],
            )
            metric(
                "estimated_read_bytes_per_gpu_total",
                "counter",
                "Estimated number of bytes read from memory per GPU (for Model Bandwidth Utilization).",
                [(labels, acc["read_bytes"])],
            )
        if self._spec_decode:
            metric(
                "spec_decode_num_draft_tokens_total",
                "counter",
                "Number of draft tokens.",
                [(labels, acc["draft"])],
            )
            metric(
                "spec_decode_num_accepted_tokens_total",
                "counter",
                "Number of accepted tokens.",
                [(labels, acc["accepted"])],
            )
        for h in self._hists:
            count, total, *buckets = integrals[h.name]
            out.append(f"# HELP vllm:{h.name} Histogram of {h.name.replace('_', ' ')}.")
            out.append(f"# TYPE vllm:{h.name} histogram")
            head = f'vllm:{h.name}_bucket{{engine="0",le='
            tail = f',model_name="{model}"}}'
            whole = math.floor(count)  # observations are whole requests, as on a real server
            for bound, value in zip(h.bounds, buckets, strict=True):
                out.append(f'{head}"{_num(bound)}"{tail} {_num(math.floor(min(value, count)))}')
            out.append(f'{head}"+Inf"{tail} {_num(whole)}')
            out.append(f"vllm:{h.name}_count{{{labels}}} {_num(whole)}")
            out.append(f"vllm:{h.name}_sum{{{labels}}} {_num(total)}")
        cfg = {
            "block_size": str(spec.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": "0",
            "gpu_memory_utilization": repr(spec.gpu_memory_utilization),
            "num_gpu_blocks": str(spec.num_gpu_blocks),
            "kv_cache_size_tokens": str(spec.num_gpu_blocks * spec.block_size),
            "kv_cache_max_concurrency": repr(spec.num_gpu_blocks * spec.block_size / SIM_MAX_MODEL_LEN),
            "num_cpu_blocks": "None",
        }
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(
            "vllm:cache_config_info{" + ",".join(f'{k}="{v}"' for k, v in sorted(cfg.items())) + "} 1.0"
        )
        out.append("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.")
        out.append("# TYPE process_cpu_seconds_total counter")
        out.append(f"process_cpu_seconds_total {_num(acc['api_cpu'])}")
        return "\n".join(out) + "\n"


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


def _num(x: float) -> str:
    return repr(float(x))


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
