"""The benchmark report's Method section: how every figure was measured."""

from __future__ import annotations

from typing import Any

from report_text import Doc
from settings import FULL, PROMETHEUS_ACCEPT, QUICK, SCRAPERS, SETTLE_S, SPACED_GAP_S, Plan


def plan_of(meta: dict[str, Any]) -> Plan:
    return QUICK if meta["quick"] else FULL


def method_section(d: Doc, meta: dict[str, Any]) -> None:
    plan = plan_of(meta)
    d("## Method")
    d("")
    d(
        "- Scenarios: 1, 8 and 72 H100 80GB SXM GPUs at a steady load (utilization 0.75, NVLink "
        "and PCIe traffic, 90 % memory used), written to a temporary directory. No inference "
        "engine: the engines collector has nothing to scrape, so GPU sampling is what is "
        "measured. Scenario time is real time."
    )
    d(
        "- Sampling CPU (`bench/sampling.py`, a fresh process per GPU count): the exporter is built "
        "by `exporter.app.build` as `serve` builds it (fake library under pynvml, every default "
        "collector, the enrichers), without starting its threads. After 3 warm-up `Runner.step()` "
        "calls, each pass runs every collector once through `Runner.run_collector` and then "
        "`Runner.publish()` (compose, enrichers), then renders the new snapshot (both formats in "
        "one pass) and gzips both bodies, as a scraper of every cycle would have them made, "
        "with `time.process_time()` around each piece, and every garbage collection timed "
        "through `gc.callbacks`. "
        f"Passes repeat for {plan.sampling_s:g} s, in whole periods of 10 (the NVLink collector's "
        "state and error counters are read one run in 10). Per-cycle figures weight each "
        "collector by its interval against the 1 s cycle."
    )
    d(
        "- The fake's share (`bench/fakecalls.py`): a whole period of runs (10) of each "
        "collector is recorded at the fake library's entry points (function and ctypes "
        "arguments) and replayed straight on the fake's functions; the replay's CPU, per run, is "
        'what the fake spends, and "without the fake" subtracts it. What remains is the '
        "collectors and pynvml's Python binding, both of which run in production. A real "
        "libnvidia-ml call is C but mostly an ioctl into the driver, not free either: multiply "
        "the NVML calls per GPU per cycle by the driver's per-call cost to complete the picture "
        "on real hardware."
    )
    d(
        "- nvitop-exporter's sampling: the body of its update loop (`update_host`, then "
        "`update_device` for every GPU) timed the same way in-process, with a private registry "
        f"({plan.nvitop_cycles} passes after 3 warm-up passes)."
    )
    d(
        "- Serving: both exporters run as subprocesses on 127.0.0.1 with a 1 s interval: "
        "`python -m exporter.cli serve --scenario-file F --listen 127.0.0.1:PORT --interval 1`, "
        "and `python bench/nvitop_on_fake.py F -- --bind-address 127.0.0.1 --port PORT "
        "--interval 1`. Process CPU (user + system) is read over the same "
        f"{plan.cpu_window_s:g} s wall window with both running and nobody scraping; then the "
        "series of each are counted from one plain scrape, and the latency rounds follow."
    )
    d(
        "- Latency: wall time from sending the request to the last byte of the body as sent "
        "(gzip bodies are not decompressed), with httpx keep-alive clients in the benchmark "
        "process. One scraper: up to "
        f"{plan.sequential} requests per mode. {SCRAPERS} scrapers: threads with a client each, up "
        f"to {plan.concurrent_each} requests each per mode (after one untimed request per client). "
        f"Prometheus' request once per publish cycle: {plan.spaced} requests per exporter, each "
        f"after a {SPACED_GAP_S:g} s pause, so each one meets a newly published cycle, as a real "
        "Prometheus scrape (every 15 s or so) does. After each of ours, an untimed `/readyz` "
        "(it reports the age of the published cycle, on the monotonic clock both processes "
        "share) places the request's start against the end of the nearest publish step; then, "
        "after the same pause, `/healthz` (which does nothing) is timed as the floor of a request "
        "that finds the server idle. "
        f"The work is split into {plan.rounds} rounds; in each round every exporter in turn runs "
        "all its phases while the other one is paused with SIGSTOP; after resuming ours the "
        f"benchmark waits {SETTLE_S:g} s, so that it publishes a whole cycle again. "
        "Interleaving spreads the drift in other people's load over both exporters. "
        f"Each phase of a round also stops after {plan.phase_s / plan.rounds:g} s, so n is the "
        "number of requests actually timed. The scraper threads share one GIL, which adds to "
        "their latencies; the throughput is the sturdier figure there."
    )
    d(
        "- Requests: plain (`Accept-Encoding: identity`; httpx's default `Accept: */*`, so the "
        "text format), gzip (`Accept-Encoding: gzip`: the text format, gzipped), and the "
        "request Prometheus 2.x "
        f"sends (`Accept: {PROMETHEUS_ACCEPT}` and `Accept-Encoding: gzip`). The format and "
        "encoding each exporter answered with are read from the response headers and shown per "
        "GPU count."
    )
    d(
        "- Peak RSS: `VmHWM` from `/proc/PID/status` of each server, read after all its scrapes. "
        "A run serves each GPU count for about a minute, but the diagnosis history spans 900 s "
        "(every frame of the last 120 s, one per 10 s before: about 198 frames at steady state), "
        "so the steady state is projected: `bench/sampling.py --history` builds the exporter in "
        "a fresh process and fills its history to that steady state with scenario time stepped "
        "by hand (10 s per frame for the older part, then 1 s per frame for the last 120 s; "
        "per-second collectors, compose, enrichers; no rendering), within "
        f"{plan.history_s:g} s of wall time. Its VmRSS growth divided by the frames held is the "
        "memory per frame; the projection adds it for the frames the served exporter did not "
        "hold yet (from its unpaused running time, one frame per second)."
    )
    d("- Percentiles are nearest-rank; with n requests, p99 is the ⌈0.99 n⌉-th fastest.")
    d("- MB is 10^6 bytes; KiB is 1024 bytes.")
