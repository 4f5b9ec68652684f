"""Python clients for a Terrascale node (docs/REFERENCE.md §6): ``Client`` (blocking) and ``AsyncClient``.

Both mirror the HTTP API (docs/openapi.yaml) one method per endpoint and return
what the API returns: dicts, or a ``pyarrow.Table`` for rows (query results come
as Arrow IPC streams, so types survive exactly). Rows go in as a ``pyarrow.Table``
/ ``RecordBatch`` (sent as an Arrow IPC stream) or a list of JSON-ready dicts.
Every error answer raises :class:`ApiError` with the documented status, code and
message; a node that cannot be reached raises ``ConnectionError``.

The methods are written once (node/client/endpoints.py); this module is only how their
requests travel. ``Client`` keeps one keep-alive connection (``http.client``) and is not
thread-safe: use one per thread. ``AsyncClient`` uses an aiohttp session; close it (or use
``async with``).
"""
from __future__ import annotations

import asyncio
import http.client
import ssl
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import pyarrow as pa

from catalog.retry import Retry, call
from node.client.endpoints import IDEMPOTENT, Endpoints, Request, ScanResult, api_error, headers
from node.client.subscribe import EVENT_STREAM, Resume, Resumed
from node.errors import ApiError

if TYPE_CHECKING:  # imported when an AsyncClient first sends: the blocking client and the CLI start without it
    import aiohttp

IDLE_RECONNECT_S = 30  # below the server's keep-alive timeout (aiohttp: 75 s): never reuse a connection it may drop
# A kept-alive connection the server closed meanwhile: open a new one and send again at once
# (a request safe to repeat only, as aiohttp does for AsyncClient).
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
_RECONNECT = Retry(attempts=2, base=0)


