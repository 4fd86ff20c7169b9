"""What one client, or many, can hold of the HTTP server: connections, time and memory.

uvicorn's HTTP/1.1 protocol, with these bounds added:

- at most `max_connections` open connections, counted from the accept: a TLS connection
  holds its slot through its handshake, which starts only once it has one (a refused
  connection never costs an SSL object). When full, a connection that has had no answer
  yet (just opened, in its handshake, or sending its first request) and has no bytes
  waiting to be read (a request on its way) is dropped to make room, the oldest first;
  failing that, the one idle the longest among those that had
  answers, if idle EVICT_AFTER_S at least; else the newcomer is refused (503 in plain
  HTTP, closed under TLS). A client that was answered thus outranks one that never
  asked: a storm of reconnecting clients churns through its own connections, not
  Prometheus' kept-alive one;
- a TLS handshake, and a TLS close, must end within `header_timeout`; a TLS connection
  reads into a buffer of one TLS record (16 KiB), not asyncio's 256 KiB;
- a connection with no request in progress is closed after `idle_timeout`, and a request
  whose headers are not complete `header_timeout` after its first byte is dropped;
- a request head over MAX_HEAD_BYTES is answered 400 and closed: h11 checks its limit
  only while it waits for more of a head, so it is handed a head no more than one byte
  past the limit at a time (whole, a 200 KB head that arrived in one read got in);
- a response not written out `write_timeout` after its request arrived is dropped;
- a response body is handed to the transport as memoryview slices of the cached bytes,
  each only once the transport has room (its write buffer is capped at one slice), so a
  client that does not read holds at most one slice of copied bytes, not the whole body.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import signal
import socket
import ssl
import struct
import termios
import threading
import time
from asyncio import sslproto
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
EVICT_AFTER_S = 1.0  # an answered connection idle for less is never dropped for a new one
MAX_HEAD_BYTES = 16 * 1024  # a request line and headers; h11's default limit
TLS_READ_BYTES = 16 * 1024  # one TLS record: a request here is a few hundred bytes
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
    refused: int = 0  # full, and no connection to drop: 503 (plain HTTP) or closed (TLS)
    evicted: int = 0  # connections dropped to make room
    idle_closed: int = 0
    header_timeouts: int = 0
    handshake_timeouts: int = 0
    write_timeouts: int = 0


class _TLS(sslproto.SSLProtocol):
    """asyncio's TLS layer, reading into one TLS record's worth instead of 256 KiB: a
    connection that never finished its handshake cost 320 KB, and kept it until the
    deadline."""

    max_size = TLS_READ_BYTES


class _Pool:
    """The connections of one server without a request in progress, by when they became so:
    those never answered (the first to drop for a newcomer), and the answered idle ones."""

    def __init__(
        self, limits: ServerLimits, connect_state: ConnectState | None, tls: ssl.SSLContext | None
    ) -> None:
        self.limits = limits
        self.connect_state = connect_state
        self.tls = tls
        self.stats = ConnectionStats()
        self.unanswered: OrderedDict[GuardedH11, float] = OrderedDict()  # -> monotonic since
        self.idle: OrderedDict[GuardedH11, float] = OrderedDict()
        self.date_second = -1  # the second the Date header was made for


class GuardedH11(H11Protocol):
    pool: ClassVar[_Pool]

    _admitted = False  # handed to uvicorn, which must then see it lost
    _counted = False  # holds a slot of max_connections
    _answered = False  # a response was completed on it
    _tcp: asyncio.Transport | None = None  # under a TLS handshake in progress
    _header_timer: asyncio.TimerHandle | None = None
    _write_timer: asyncio.TimerHandle | None = None

    # ---- connection ------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        if self._counted:  # the TLS layer's transport: the handshake is done
            self._tcp = None
            self._serve(transport)
            return
        pool, limits = self.pool, self.pool.limits
        if pool.stats.open >= limits.max_connections and not self._evict_one():
            pool.stats.refused += 1
            if pool.tls is None:
                transport.write(REFUSED)  # a TLS client could not read it
            transport.close()
            return
        pool.stats.open += 1
        self._counted = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
                # asyncio sets it only on sockets of proto IPPROTO_TCP; `serve` binds its own
                # (proto 0), and Nagle held every answer but a connection's first until the
                # client's delayed ACK: 40 ms per keep-alive request
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if pool.tls is None:
            self._serve(transport)
            return
        # TLS over the counted connection: what loop.create_server(ssl=...) does at every
        # accept, with a smaller buffer, and the slot given back if the handshake fails.
        self._tcp = transport
        pool.unanswered[self] = time.monotonic()
        handshake = self.loop.create_future()
        handshake.add_done_callback(self._handshake_done)
        tls = _TLS(
            self.loop,
            self,
            pool.tls,
            handshake,
            server_side=True,
            ssl_handshake_timeout=limits.header_timeout,  # type: ignore[arg-type]  # seconds, a float
            ssl_shutdown_timeout=limits.header_timeout,
        )
        transport.set_protocol(tls)
        tls.connection_made(transport)

    def _serve(self, transport: Any) -> None:
        self._admitted = True
        super().connection_made(transport)
        if self.pool.connect_state is not None:
            self.app_state = {**self.app_state, **self.pool.connect_state(transport)}
        transport.set_write_buffer_limits(high=SLICE_BYTES, low=0)
        self._become_idle()

    def _handshake_done(self, handshake: asyncio.Future[None]) -> None:
        failed = None if handshake.cancelled() else handshake.exception()
        if isinstance(failed, ConnectionAbortedError):  # asyncio's handshake deadline
            self.pool.stats.handshake_timeouts += 1
        if not self._admitted:  # failed, timed out, or dropped before it ended
            self._tcp = None
            self._release()

    def _evict_one(self) -> bool:
        pool = self.pool
        victim = next((c for c in pool.unanswered if not c._unread()), None)
        if victim is None:
            oldest = next(iter(pool.idle.items()), None)
            if oldest is None or time.monotonic() - oldest[1] < EVICT_AFTER_S:
                return False
            victim = oldest[0]
        pool.stats.evicted += 1
        victim._drop()
        return True

    def _unread(self) -> int:
        """Bytes the kernel holds for us not read yet: a connection accepted in the same
        batch as a storm of others may have its request waiting while they make room."""
        sock = (self.transport if self._tcp is None else self._tcp).get_extra_info("socket")
        if sock is None:
            return 0
        try:
            return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])
        except OSError:
            return 0

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._admitted:
            return  # refused, or its TLS handshake never ended: uvicorn never saw it
        # Also after a drop, which released the slot already: uvicorn forgets the
        # connection only here, and its shutdown waits until it has forgotten them all.
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self.pool.stats.open -= 1
        self.pool.unanswered.pop(self, None)
        self.pool.idle.pop(self, None)
        for timer in (self._header_timer, self._write_timer, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._write_timer = self.timeout_keep_alive_task = None

    def _drop(self) -> None:
        """Close now, unsent bytes and all (close() would wait for a client that does not read)."""
        self._release()
        (self.transport if self._tcp is None else self._tcp).abort()

    # ---- idle, reading a request, writing its response ---------------------------------

    def _become_idle(self) -> None:
        queue = self.pool.idle if self._answered else self.pool.unanswered
        queue[self] = time.monotonic()
        queue.move_to_end(self)
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(
            self.pool.limits.idle_timeout, self.timeout_keep_alive_handler
        )

    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def data_received(self, data: bytes) -> None:
        if self._busy():  # a body, or the next request while this one is answered
            super().data_received(data)
            return
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.pool.limits.header_timeout, self._header_timeout)
        # h11 refuses a head over its limit only while it waits for the rest of one: hand
        # it no more than one byte past the limit at a time, and it sees every long head.
        while data and not self._busy() and not self.transport.is_closing():
            room = max(1, MAX_HEAD_BYTES + 1 - len(self.conn.trailing_data[0]))
            super().data_received(data[:room])
            data = data[room:]
        if data and not self.transport.is_closing():
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
            self.pool.unanswered.pop(self, None)
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
        self._answered = True
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


def protocol_class(
    limits: ServerLimits, connect_state: ConnectState | None = None, tls: ssl.SSLContext | None = None
) -> type[GuardedH11]:
    """A protocol class with a pool of its own: one per server."""
    return type("GuardedH11", (GuardedH11,), {"pool": _Pool(limits, connect_state, tls)})


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
    """uvicorn's server, asleep until a request or a shutdown comes (uvicorn wakes ten
    times a second to keep its Date header current and to notice a shutdown), and a
    SIGTERM that ends `run()` rather than the process. TLS is the protocol's: uvicorn
    serves plain TCP."""

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

    async def shutdown(self, sockets: Any = None) -> None:
        # Connections still in their TLS handshake are not uvicorn's yet: end them here.
        pool = _pool(self)
        for conn in [c for c in pool.unanswered if c._tcp is not None]:
            conn._drop()
        await super().shutdown(sockets)

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
        # ssl_context: made by webconfig from every tls_server_config key
        http=protocol_class(limits, connect_state, ssl_context),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_graceful_shutdown=GRACEFUL_STOP_S,
    )
    config.load()
    return LimitedServer(config)


def _pool(server: uvicorn.Server) -> _Pool:
    http = server.config.http_protocol_class
    assert isinstance(http, type) and issubclass(http, GuardedH11)
    return http.pool


def pool_stats(server: uvicorn.Server) -> ConnectionStats:
    return _pool(server).stats
