"""One bounded scrape: fetch an engine's /metrics and parse it, or say why not.

The body is streamed and abandoned as soon as it passes the size cap; the whole
exchange, headers to last byte, must finish within the timeout (a server that trickles
bytes forever is cut off). Only gzip is asked for, as Prometheus asks (scrape/scrape.go),
and the body is inflated here, a read at a time, never past the cap: httpx would inflate
each read whole, through every coding the server lists, before any cap could look (a
1.8 KB page sent as `gzip, gzip` inflates to 1 GiB). A coding not asked for, more than
one, or a body that does not inflate is refused. The series cap is checked on the raw lines before the
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
import zlib
from dataclasses import dataclass

import httpx
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

ACCEPT = "text/plain;version=0.0.4;q=0.9,*/*;q=0.1"
GZIP = ("gzip", "x-gzip")  # RFC 9110 8.4.1.3: x-gzip is gzip
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
    return any(m in message for m in DNS_MESSAGES)


async def _fetch(client: httpx.AsyncClient, url: str, limits: Limits) -> bytes:
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}
    async with client.stream("GET", url, headers=headers) as response:
        if response.status_code != 200:
            raise ScrapeError("http_status", f"HTTP {response.status_code}")
        ctype = response.headers.get("content-type", "").lower()
        if "html" in ctype or "json" in ctype:
            raise ScrapeError("not_prometheus", f"content-type {ctype}")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > limits.max_bytes:
            raise ScrapeError("too_large", f"content-length {length} > {limits.max_bytes}")
        inflate = _inflater(response.headers.get_list("content-encoding", split_commas=True))
        body = bytearray()
        sent = 0
        async for chunk in response.aiter_raw():  # as sent: httpx decodes nothing
            sent += len(chunk)
            body += chunk if inflate is None else inflate.feed(chunk, limits.max_bytes - len(body))
            if len(body) > limits.max_bytes or sent > limits.max_bytes:
                what = "body" if inflate is None else "inflated body"
                raise ScrapeError("too_large", f"{what} over {limits.max_bytes} bytes")
        if inflate:
            inflate.end()
        return bytes(body)


def _inflater(codings: list[str]) -> _Gunzip | None:
    """What undoes the Content-Encoding: nothing, gzip, or ScrapeError for anything else."""
    listed = [c.lower() for c in codings if c and c.lower() != "identity"]
    if not listed:
        return None
    if len(listed) > 1:
        raise ScrapeError("bad_encoding", f"content-encoding {', '.join(listed)}: one coding at most")
    if listed[0] not in GZIP:
        raise ScrapeError("bad_encoding", f"content-encoding {listed[0]}: only gzip was asked for")
    return _Gunzip()


class _Gunzip:
    """gzip inflated as it arrives, never more than the room left under the cap at a time."""

    def __init__(self) -> None:
        self._z = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing only

    def feed(self, data: bytes, room: int) -> bytes:
        """At most room + 1 bytes (one over says "over the cap"); the rest is never made."""
        try:
            out = self._z.decompress(data, room + 1)
            while self._z.eof and self._z.unused_data and len(out) <= room:  # the next gzip member
                rest, self._z = self._z.unused_data, zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                out += self._z.decompress(rest, room + 1 - len(out))
        except zlib.error as err:
            raise ScrapeError("bad_encoding", f"gzip: {err}") from None
        return out

    def end(self) -> None:
        if not self._z.eof:
            raise ScrapeError("bad_encoding", "gzip: the body ends inside the stream")


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
