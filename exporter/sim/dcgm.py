"""A simulated dcgm-exporter: a loopback HTTP server speaking dcgm-exporter's /metrics.

The page follows dcgm-exporter's renderer (internal/pkg/rendermetrics/render_metrics.go):
`# HELP`/`# TYPE` per field, then one sample per GPU labelled gpu, UUID, pci_bus_id,
device, modelName and the host name, values printed as DCGM types them (doubles with
%f, int64 with %d). Its numbers come from the scenario timeline, the same one that
drives the fake NVML, with DCGM's semantics:

* a profiling value is DCGM's average over its sampling window (`interval`, the
  --collect-interval); the page shows the last completed window, so it changes once per
  window and lags the timeline by up to two windows; before the first window ends there
  is no profiling sample at all;
* an average of a busy GPU never repeats exactly: each window's value carries a jitter
  of a few millionths (deterministic), an idle GPU's zero stays zero;
* a GPU without NVLink has no NVLink samples (DCGM reports them blank; dcgm-exporter
  skips blank values).

Faults (sim/dcgm_spec.py) make it answer 500, close the connection, freeze its values,
send a huge or a garbage body, answer late, or speak for another node's GPUs.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporter.sim.dcgm_spec import DcgmExporterSpec, DcgmFault
from exporter.sim.scenario import Timeline

# field -> (timeline key, DCGM type, help text as in dcgm-exporter's dcp-metrics-included.csv)
FIELDS: dict[str, tuple[str, str, str]] = {
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", "d", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", "d", "The ratio of number of warps resident on an SM."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": (
        "tensor_active",
        "d",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    "DCGM_FI_PROF_DRAM_ACTIVE": (
        "dram_active",
        "d",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("fp16_active", "d", "Ratio of cycles the fp16 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("fp32_active", "d", "Ratio of cycles the fp32 pipes are active."),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("fp64_active", "d", "Ratio of cycles the fp64 pipes are active."),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (
        "pcie_tx_bps",
        "i",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
    ),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (
        "pcie_rx_bps",
        "i",
        "The rate of data received over the PCIe bus - including both protocol headers and data "
        "payloads - in bytes per second.",
    ),
    "DCGM_FI_PROF_NVLINK_TX_BYTES": (
        "nvlink_tx_bps",
        "i",
        "The rate of data transmitted over NVLink in bytes per second.",
    ),
    "DCGM_FI_PROF_NVLINK_RX_BYTES": (
        "nvlink_rx_bps",
        "i",
        "The rate of data received over NVLink in bytes per second.",
    ),
}
JITTER = 2e-6  # of a ratio; bytes per second get +-3 bytes
HOSTNAME = "sim-node"


def sim_uuid(scenario: str, index: int) -> str:
    """The UUID the fake NVML gives GPU `index` of a scenario (fakenvml.device.gpu_uuids)."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'{scenario}/{index}')}"


