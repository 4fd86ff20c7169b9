"""Re-create tests/fixtures/vllm/ from a real vLLM server (CPU build, tiny Llama).

    make vllm-env && .venv/bin/python tests/e2e/capture_fixtures.py

Writes two complete /metrics pages of vLLM 0.32 (``--enable-prefix-caching
--max-model-len 1024``, allocator probe off):

* ``vllm-0.32-cpu-idle.txt``: right after the server became healthy;
* ``vllm-0.32-cpu-loaded.txt``: after 8 completions of 40 tokens (``ignore_eos``),
  4 streamed and 4 not, 4 at a time, sharing a long prompt prefix.

The pages are stored as served, so parsers are tested on the real thing (HELP text,
``_created`` series, label order, float formatting).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm_server import ROOT, VllmServer

OUT = ROOT / "tests" / "fixtures" / "vllm"
IDLE = "vllm-0.32-cpu-idle.txt"
LOADED = "vllm-0.32-cpu-loaded.txt"
REQUESTS, STREAMING, MAX_TOKENS = 8, 4, 40


def sample_value(text: str, name: str) -> float:
    """Sum of a metric's samples on a page (all label sets)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}{{") or line.startswith(f"{name} "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    venv = Path(os.environ.get("VLLM_VENV", ".venv-vllm"))
    venv = venv if venv.is_absolute() else ROOT / venv
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"no vLLM venv at {venv}: run `make vllm-env` first", file=sys.stderr)
        return 2
    model = ROOT / ".cache" / "tiny-llama"
    subprocess.run([str(python), str(ROOT / "tests/e2e/make_tiny_model.py")], check=True)

    env = {"LLMGPU_PROBE_DIR": ""}  # the probe stays inert: fixtures show vLLM alone
    server = VllmServer(python, model, env=env)
    server.start()
    try:
        print(f"vLLM healthy after {server.start_seconds[-1]:.1f} s on port {server.port}")
        idle = server.metrics()
        result = server.load(REQUESTS, streaming=STREAMING, max_tokens=MAX_TOKENS)
        expected = REQUESTS * MAX_TOKENS
        assert result.completion_tokens == expected, result
        deadline = time.monotonic() + 30
        while True:
            loaded = server.metrics()
            done = sample_value(loaded, "vllm:request_success_total")
            if sample_value(loaded, "vllm:generation_tokens_total") >= expected and (done >= REQUESTS):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("vLLM's counters never caught up with the load")
            time.sleep(0.5)
    finally:
        server.stop()

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / IDLE).write_text(idle)
    (args.out / LOADED).write_text(loaded)
    print(f"wrote {args.out / IDLE} and {args.out / LOADED}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
