"""Scrape targets: where an engine's /metrics is, what engine it is, which processes run it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from exporter.engines.readings import ENGINE_KINDS

FRAGMENT_KEYS = ("pids", "numa", "max_num_seqs", "max_num_batched_tokens")
DEFAULT_PATH = "/metrics"
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
    # what the engine does not report about itself, declared with the target
    numa_nodes: tuple[int, ...] | None = None  # NUMA nodes of its CPUs (known pids only)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None

    @property
    def name(self) -> str:
        """The `target` label: host:port of the URL, and its path unless that is /metrics.
        Unique among targets (their keys differ), and a target's own: two engines behind
        one host:port at different paths are told apart, and one at /metrics keeps its
        label whatever else is scraped."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        path = parts.path or "/"
        return f"{host}:{parts.port or _default_port(parts.scheme)}" + ("" if path == DEFAULT_PATH else path)

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
    process ids, ``#pids=4000000,4000001``: the simulator passes its engines that way;
    and, joined with ``&``, what the engine does not report about itself: ``numa=0,1``
    (the NUMA nodes of its CPUs, with known pids), ``max_num_seqs=256``,
    ``max_num_batched_tokens=8192``.
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
    values: dict[str, tuple[int, ...]] = {}
    for item in filter(None, parts.fragment.split("&")):
        key, _, text_values = item.partition("=")
        if key not in FRAGMENT_KEYS:
            raise TargetError(f"engine target {spec!r}: unknown fragment {item!r}")
        try:
            values[key] = tuple(int(p) for p in text_values.split(",") if p)
        except ValueError:
            raise TargetError(f"engine target {spec!r}: {key} must be integers") from None
        if key.startswith("max_") and len(values[key]) != 1:
            raise TargetError(f"engine target {spec!r}: {key} takes one integer")
    url = urlunsplit((parts.scheme, parts.netloc, parts.path or DEFAULT_PATH, parts.query, ""))
    seqs, tokens = values.get("max_num_seqs"), values.get("max_num_batched_tokens")
    return Target(
        url=url,
        kind=kind,
        source=source,
        pids=values.get("pids", ()),
        numa_nodes=values.get("numa"),
        max_num_seqs=seqs[0] if seqs else None,
        max_num_batched_tokens=tokens[0] if tokens else None,
    )


def spec_of(target: Target) -> str:
    """The inverse of parse_spec, for targets that carry their pids (the simulator's)."""
    text = target.url
    items = [
        f"{key}={','.join(str(v) for v in values)}"
        for key, values in (
            ("pids", target.pids),
            ("numa", target.numa_nodes or ()),
            ("max_num_seqs", (target.max_num_seqs,) if target.max_num_seqs else ()),
            (
                "max_num_batched_tokens",
                (target.max_num_batched_tokens,) if target.max_num_batched_tokens else (),
            ),
        )
        if values
    ]
    if items:
        text += "#" + "&".join(items)
    return f"{target.kind}={text}" if target.kind else text
