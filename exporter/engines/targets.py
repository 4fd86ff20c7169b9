"""Scrape targets: where an engine's /metrics is, what engine it is, which processes run it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from exporter.engines.readings import ENGINE_KINDS

LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", ""})


class TargetError(ValueError):
    """An engine target that cannot be understood; the message names it."""


@dataclass(frozen=True)
class Target:
    """One engine endpoint to scrape.

    `pids` are known process ids of the engine (the simulator's, which psutil cannot
    see); for every other target the scraper finds the process tree itself, from
    `root_pid` (local discovery) or from the process listening on the URL's port.
    """

    url: str
    kind: str | None = None
    source: str = "static"  # static, process, kubernetes
    pids: tuple[int, ...] = ()
    root_pid: int | None = None
    interval_s: float | None = None  # None: the engine_interval setting
    timeout_s: float | None = None  # None: the engine_timeout setting
    namespace: str | None = None
    pod: str | None = None
    pod_uid: str | None = None

    @property
    def name(self) -> str:
        """The `target` label: host:port of the URL."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{parts.port or _default_port(parts.scheme)}"

    @property
    def key(self) -> str:
        """Identity for de-duplication: loopback spellings count as one host."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if host in LOOPBACK:
            host = "127.0.0.1"
        return f"{host}:{parts.port or _default_port(parts.scheme)}{parts.path or '/'}"

    @property
    def is_local(self) -> bool:
        return (urlsplit(self.url).hostname or "") in LOOPBACK


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def parse_spec(spec: str, source: str = "static") -> Target:
    """A target from the `engines` setting or `--engine`: ``[TYPE=]URL``.

    URL may omit the scheme (http) and the path (/metrics). The fragment may carry known
    process ids, ``#pids=4000000,4000001``: the simulator passes its engines that way.
    """
    text = spec.strip()
    if not text:
        raise TargetError("empty engine target")
    kind: str | None = None
    head, sep, rest = text.partition("=")
    if sep and "/" not in head and ":" not in head:
        kind, text = head.strip().lower(), rest.strip()
        if kind not in ENGINE_KINDS:
            raise TargetError(f"engine target {spec!r}: type must be one of {', '.join(ENGINE_KINDS)}")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"engine target {spec!r}: expected [TYPE=]http(s)://HOST:PORT/PATH")
    try:
        _ = parts.port
    except ValueError as err:
        raise TargetError(f"engine target {spec!r}: {err}") from None
    pids: tuple[int, ...] = ()
    if parts.fragment:
        key, _, values = parts.fragment.partition("=")
        if key != "pids":
            raise TargetError(f"engine target {spec!r}: unknown fragment {parts.fragment!r}")
        try:
            pids = tuple(int(p) for p in values.split(",") if p)
        except ValueError:
            raise TargetError(f"engine target {spec!r}: pids must be integers") from None
    url = urlunsplit((parts.scheme, parts.netloc, parts.path or "/metrics", parts.query, ""))
    return Target(url=url, kind=kind, source=source, pids=pids)


def spec_of(target: Target) -> str:
    """The inverse of parse_spec, for targets that carry their pids (the simulator's)."""
    text = target.url
    if target.pids:
        text += "#pids=" + ",".join(str(p) for p in target.pids)
    return f"{target.kind}={text}" if target.kind else text
