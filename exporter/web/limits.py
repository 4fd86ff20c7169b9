"""What one client, or many, can hold of the HTTP server: connections, time and memory.

uvicorn's HTTP/1.1 protocol, with four bounds added:

- at most `max_connections` open connections; when full, the connection idle the
  longest (no request in progress, idle for EVICT_AFTER_S at least) is dropped to make
  room, else the newcomer is answered 503 and closed;
- a connection with no request in progress is closed after `idle_timeout`, and a request
  whose headers are not complete `header_timeout` after its first byte is dropped;
- a response not written out `write_timeout` after its request arrived is dropped;
- a response body is handed to the transport as memoryview slices of the cached bytes,
  each only once the transport has room (its write buffer is capped at one slice), so a
  client that does not read holds at most one slice of copied bytes, not the whole body.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]
# Per-connection state a TLS policy puts into each request's scope (client certificate).
ConnectState = Callable[[asyncio.BaseTransport], dict[str, Any]]

SLICE_BYTES = 16 * 1024  # copied bytes a stalled connection may hold
# The kernel's send buffer per connection, fixed instead of auto-tuned (up to 4 MiB on
# Linux): a client that does not read then holds 256 KiB of kernel memory, not a whole
# body, and costs a few slice writes, not a hundred. 256 KiB in flight still carries a
# scrape at 50 MB/s over a 5 ms round trip.
SEND_BUFFER_BYTES = 128 * 1024  # Linux doubles it
EVICT_AFTER_S = 1.0  # an idle connection younger than this is never dropped for a new one
# How long a stop waits for responses in flight before it closes their connections: well
# inside a pod's termination grace (30 s by default), so a stop never ends in SIGKILL.
GRACEFUL_STOP_S = 5
REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 21\r\n"
    b"retry-after: 1\r\nconnection: close\r\n\r\ntoo many connections\n"
)


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 1024
    idle_timeout: float = 5.0
    header_timeout: float = 10.0
    write_timeout: float = 30.0


@dataclass
class ConnectionStats:
    """What the limits did, for tests and the benchmark."""

    open: int = 0
    refused: int = 0  # answered 503: full, and no connection idle long enough to drop
    evicted: int = 0  # idle connections dropped to make room
    idle_closed: int = 0
    header_timeouts: int = 0
    write_timeouts: int = 0


class _Pool:
    """The connections of one server; the idle ones in the order they became idle."""

    def __init__(self, limits: ServerLimits, connect_state: ConnectState | None) -> None:
        self.limits = limits
        self.connect_state = connect_state
        self.stats = ConnectionStats()
        self.idle: OrderedDict[GuardedH11, float] = OrderedDict()  # -> monotonic idle since
        self.date_second = -1  # the second the Date header was made for


class GuardedH11(H11Protocol):
    pool: ClassVar[_Pool]

    _admitted = False  # handed to uvicorn, which must then see it lost
    _counted = False  # holds a slot of max_connections
    _header_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    # ---- connection ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        pool, limits = self.pool, self.pool.limits
        if pool.stats.open >= limits.max_connections and not self._evict_one():
            pool.stats.refused += 1
            transport.write(REFUSED)
            transport.close()
            return
        pool.stats.open += 1
        self._admitted = self._counted = True
        super().connection_made(transport)
        if pool.connect_state is not None:
            self.app_state = {**self.app_state, **pool.connect_state(transport)}
        transport.set_write_buffer_limits(high=SLICE_BYTES, low=0)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._become_idle()

    def _evict_one(self) -> bool:
        pool = self.pool
        oldest = next(iter(pool.idle.items()), None)
        if oldest is None or time.monotonic() - oldest[1] < EVICT_AFTER_S:
            return False
        pool.stats.evicted += 1
        oldest[0]._drop()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return  # refused: uvicorn never saw it
        # Also after a drop, which released the slot already: uvicorn forgets the
        # connection only here, and its shutdown waits until it has forgotten them all.
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self.pool.stats.open -= 1
        self.pool.idle.pop(self, None)
        for timer in (self._header_timer, self._write_timer, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._write_timer = self.timeout_keep_alive_task = None

    def _drop(self) -> None:
        """Close now, unsent bytes and all (close() would wait for a client that does not read)."""
        self._release()
        self.transport.abort()

    # ---- idle, reading a request, writing its response ---------------------------------

    def _become_idle(self) -> None:
        self.pool.idle[self] = time.monotonic()
        self.pool.idle.move_to_end(self)
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.pool.limits.idle_timeout, self.timeout_keep_alive_handler
        )

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if not self._busy() and self._header_timer is None:
            self._header_timer = self.loop.call_later(self.pool.limits.header_timeout, self._header_timeout)
        super().data_received(data)

    def handle_events(self) -> None:
        # The Date header is made here, at most once a second and only when requests come,
        # rather than by a server loop that ticks to keep it current.
        now = time.time()
        if int(now) != self.pool.date_second:
            self.pool.date_second = int(now)
            date = [(b"date", formatdate(now, usegmt=True).encode())] if self.config.date_header else []
            self.server_state.default_headers = date + self.config.encoded_headers
        before = self.cycle
        super().handle_events()
        if self.cycle is not before and self._counted:  # a complete request: its response starts
            self.pool.idle.pop(self, None)
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            self._write_timer = self.loop.call_later(self.pool.limits.write_timeout, self._write_timeout)

    def on_response_complete(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        super().on_response_complete()
        if self._counted and not self.transport.is_closing() and not self._busy():
            self._become_idle()

    def _header_timeout(self) -> None:
        self.pool.stats.header_timeouts += 1
        self._drop()

    def _write_timeout(self) -> None:
        self.pool.stats.write_timeouts += 1
        self._drop()

    def timeout_keep_alive_handler(self) -> None:
        if self._busy() or self._header_timer is not None:
            return  # reading or answering a request: other timers own it now
        self.pool.stats.idle_closed += 1
        self._drop()


def protocol_class(limits: ServerLimits, connect_state: ConnectState | None = None) -> type[GuardedH11]:
    """A protocol class with a pool of its own: one per server."""
    return type("GuardedH11", (GuardedH11,), {"pool": _Pool(limits, connect_state)})


class SliceBodies:
    """ASGI middleware: a large body goes out as memoryview slices of the same bytes.

    uvicorn waits for the transport to have room before each message, so with the write
    buffer capped at one slice, a stalled client costs one slice, not a copy of the body.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def sliced(message: Message) -> None:
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= SLICE_BYTES:
                await send(message)
                return
            view = memoryview(body)
            more = message.get("more_body", False)
            for start in range(0, len(view), SLICE_BYTES):
                end = start + SLICE_BYTES
                await send(
                    {
                        "type": "http.response.body",
                        "body": view[start:end],
                        "more_body": more or end < len(view),
                    }
                )

        await self.app(scope, receive, sliced)


