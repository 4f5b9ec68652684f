"""Python clients for a Terrascale node (docs/REFERENCE.md §6): ``Client`` (blocking) and ``AsyncClient``.

Both mirror the HTTP API (docs/openapi.yaml) one method per endpoint and return
what the API returns: dicts, or a ``pyarrow.Table`` for rows (query results come
as Arrow IPC streams, so types survive exactly). Rows go in as a ``pyarrow.Table``
/ ``RecordBatch`` (sent as an Arrow IPC stream) or a list of JSON-ready dicts.
Every error answer raises :class:`ApiError` with the documented status, code and
message; a node that cannot be reached raises ``ConnectionError``.

``Client`` keeps one keep-alive connection (``http.client``) and is not thread-safe:
use one per thread. ``AsyncClient`` uses an aiohttp session; close it (or use
``async with``).
"""
from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from urllib.parse import quote, urlencode, urlsplit

import pyarrow as pa

from node.errors import ApiError

ARROW_STREAM = "application/vnd.apache.arrow.stream"
IDLE_RECONNECT_S = 30  # below the server's keep-alive timeout (aiohttp: 75 s): never reuse a connection it may drop


def _arrow_body(data) -> bytes:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write_table(data)
    return sink.getvalue().to_pybytes()


def _rows_request(rows) -> tuple[bytes, str]:
    """An Arrow table goes as an IPC stream; rows as dicts (or one dict: one row) go as JSON —
    the node coalesces small JSON writes with their neighbours (docs/rfcs/0008-point-writes.md)."""
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return _arrow_body(rows), ARROW_STREAM
    if isinstance(rows, dict):
        rows = [rows]
    return json.dumps({"rows": list(rows)}).encode(), "application/json"


def _read_arrow(body: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.BufferReader(body)) as r:
        return r.read_all()


def _raise(status: int, body: bytes):
    try:
        e = json.loads(body)["error"]
        raise ApiError(status, e["code"], e["message"])
    except (ValueError, KeyError, TypeError):
        raise ApiError(status, "http_error", body[:200].decode(errors="replace") or f"HTTP {status}") from None


def _headers(token, content_type, accept) -> dict:
    h = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type:
        h["Content-Type"] = content_type
    if accept:
        h["Accept"] = accept
    return h


def _q(**params) -> str:
    p = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(p) if p else ""


def _seg(s) -> str:
    return quote(str(s), safe="")


def _gc_doc(table, dry_run) -> dict:
    doc = {"dry_run": bool(dry_run)}
    if table is not None:
        doc["table"] = table
    return doc


class _Requests:
    """The request shapes, shared by both clients: (method, path, body, content type, want)."""

    @staticmethod
    def create_table(name, columns, primary_key, indexes=(), partitions=None, cluster_by=None, replicas=None):
        cols = [c if isinstance(c, dict) else {"name": c[0], "type": c[1]} for c in columns]
        doc = {"name": name, "columns": cols, "primary_key": primary_key, "indexes": list(indexes)}
        if partitions is not None:
            doc["partitions"] = partitions
        if cluster_by is not None:
            doc["cluster_by"] = cluster_by
        if replicas is not None:
            doc["replicas"] = replicas
        return "POST", "/v1/tables", doc

    @staticmethod
    def query_doc(where=None, bbox=None, as_of=None, columns=None, limit=None):
        doc = {}
        for k, v in (("where", where), ("bbox", bbox), ("as_of", as_of), ("columns", columns), ("limit", limit)):
            if v is not None:
                doc[k] = [list(t) for t in v] if k == "where" else (list(v) if k == "columns" else v)
        return doc