class Client(Endpoints[Any]):
    """Blocking client. ``Client("http://127.0.0.1:7400", token=None)``."""

    def __init__(self, endpoint: str = "http://127.0.0.1:7400", token: str | None = None, timeout: float = 300,
                 verify: bool | str = True) -> None:
        u = urlsplit(endpoint)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"endpoint must be http(s)://host:port, not {endpoint!r}")
        self.endpoint, self.token, self.timeout = endpoint.rstrip("/"), token, timeout
        self._tls = u.scheme == "https"
        self._host, self._port = u.hostname, u.port or (443 if self._tls else 80)
        self._verify = verify
        self._conn: http.client.HTTPConnection | None = None
        self._last = 0.0
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls:
            ctx = ssl.create_default_context(cafile=self._verify if isinstance(self._verify, str) else None)
            if self._verify is False:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                accept: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        """One raw request; returns (status, body, headers) without raising on error statuses."""
        h = headers(self.token, content_type, accept)
        stale = (lambda e: isinstance(e, _STALE)) if method in IDEMPOTENT else (lambda e: False)
        with self._lock:
            if self._conn is not None and time.monotonic() - self._last > IDLE_RECONNECT_S:
                self.close()
            try:
                return call(lambda: self._exchange(method, path, body, h), stale, _RECONNECT)
            except _STALE as e:
                raise ConnectionError(f"{self.endpoint}: {e}") from e
            except OSError as e:
                raise ConnectionError(f"cannot reach {self.endpoint}: {e.strerror or e}") from e

    def _exchange(self, method: str, path: str, body: bytes | None,
                  h: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
        if self._conn is None:
            self._conn = self._connect()
        try:
            self._conn.request(method, path, body=body, headers=h)
            r = self._conn.getresponse()
            data = r.read()
        except OSError:
            self.close()  # never reuse a connection in an unknown state
            raise
        self._last = time.monotonic()
        return r.status, data, {k.lower(): v for k, v in r.getheaders()}

    def scan(self, table: str, prefix: Any = None, start: Any = None, end: Any = None, where: Any = None,
             bbox: Any = None, columns: Any = None, as_of: int | None = None,
             page_rows: int = 10_000) -> Iterator[pa.RecordBatch]:
        """Every row of an ordered scan (``scan_page``), in key order, as Arrow record batches
        — page by page at one snapshot, never the whole answer in memory."""
        page: ScanResult = self.scan_page(table, prefix, start, end, where, bbox, columns, page_rows, as_of)
        while True:
            yield from page.rows.to_batches()
            if page.next is None:
                return
            page = self.scan_page(table, after=page.next)

    def subscribe(self, table: str, where: Any = None, bbox: Any = None, prefix: Any = None, columns: Any = None,
                  from_ts: int | None = None, retry_for: float = 300.0,
                  idle_timeout: float = 30.0) -> Iterator[dict[str, Any]]:
        """A live query (docs/rfcs/0015-subscriptions.md): the table's committed changes whose
        new or old version matches, with ``commit_ts > from_ts`` (None: from now), as they
        come — ``{"op", "commit_ts", "row"}`` items, each yielded once a ``{"closed": T}`` item
        after it says every change at or below T was yielded. Across dropped connections,
        node restarts and the node ending the subscription it resumes by itself from the last
        closed T, exactly once; it gives up (raising) after ``retry_for`` seconds without a
        frame, or at once on an error that is the caller's (a bad filter, an unknown table)."""
        r = Resume(table, where, bbox, prefix, columns, from_ts, retry_for)
        while True:
            try:
                yield from self._events(r, idle_timeout)
            except (ApiError, Resumed) as e:
                time.sleep(r.broken(e))
            except (OSError, http.client.HTTPException) as e:
                time.sleep(r.broken(ConnectionError(f"{self.endpoint}: {e}")))

    def _events(self, r: Resume, idle_timeout: float) -> Iterator[dict[str, Any]]:
        """One connection's items (server-sent events on a connection of its own)."""
        conn = self._connect()
        conn.timeout = idle_timeout  # the node sends a closed frame every second: silence is a dead link
        try:
            conn.request("GET", r.path(), headers=headers(self.token, None, EVENT_STREAM))
            resp = conn.getresponse()
            if resp.status != 200:
                raise api_error(resp.status, resp.read())
            while line := resp.readline():
                yield from r.line(line)
            raise ConnectionError(f"{self.endpoint}: the node ended the subscription's stream")
        finally:
            conn.close()

    def _send(self, req: Request) -> Any:
        status, data, h = self.request(req.method, req.path, req.body, req.content_type, req.accept)
        return req.result(status, data, h)


class AsyncClient(Endpoints[Coroutine[Any, Any, Any]]):
    """asyncio client with the same methods (``await``-ed)."""

    def __init__(self, endpoint: str = "http://127.0.0.1:7400", token: str | None = None, timeout: float = 300,
                 connections: int = 100) -> None:
        self.endpoint, self.token = endpoint.rstrip("/"), token
        self._timeout, self._limit = timeout, connections
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                      accept: str | None = None) -> tuple[int, bytes, dict[str, str]]:
        """One raw request; returns (status, body, headers) without raising on error statuses."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                  connector=aiohttp.TCPConnector(limit=self._limit))
        h = headers(self.token, content_type, accept)
        try:
            async with self._session.request(method, self.endpoint + path, data=body, headers=h) as r:
                return r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()}
        except aiohttp.ClientConnectionError as e:
            raise ConnectionError(f"cannot reach {self.endpoint}: {e}") from e

    async def scan(self, table: str, prefix: Any = None, start: Any = None, end: Any = None, where: Any = None,
                   bbox: Any = None, columns: Any = None, as_of: int | None = None,
                   page_rows: int = 10_000) -> AsyncIterator[pa.RecordBatch]:
        """``Client.scan``, asynchronously."""
        page: ScanResult = await self.scan_page(table, prefix, start, end, where, bbox, columns, page_rows, as_of)
        while True:
            for b in page.rows.to_batches():
                yield b
            if page.next is None:
                return
            page = await self.scan_page(table, after=page.next)

    async def subscribe(self, table: str, where: Any = None, bbox: Any = None, prefix: Any = None,
                        columns: Any = None, from_ts: int | None = None, retry_for: float = 300.0,
                        idle_timeout: float = 30.0) -> AsyncIterator[dict[str, Any]]:
        """``Client.subscribe``, asynchronously."""
        import aiohttp

        r = Resume(table, where, bbox, prefix, columns, from_ts, retry_for)
        while True:
            try:
                async for item in self._events(r, idle_timeout):
                    yield item
            except (ApiError, Resumed) as e:
                await asyncio.sleep(r.broken(e))
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                await asyncio.sleep(r.broken(ConnectionError(f"{self.endpoint}: {e!r}")))

    async def _events(self, r: Resume, idle_timeout: float) -> AsyncIterator[dict[str, Any]]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                  connector=aiohttp.TCPConnector(limit=self._limit))
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle_timeout)
        async with self._session.get(self.endpoint + r.path(), headers=headers(self.token, None, EVENT_STREAM),
                                     timeout=timeout) as resp:
            if resp.status != 200:
                raise api_error(resp.status, await resp.read())
            rest = b""
            async for chunk in resp.content.iter_any():  # lines of any length (a frame may be large)
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    for item in r.line(line):
                        yield item
        raise ConnectionError(f"{self.endpoint}: the node ended the subscription's stream")

    async def _send(self, req: Request) -> Any:
        status, data, h = await self.request(req.method, req.path, req.body, req.content_type, req.accept)
        return req.result(status, data, h)
