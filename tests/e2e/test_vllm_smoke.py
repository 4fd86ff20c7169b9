"""The real vLLM server is up, completes requests, and serves its Prometheus page."""

from __future__ import annotations

import time

import httpx
import pytest
from vllm_server import VllmServer


def test_server_is_healthy_on_loopback(vllm_server: VllmServer) -> None:
    assert vllm_server.url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200
    models = httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == ["tiny"]


def test_completions_plain_and_streaming(vllm_server: VllmServer) -> None:
    plain = vllm_server.complete("the gpu node", max_tokens=40)
    streamed = vllm_server.complete("the gpu node", max_tokens=40, stream=True)
    assert plain.completion_tokens == 40
    assert streamed.completion_tokens == 40
    assert plain.text == streamed.text  # greedy decoding of the same prompt


def generation_tokens(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:generation_tokens_total{")
    )


def test_metrics_page_has_engine_series(vllm_server: VllmServer) -> None:
    before = generation_tokens(vllm_server.metrics())
    vllm_server.load(4, streaming=2)
    deadline = time.monotonic() + 15
    text = vllm_server.metrics()
    while generation_tokens(text) < before + 4 * 40 and time.monotonic() < deadline:
        time.sleep(0.5)
        text = vllm_server.metrics()
    assert "vllm:num_requests_running" in text
    assert 'model_name="tiny"' in text
    assert generation_tokens(text) >= before + 4 * 40


def test_kill_and_restart_on_the_same_port(vllm_server: VllmServer) -> None:
    port, old_pids = vllm_server.port, vllm_server.pids()
    vllm_server.kill()
    assert not vllm_server.running()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{vllm_server.url}/health", timeout=2)
    vllm_server.restart()
    assert vllm_server.port == port
    assert not set(vllm_server.pids()) & set(old_pids)
    assert vllm_server.complete("after restart", max_tokens=8).completion_tokens == 8