class Client:
    """Blocking client. ``Client("http://127.0.0.1:7400", token=None)``."""

    def __init__(self, endpoint: str = "http://127.0.0.1:7400", token: str | None = None, timeout: float = 300,
                 verify: bool | str = True):
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _connect(self) -> http.client.HTTPConnection:
        if self._tls:
            ctx = ssl.create_default_context(cafile=self._verify if isinstance(self._verify, str) else None)
            if self._verify is False:
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=ctx)
        return http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str | None = None,
                accept: str | None = None) -> tuple[int, bytes, dict]:
        """One raw request; returns (status, body, headers) without raising on error statuses."""
        headers = _headers(self.token, content_type, accept)
        with self._lock:
            if self._conn is not None and time.monotonic() - self._last > IDLE_RECONNECT_S:
                self.close()
            for attempt in (0, 1):
                if self._conn is None:
                    self._conn = self._connect()
                try:
                    self._conn.request(method, path, body=body, headers=headers)
                    r = self._conn.getresponse()
                    data = r.read()
                    self._last = time.monotonic()
                    return r.status, data, {k.lower(): v for k, v in r.getheaders()}
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                    self.close()  # a kept-alive connection the server closed: one fresh try
                    if attempt or method not in ("GET", "DELETE"):
                        raise ConnectionError(f"{self.endpoint}: {e}") from e
                except OSError as e:
                    self.close()
                    raise ConnectionError(f"cannot reach {self.endpoint}: {e.strerror or e}") from e
        raise ConnectionError(self.endpoint)

    def _call(self, method, path, doc=None, body=None, content_type=None, arrow=False):
        if doc is not None:
            body, content_type = json.dumps(doc).encode(), "application/json"
        status, data, _ = self.request(method, path, body, content_type, ARROW_STREAM if arrow else None)
        if status >= 400:
            _raise(status, data)
        return _read_arrow(data) if arrow else json.loads(data)

    # health
    def healthz(self) -> dict:
        return self._call("GET", "/healthz")

    def readyz(self) -> dict:
        return self._call("GET", "/readyz")

    def metrics(self) -> str:
        status, data, _ = self.request("GET", "/metrics")
        if status >= 400:
            _raise(status, data)
        return data.decode()

    # tables
    def create_table(self, name, columns, primary_key, indexes=(), partitions=None, cluster_by=None,
                     replicas=None) -> dict:
        m, p, doc = _Requests.create_table(name, columns, primary_key, indexes, partitions, cluster_by, replicas)
        return self._call(m, p, doc)

    def list_tables(self, as_of=None) -> dict:
        return self._call("GET", "/v1/tables" + _q(as_of=as_of))

    def describe(self, table, as_of=None) -> dict:
        return self._call("GET", f"/v1/tables/{_seg(table)}" + _q(as_of=as_of))

    def drop_table(self, table) -> dict:
        return self._call("DELETE", f"/v1/tables/{_seg(table)}")

    def add_column(self, table, name, type) -> dict:
        return self._call("POST", f"/v1/tables/{_seg(table)}/columns", {"name": name, "type": type})

    def drop_column(self, table, column) -> dict:
        return self._call("DELETE", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}")

    def rename_column(self, table, column, new_name) -> dict:
        return self._call("PATCH", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}", {"name": new_name})

    # rows
    def upsert(self, table, rows) -> dict:
        body, ctype = _rows_request(rows)
        return self._call("POST", f"/v1/tables/{_seg(table)}/rows", body=body, content_type=ctype)

    def delete(self, table, keys) -> dict:
        return self._call("POST", f"/v1/tables/{_seg(table)}/delete", {"keys": list(keys)})

    def get(self, table, key, as_of=None) -> dict | None:
        """The row as a dict (the JSON forms of the column types), or None if absent at T."""
        try:
            return self._call("GET", f"/v1/tables/{_seg(table)}/rows/{_seg(key)}" + _q(as_of=as_of))
        except ApiError as e:
            if e.code == "row_not_found":
                return None
            raise

    def query(self, table, where=None, bbox=None, as_of=None, columns=None, limit=None) -> pa.Table:
        doc = _Requests.query_doc(where, bbox, as_of, columns, limit)
        return self._call("POST", f"/v1/tables/{_seg(table)}/query", doc, arrow=True)

    def query_json(self, table, where=None, bbox=None, as_of=None, columns=None, limit=None) -> dict:
        doc = _Requests.query_doc(where, bbox, as_of, columns, limit)
        return self._call("POST", f"/v1/tables/{_seg(table)}/query", doc)

    # admin
    def status(self) -> dict:
        return self._call("GET", "/v1/admin/status")

    def segments(self, table=None) -> dict:
        return self._call("GET", "/v1/admin/segments" + _q(table=table))

    def admin(self, job: str) -> dict:
        """Run a background job now: ``seal``, ``offload``, ``checkpoint`` or ``gc``."""
        return self._call("POST", f"/v1/admin/{job}")

    def gc(self, table=None, dry_run=False) -> dict:
        """One garbage-collection pass now (or, ``dry_run``, its victims only)."""
        return self._call("POST", "/v1/admin/gc", _gc_doc(table, dry_run))

    def cluster(self) -> dict:
        return self._call("GET", "/v1/admin/cluster")

    def add_member(self, raft_address: str) -> dict:
        return self._call("POST", "/v1/admin/cluster/members", {"raft_address": raft_address})

    def remove_member(self, raft_address: str, force: bool = False) -> dict:
        return self._call("DELETE", f"/v1/admin/cluster/members/{_seg(raft_address)}"
                          + ("?force=true" if force else ""))


