"""A small client of the Prometheus HTTP query API (Prometheus, VictoriaMetrics, Thanos).

Only what the diagnosis needs: instant queries, range queries, and the errors a person
can act on told apart (nothing answers, the server refuses us, it answers something
else than the API).
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx


class TsdbError(Exception):
    """The query API could not be used; the message says why."""


class Unreachable(TsdbError):
    """Nothing answered: refused, unknown host, timeout, TLS handshake failed."""


class Refused(TsdbError):
    """The server answered 401/403: credentials missing or wrong."""


class BadAnswer(TsdbError):
    """The server answered, but not as the query API does (or with a query error)."""


class Truncated(BadAnswer):
    """A success answer that broke off (seen behind a loaded proxy): worth another try."""


RETRIES = 3


@dataclass(frozen=True)
class Connection:
    """Where the API is and how to authenticate to it."""

    url: str
    user: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_s: float = 60.0
    headers: Mapping[str, str] | None = None

    def tls(self) -> ssl.SSLContext | bool:
        if not self.url.startswith("https://"):
            return True
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


@dataclass(frozen=True)
class Series:
    """One series of a query result: its labels and (unix seconds, value) points, NaN left out."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


class QueryApi:
    def __init__(self, conn: Connection) -> None:
        if not conn.url.startswith(("http://", "https://")):
            raise TsdbError(f"{conn.url!r} is not an http:// or https:// URL")
        if conn.user is not None and conn.bearer_token is not None:
            raise TsdbError("use basic auth or a bearer token, not both")
        headers = dict(conn.headers or {})
        if conn.bearer_token is not None:
            headers["Authorization"] = f"Bearer {conn.bearer_token}"
        try:
            verify = conn.tls()
        except (OSError, ssl.SSLError) as err:
            raise TsdbError(f"cannot load the TLS files: {err}") from None
        self.url = conn.url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            auth=httpx.BasicAuth(conn.user, conn.password or "") if conn.user is not None else None,
            headers=headers,
            verify=verify,
            timeout=conn.timeout_s,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> QueryApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        for attempt in range(RETRIES):
            try:
                return self._once(path, params)
            except Truncated:
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def _once(self, path: str, params: Mapping[str, str]) -> Any:
        try:
            resp = self._client.post(f"/api/v1/{path}", data=dict(params))
        except httpx.TimeoutException as err:
            raise Unreachable(f"{self.url} did not answer in time ({type(err).__name__})") from None
        except httpx.TransportError as err:
            raise Unreachable(f"cannot reach {self.url}: {err}") from None
        if resp.status_code in (401, 403):
            raise Refused(f"{self.url} refused the query (HTTP {resp.status_code}): check the credentials")
        try:
            body = resp.json()
        except ValueError:
            if resp.status_code == 200 and resp.text.startswith('{"status":"success"'):
                raise Truncated(f"{self.url}/api/v1/{path}: the answer broke off") from None
            raise BadAnswer(
                f"{self.url}/api/v1/{path} answered HTTP {resp.status_code} without JSON "
                f"({resp.text[:120]!r}): is this the Prometheus query API?"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            what = body.get("error") if isinstance(body, dict) else None
            raise BadAnswer(f"{self.url} rejected the query (HTTP {resp.status_code}): {what or body!r}")
        return body.get("data")

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query; a range selector (`x[5m]`) gives the raw samples."""
        data = self._get("query", {"query": expr, "time": _ts(at)})
        return _series(data)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "query_range", {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)}
        )
        return _series(data)


def _ts(t: float) -> str:
    return f"{t:.3f}"


def _series(data: Any) -> list[Series]:
    if not isinstance(data, dict) or data.get("resultType") not in ("matrix", "vector"):
        raise BadAnswer(f"unexpected result: {str(data)[:200]}")
    out = []
    for item in data.get("result") or []:
        raw = item.get("values") or ([item["value"]] if "value" in item else [])
        points = []
        for t, v in raw:
            value = float(v)
            if not math.isnan(value):
                points.append((float(t), value))
        out.append(Series(dict(item.get("metric") or {}), tuple(points)))
    return out