class LimitedServer(uvicorn.Server):
    """uvicorn's server, with a TLS handshake bounded by the header timeout, asleep until
    a request or a shutdown comes (uvicorn wakes ten times a second to keep its Date
    header current and to notice a shutdown), and a SIGTERM that ends `run()` rather than
    the process."""

    _exit = False
    _wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    @property
    def should_exit(self) -> bool:
        return self._exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        # Set by uvicorn's signal handler or by another thread: wake the loop to end it.
        self._exit = value
        if value and self._wake is not None:
            loop, event = self._wake
            loop.call_soon_threadsafe(event.set)

    def __init__(self, config: uvicorn.Config, handshake_timeout: float) -> None:
        super().__init__(config)
        self.handshake_timeout = handshake_timeout

    async def startup(self, sockets: Any = None) -> None:
        if self.config.ssl is None:
            return await super().startup(sockets)
        # uvicorn does not pass ssl_handshake_timeout (asyncio's default is 60 s): a client
        # that connects and never finishes the handshake would hold a socket that long.
        loop: Any = asyncio.get_running_loop()
        loop.create_server = functools.partial(
            loop.create_server, ssl_handshake_timeout=self.handshake_timeout
        )
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # uvicorn raises a caught SIGINT/SIGTERM again once it has stopped, and the default
        # handler then ends the process before its caller can close NVML and the simulator.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def main_loop(self) -> None:
        event = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), event)
        if not self._exit:
            await event.wait()


def build_server(
    app: ASGIApp,
    host: str,
    port: int,
    limits: ServerLimits,
    *,
    ssl_context: Any = None,
    connect_state: ConnectState | None = None,
    log_level: str = "warning",
) -> LimitedServer:
    config = uvicorn.Config(
        SliceBodies(app),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        http=protocol_class(limits, connect_state),
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    config.load()
    config.ssl = ssl_context  # made by webconfig from every tls_server_config key
    return LimitedServer(config, handshake_timeout=limits.header_timeout)


def pool_stats(server: uvicorn.Server) -> ConnectionStats:
    http = server.config.http_protocol_class
    assert isinstance(http, type) and issubclass(http, GuardedH11)
    return http.pool.stats