class AsyncClient:
    """asyncio client with the same methods (``await``-ed)."""

    def __init__(self, endpoint: str = "http://127.0.0.1:7400", token: str | None = None, timeout: float = 300,
                 connections: int = 100):
        self.endpoint, self.token = endpoint.rstrip("/"), token
        self._timeout, self._limit = timeout, connections
        self._session = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method, path, body=None, content_type=None, accept=None) -> tuple[int, bytes, dict]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._timeout),
                                                  connector=aiohttp.TCPConnector(limit=self._limit))
        headers = _headers(self.token, content_type, accept)
        try:
            async with self._session.request(method, self.endpoint + path, data=body, headers=headers) as r:
                return r.status, await r.read(), {k.lower(): v for k, v in r.headers.items()}
        except aiohttp.ClientConnectionError as e:
            raise ConnectionError(f"cannot reach {self.endpoint}: {e}") from e

    async def _call(self, method, path, doc=None, body=None, content_type=None, arrow=False):
        if doc is not None:
            body, content_type = json.dumps(doc).encode(), "application/json"
        status, data, _ = await self.request(method, path, body, content_type, ARROW_STREAM if arrow else None)
        if status >= 400:
            _raise(status, data)
        return _read_arrow(data) if arrow else json.loads(data)

    async def healthz(self):
        return await self._call("GET", "/healthz")

    async def readyz(self):
        return await self._call("GET", "/readyz")

    async def create_table(self, name, columns, primary_key, indexes=(), partitions=None, cluster_by=None,
                           replicas=None):
        m, p, doc = _Requests.create_table(name, columns, primary_key, indexes, partitions, cluster_by, replicas)
        return await self._call(m, p, doc)

    async def list_tables(self, as_of=None):
        return await self._call("GET", "/v1/tables" + _q(as_of=as_of))

    async def describe(self, table, as_of=None):
        return await self._call("GET", f"/v1/tables/{_seg(table)}" + _q(as_of=as_of))

    async def drop_table(self, table):
        return await self._call("DELETE", f"/v1/tables/{_seg(table)}")

    async def add_column(self, table, name, type):
        return await self._call("POST", f"/v1/tables/{_seg(table)}/columns", {"name": name, "type": type})

    async def drop_column(self, table, column):
        return await self._call("DELETE", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}")

    async def rename_column(self, table, column, new_name):
        return await self._call("PATCH", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}", {"name": new_name})

    async def upsert(self, table, rows):
        body, ctype = _rows_request(rows)
        return await self._call("POST", f"/v1/tables/{_seg(table)}/rows", body=body, content_type=ctype)

    async def delete(self, table, keys):
        return await self._call("POST", f"/v1/tables/{_seg(table)}/delete", {"keys": list(keys)})

    async def get(self, table, key, as_of=None):
        try:
            return await self._call("GET", f"/v1/tables/{_seg(table)}/rows/{_seg(key)}" + _q(as_of=as_of))
        except ApiError as e:
            if e.code == "row_not_found":
                return None
            raise

    async def query(self, table, where=None, bbox=None, as_of=None, columns=None, limit=None) -> pa.Table:
        doc = _Requests.query_doc(where, bbox, as_of, columns, limit)
        return await self._call("POST", f"/v1/tables/{_seg(table)}/query", doc, arrow=True)

    async def query_json(self, table, where=None, bbox=None, as_of=None, columns=None, limit=None):
        doc = _Requests.query_doc(where, bbox, as_of, columns, limit)
        return await self._call("POST", f"/v1/tables/{_seg(table)}/query", doc)

    async def status(self):
        return await self._call("GET", "/v1/admin/status")

    async def segments(self, table=None):
        return await self._call("GET", "/v1/admin/segments" + _q(table=table))

    async def admin(self, job: str):
        return await self._call("POST", f"/v1/admin/{job}")

    async def gc(self, table=None, dry_run=False):
        return await self._call("POST", "/v1/admin/gc", _gc_doc(table, dry_run))

    async def cluster(self):
        return await self._call("GET", "/v1/admin/cluster")

    async def add_member(self, raft_address: str):
        return await self._call("POST", "/v1/admin/cluster/members", {"raft_address": raft_address})

    async def remove_member(self, raft_address: str, force: bool = False):
        return await self._call("DELETE", f"/v1/admin/cluster/members/{_seg(raft_address)}"
                                + ("?force=true" if force else ""))
