"""One bounded scrape: fetch an engine's /metrics and parse it, or say why not.

The body is streamed and abandoned as soon as it passes the size cap; the whole
exchange, headers to last byte, must finish within the timeout (a server that trickles
bytes forever is cut off). The series cap is checked on the raw lines before the
parser runs, so a page of 100 000 label values costs a line count, not a parse. So are
the label caps: only a line longer than the longest allowed value, or with more quotes
than the allowed labels have, is looked at closely (a regular expression over its label
set), so a 1 MiB label value is refused before the parser copies it, and a normal page
costs a length and a count per line.
"""

from __future__ import annotations

import asyncio
import re
import socket
from dataclasses import dataclass

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
MAX_LABELS = 64  # vLLM's widest info series (cache_config_info) has about 30
MAX_LABEL_LENGTH = 2048  # a model path or a comma-joined list of LoRA adapters fits
_QUOTED = re.compile(r'"((?:[^"\\\n]|\\.)*)"')  # a label value, escapes and all
_ESCAPE = re.compile(r"\\.")


class ScrapeError(Exception):
    """A failed scrape; `reason` is one of readings.SCRAPE_ERRORS."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Limits:
    timeout_s: float
    max_bytes: int
    max_series: int
    max_labels: int = MAX_LABELS
    max_label_length: int = MAX_LABEL_LENGTH


async def fetch(client: httpx.AsyncClient, url: str, limits: Limits) -> bytes:
    """The body of a 200 answer, within the limits, or ScrapeError."""
    try:
        return await asyncio.wait_for(_fetch(client, url, limits), timeout=limits.timeout_s)
    except asyncio.TimeoutError:
        raise ScrapeError("timeout", f"no complete answer within {limits.timeout_s:g} s") from None
    except httpx.TimeoutException as err:
        raise ScrapeError("timeout", type(err).__name__) from None
    except httpx.ConnectError as err:
        if isinstance(err.__cause__ or err.__context__, socket.gaierror) or _is_dns(str(err)):
            raise ScrapeError("dns", str(err) or "the host name does not resolve") from None
        raise ScrapeError("refused", str(err) or type(err).__name__) from None
    except httpx.HTTPError as err:  # protocol errors, resets mid-body
        raise ScrapeError("connection", str(err) or type(err).__name__) from None
    except OSError as err:
        raise ScrapeError("connection", str(err)) from None


DNS_MESSAGES = (
    "Name or service not known",
    "nodename nor servname",
    "No address associated",
    "Temporary failure in name resolution",
)


def _is_dns(message: str) -> bool:
    """getaddrinfo's failures, as httpx words them (the cause is not always chained)."""
    return any(
        m in message
        for m in (
            "Name or service not known",
            "nodename nor servname",
            "No address associated",
            "Temporary failure in name resolution",
        )
    )


async def _fetch(client: httpx.AsyncClient, url: str, limits: Limits) -> bytes:
    async with client.stream("GET", url, headers={"Accept": ACCEPT}) as response:
        if response.status_code != 200:
            raise ScrapeError("http_status", f"HTTP {response.status_code}")
        ctype = response.headers.get("content-type", "").lower()
        if "html" in ctype or "json" in ctype:
            raise ScrapeError("not_prometheus", f"content-type {ctype}")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limits.max_bytes:
            raise ScrapeError("too_large", f"content-length {length} > {limits.max_bytes}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limits.max_bytes:
                raise ScrapeError("too_large", f"body over {limits.max_bytes} bytes")
        return bytes(body)


def _check_labels(line: str, max_labels: int, max_length: int) -> None:
    """ScrapeError if the sample line has too many labels or too long a value."""
    start = line.find("{")
    if start < 0:
        return
    name = line[:start].strip()[:100]
    values = _QUOTED.findall(line, start)
    if len(values) > max_labels:
        raise ScrapeError("too_many_labels", f"{name}: {len(values)} labels > {max_labels}")
    for value in values:
        if len(value) > max_length and len(_ESCAPE.sub("x", value)) > max_length:
            raise ScrapeError(
                "label_too_long", f"{name}: a label value of {len(value)} characters > {max_length}"
            )


def parse(
    body: bytes, max_series: int, max_labels: int = MAX_LABELS, max_label_length: int = MAX_LABEL_LENGTH
) -> list[Metric]:
    """Metric families from an exposition body, or ScrapeError."""
    text = body.decode("utf-8", errors="replace")
    head = text.lstrip()[:256].lower()
    if head.startswith("<") or "<html" in head or "\ufffd" in text[:4096]:
        raise ScrapeError("not_prometheus", "HTML or binary body")
    lines = 0
    quotes = 2 * max_labels
    for line in text.splitlines():
        if line and not line.startswith("#"):
            lines += 1
            if len(line) > max_label_length or line.count('"') > quotes:
                _check_labels(line, max_labels, max_label_length)
    if lines > max_series:
        raise ScrapeError("too_many_series", f"{lines} samples > {max_series}")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as err:  # the parser raises ValueError, IndexError, KeyError, ...
        raise ScrapeError("not_prometheus", f"{type(err).__name__}: {err}"[:200]) from None
    if sum(len(f.samples) for f in families) > max_series:
        raise ScrapeError("too_many_series", f"more than {max_series} samples")
    return families
