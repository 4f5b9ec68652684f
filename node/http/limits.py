"""The HTTP port under hostile connections (docs/raft.md, "Hostile connections", the same rules).

A connection is *pending* from accept until its first request head is parsed
(``Api._edge`` calls ``ConnectionGuard.headed``). A pending connection is closed
``handshake_timeout`` after accept (asyncio's TLS handshake gets the same deadline);
at most ``max_pending`` are open, more are closed at once. aiohttp alone keeps a
silent connection for its keep-alive timeout and any number of them.

Accept failing with EMFILE/ENFILE/ENOBUFS/ENOMEM is temporary in asyncio already
(it pauses the listener for a second and resumes; ECONNABORTED is skipped); it
reports each one to the loop's exception handler, which ``install_accept_handler``
turns into a counted, rate-limited log line instead of a traceback.
"""
from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("terrascale.node")
_ACCEPT_MESSAGE = "socket.accept() out of system resource"  # asyncio's, see selector_events.py


class ConnectionGuard:
    """Deadline and cap for pending HTTP connections; ``refused(reason)`` counts refusals."""

    def __init__(self, handshake_timeout: float, max_pending: int, refused: Callable[[str], None]):
        self.handshake_timeout, self.max_pending, self._refused = handshake_timeout, max_pending, refused
        self.pending: dict[asyncio.Transport, tuple[asyncio.TimerHandle, float]] = {}

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(self, inner())

    def admit(self, transport: asyncio.Transport) -> bool:
        if len(self.pending) >= self.max_pending:
            self._refused("pending_cap")
            transport.abort()
            return False
        loop = asyncio.get_running_loop()
        self.pending[transport] = (loop.call_later(self.handshake_timeout, self._expire, transport), loop.time())
        return True

    def shed(self, older_than: float) -> None:
        """Out of descriptors: close pending connections older than ``older_than`` seconds."""
        now = asyncio.get_running_loop().time()
        for t in [t for t, (_, at) in self.pending.items() if now - at > older_than]:
            self.pending.pop(t)[0].cancel()
            self._refused("shed")
            t.abort()

    def _expire(self, transport: asyncio.Transport) -> None:
        if self.pending.pop(transport, None) is not None:
            self._refused("handshake_timeout")
            transport.abort()

    def headed(self, transport: asyncio.Transport | None) -> None:
        """The connection delivered a request head: no longer pending."""
        if transport is None:  # never admitted: not pending
            return
        got = self.pending.pop(transport, None)
        if got is not None:
            got[0].cancel()

    forget = headed


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol, with the guard told of the connection's start and end."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self._guard, self._inner = guard, inner
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream server's connection: asyncio's are Transports (uvloop's have their methods, not the base class)
        stream = cast(asyncio.Transport, transport)
        self._transport = stream
        self._inner.connection_made(stream)
        self._guard.admit(stream)

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.forget(self._transport)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(web.TCPSite):
    """``web.TCPSite`` whose connections pass the guard, with the TLS handshake deadline."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int | None, *, guard: ConnectionGuard,
                 ssl_context: SSLContext | None = None, backlog: int = 1024):
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=backlog)
        self._guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None  # the runner is set up before its sites start (web.TCPSite asserts it too)
        handshake = self._guard.handshake_timeout if self._ssl_context else None  # None: asyncio's default
        self._server = await loop.create_server(self._guard.factory(server), self._host, self._port,
                                                ssl=self._ssl_context, backlog=self._backlog,
                                                ssl_handshake_timeout=handshake)


def install_accept_handler(loop: asyncio.AbstractEventLoop, refused: Callable[[str], None],
                           guard: ConnectionGuard | None = None) -> None:
    """Count and log (once a second at most) asyncio's temporary accept failures; pending
    connections older than a second are shed then (a real client sends its request at once)."""
    last = [0.0]
    previous = loop.get_exception_handler()

    def handler(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if context.get("message") == _ACCEPT_MESSAGE and isinstance(exc, OSError):
            assert exc.errno is not None  # asyncio reports EMFILE, ENFILE, ENOBUFS and ENOMEM here
            name = errno.errorcode.get(exc.errno, str(exc.errno))
            refused(f"accept_{name.lower()}")
            if guard is not None:
                guard.shed(1.0)
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                log.warning("event=http_accept_failed errno=%s backoff_s=1 (listener kept)", name)
            return
        if previous is not None:
            previous(lp, context)
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)
