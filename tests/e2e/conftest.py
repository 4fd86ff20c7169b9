"""Fixtures for the end-to-end tests against a real vLLM server (CPU build).

Every test under tests/e2e/ is marked ``e2e``. The vLLM venv must exist
(``make vllm-env``, which ``make test`` runs first); without it the tests fail with that
instruction instead of skipping, so CI can not go green without them.

``vllm_server`` is one server for the whole session (a start costs about a minute on two
cores). Its allocator probe is on, writing into ``vllm_server.probe_dir``. A test that
kills the server must restart it (``restart()`` or ``ensure_running()``) before it ends.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_server import ROOT, VllmServer

E2E_DIR = Path(__file__).resolve().parent
ENV_MARKER = ".llmgpu-vllm-env"
E2E_TIMEOUT_S = 900  # a test may pay for a server start and a restart


def vllm_venv() -> Path:
    venv = Path(os.environ.get("VLLM_VENV", ".venv-vllm"))
    return venv if venv.is_absolute() else ROOT / venv


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The vLLM venv's interpreter; fails (never skips) when the venv is not built."""
    venv = vllm_venv()
    python = venv / "bin" / "python"
    if not python.exists() or not (venv / ENV_MARKER).exists():
        pytest.fail(
            f"the vLLM test environment is missing or incomplete at {venv}: "
            "run `make vllm-env` (it runs tests/e2e/vllm_env.sh)",
            pytrace=False,
        )
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    """The tiny random-weight Llama, built on first use into .cache/tiny-llama."""
    out = ROOT / ".cache" / "tiny-llama"
    subprocess.run(
        [str(vllm_python), str(E2E_DIR / "make_tiny_model.py"), "--out", str(out)],
        check=True,
        cwd=ROOT,
        timeout=600,
    )
    return out


@pytest.fixture(scope="session")
def vllm_server(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """A started vLLM: ``.url``, ``.metrics_url``, ``.port``, ``.pid``, ``.kill()``,
    ``.restart()``, ``.load(n)``, ``.log_text()``, ``.probe_dir``."""
    server = VllmServer(
        vllm_python,
        tiny_model,
        env={"LLMGPU_PROBE_INTERVAL": "5"},
        probe_dir=tmp_path_factory.mktemp("probes"),
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