def _jitter(*key: object) -> float:
    """A fixed number in [-1, 1) for a key: DCGM's averages never repeat, the test must."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**63 - 1.0


class SimDcgmExporter:
    """The scenario's dcgm-exporter; `url` is its /metrics."""

    def __init__(self, timeline: Timeline, spec: DcgmExporterSpec) -> None:
        self.timeline = timeline
        self.spec = spec
        scn = timeline.scenario
        self.uuids = [sim_uuid(scn.name, i) for i in range(scn.gpu_count)]
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="sim-dcgm-exporter",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def fault(self, t: float | None = None) -> DcgmFault | None:
        t = self.timeline.now() if t is None else t
        return next((f for f in self.spec.faults if f.active(t)), None)

    # ---- the page ----------------------------------------------------------------------

    def profiling(self, index: int, field: str, t: float) -> float | None:
        """DCGM's average of the last completed window before t; None before the first."""
        w = self.spec.interval_s
        k = math.floor(t / w)
        if k < 1:
            return None
        key = FIELDS[field][0]
        end = k * w
        mean = (
            self.timeline.gpu_integral(index, key, end) - self.timeline.gpu_integral(index, key, end - w)
        ) / w
        if mean <= 0:
            return 0.0
        if FIELDS[field][1] == "i":
            return float(max(0, round(mean + 3 * _jitter(index, field, k))))
        return max(0.0, mean + JITTER * _jitter(index, field, k))

    def render(self, t: float | None = None) -> str:
        t = self.timeline.now() if t is None else t
        fault = self.fault(t)
        if fault is not None and fault.kind == "stale":
            t = fault.at  # DCGM stopped sampling: the cache keeps answering the same values
        scn = self.timeline.scenario
        model = scn.gpu_model
        uuids = self.uuids
        if fault is not None and fault.kind == "foreign":
            uuids = [sim_uuid(f"{scn.name}/another-node", i) for i in range(scn.gpu_count)]
        labels = [
            f'gpu="{i}",UUID="{u}",pci_bus_id="00000000:{0x18 + i * 0x10:02X}:00.0",device="nvidia{i}",'
            f'modelName="{model.name}",{self.spec.hostname_label}="{HOSTNAME}"'
            for i, u in enumerate(uuids)
        ]
        g = self.timeline.gpu
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, values: list[str | None]) -> None:
            rows = [f"{name}{{{labels[i]}}} {v}" for i, v in enumerate(values) if v is not None]
            if rows:
                out.extend((f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows))

        n = scn.gpu_count
        family(
            "DCGM_FI_DEV_SM_CLOCK",
            "gauge",
            "SM clock frequency (in MHz).",
            [str(round(g(i, "sm_clock_ratio", t) * model.sm_clock_max_hertz / 1e6)) for i in range(n)],
        )
        family(
            "DCGM_FI_DEV_GPU_TEMP",
            "gauge",
            "GPU temperature (in C).",
            [str(round(g(i, "temp_c", t))) for i in range(n)],
        )
        family(
            "DCGM_FI_DEV_POWER_USAGE",
            "gauge",
            "Power draw (in W).",
            [f"{g(i, 'power_ratio', t) * g(i, 'power_limit_watts', t):f}" for i in range(n)],
        )
        family(
            "DCGM_FI_DEV_GPU_UTIL",
            "gauge",
            "GPU utilization (in %).",
            [str(round(g(i, "util", t) * 100)) for i in range(n)],
        )
        family(
            "DCGM_FI_DEV_FB_USED",
            "gauge",
            "Framebuffer memory used (in MiB).",
            [str(round(g(i, "memory_used_ratio", t) * model.memory_bytes / 2**20)) for i in range(n)],
        )
        for name in self.spec.fields:
            if "NVLINK" in name and model.nvlinks == 0:
                continue  # blank on a part without NVLink: dcgm-exporter skips it
            _, dtype, help_text = FIELDS[name]
            values = [self.profiling(i, name, t) for i in range(n)]
            family(
                name,
                "gauge",
                help_text,
                [None if v is None else (f"{v:f}" if dtype == "d" else str(int(v))) for v in values],
            )
        return "\n".join(out) + "\n"


def _huge(size: int) -> Iterator[bytes]:
    line = b'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000"} 40\n' * 1000
    sent = 0
    while sent < size:
        yield line
        sent += len(line)


def _handler(exporter: SimDcgmExporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/metrics/"):
                self.send_error(404)
                return
            fault = exporter.fault()
            kind = fault.kind if fault is not None else ""
            if kind == "refused":
                self.close_connection = True
                self.connection.close()
                return
            if kind == "down":
                self.send_error(500, "Internal Server Error")
                return
            if kind == "slow" and fault is not None:
                time.sleep(fault.seconds)
            try:
                if kind == "huge" and fault is not None:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.end_headers()
                    for chunk in _huge(fault.bytes):
                        self.wfile.write(chunk)
                    return
                body = bytes(range(256)) * 64 if kind == "garbage" else exporter.render().encode()
                self.send_response(200)
                # Go's net/http sniffs the type: dcgm-exporter sets none itself
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the scraper gave up on a body over its cap

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def start_sim_dcgm_exporter(timeline: Timeline) -> SimDcgmExporter | None:
    """The scenario's dcgm-exporter, serving, or None when the scenario has none."""
    spec = timeline.scenario.dcgm_exporter
    return None if spec is None else SimDcgmExporter(timeline, spec)
