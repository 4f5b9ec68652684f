"""The HTTP API (docs/openapi.yaml) written once for both Python clients.

Each endpoint is one method of :class:`Endpoints` that builds a :class:`Request` — method,
path, body, and what its answer becomes — and hands it to the client's ``_send``:
``Client`` sends it over a blocking ``http.client`` connection and returns the answer,
``AsyncClient`` over an aiohttp session and returns a coroutine of it
(node/client/client.py). So each method is written once and the two cannot drift apart.
"""
from __future__ import annotations

import abc
import base64
import datetime as dt

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar
import uuid
from urllib.parse import quote, urlencode

import pyarrow as pa

from node.errors import ApiError

ARROW_STREAM = "application/vnd.apache.arrow.stream"
# RFC 9110 §9.2.2: repeating one of these changes nothing the first did not; the rule aiohttp
# applies to AsyncClient's connections, and Client to its own.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
R = TypeVar("R")  # what ``_send`` makes of a request: the answer (Client) or a coroutine of it (AsyncClient)
Columns: TypeAlias = Iterable[dict[str, Any] | Sequence[str]]  # {"name", "type", ...} documents or (name, type) pairs
Where: TypeAlias = Iterable[Sequence[Any]]  # [column, op, value...] terms (docs/openapi.yaml)
Rows: TypeAlias = pa.Table | pa.RecordBatch | dict[str, Any] | Iterable[dict[str, Any]]  # Arrow, or JSON rows


def arrow_body(data: pa.Table | pa.RecordBatch) -> bytes:
    """A pyarrow Table or RecordBatch as one Arrow IPC stream."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as w:
        w.write_table(data)
    out: bytes = sink.getvalue().to_pybytes()
    return out


def read_arrow(body: bytes) -> pa.Table:
    with pa.ipc.open_stream(pa.BufferReader(body)) as r:
        return r.read_all()


def api_error(status: int, body: bytes) -> ApiError:
    """The documented error answer ``{"error": {"code", "message"}}``, or ``http_error`` for
    anything else (a proxy's page, say)."""
    try:
        e = json.loads(body)["error"]
        return ApiError(status, e["code"], e["message"])
    except (ValueError, KeyError, TypeError):
        return ApiError(status, "http_error", body[:200].decode(errors="replace") or f"HTTP {status}")


def headers(token: str | None, content_type: str | None, accept: str | None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type:
        h["Content-Type"] = content_type
    if accept:
        h["Accept"] = accept
    return h


@dataclass(frozen=True)
class ScanResult:
    """One page of ``POST /v1/tables/{t}/scan``: its rows, the snapshot T it read, and the
    cursor that continues after it (None: the scan is done)."""

    rows: pa.Table
    as_of: int
    next: str | None


@dataclass(frozen=True)
class Request:
    """One call: what to send, and what its answer becomes — ``answer`` "json" (the decoded
    document), "arrow" (asks for an Arrow IPC stream: a pyarrow.Table) or "text"; an error
    whose code is ``absent`` means "no such thing" and is answered as None."""

    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = None
    answer: str = "json"
    absent: str | None = None

    @classmethod
    def of(cls, method: str, path: str, doc: Any = None, body: bytes | None = None, content_type: str | None = None,
           answer: str = "json", absent: str | None = None) -> Request:
        """A request with a JSON ``doc`` as its body, or a raw ``body``."""
        if doc is not None:
            body, content_type = json.dumps(doc).encode(), "application/json"
        return cls(method, path, body, content_type, answer, absent)

    @property
    def accept(self) -> str | None:
        return ARROW_STREAM if self.answer in ("arrow", "page") else None

    def result(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> Any:
        """What the endpoint's method returns for this answer; an error answer raises ApiError."""
        if status >= 400:
            err = api_error(status, body)
            if err.code == self.absent:
                return None
            raise err
        if self.answer == "page":  # an Arrow page of a scan, its snapshot and next cursor in headers
            h = {k.lower(): v for k, v in (headers or {}).items()}
            return ScanResult(read_arrow(body), int(h.get("x-terrascale-as-of", "0")), h.get("x-terrascale-next"))
        if self.answer == "arrow":
            return read_arrow(body)
        return body.decode() if self.answer == "text" else json.loads(body)


def _rows(rows: Rows) -> tuple[bytes, str]:
    """An Arrow table goes as an IPC stream; rows as dicts (or one dict: one row) go as JSON —
    the node coalesces small JSON writes with their neighbours (docs/rfcs/0008-point-writes.md)."""
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return arrow_body(rows), ARROW_STREAM
    if isinstance(rows, dict):
        rows = [rows]
    return json.dumps({"rows": list(rows)}).encode(), "application/json"


def _q(**params: object) -> str:
    p = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(p) if p else ""


def _seg(s: object) -> str:
    return quote(str(s), safe="")


def _query_doc(where: Where | None, bbox: Any, as_of: int | None, columns: Iterable[str] | None,
               limit: int | None) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    fields: tuple[tuple[str, Any], ...] = (("where", where), ("bbox", bbox), ("as_of", as_of), ("columns", columns),
                                           ("limit", limit))
    for k, v in fields:
        if v is not None:
            doc[k] = [list(t) for t in v] if k == "where" else (list(v) if k == "columns" else v)
    return doc


class Endpoints(abc.ABC, Generic[R]):
    """One method per endpoint. Each returns what the client's ``_send`` makes of its request:
    the answer (``Client``) or a coroutine of it (``AsyncClient``). Answers are dicts, a
    ``pyarrow.Table`` for ``query``, text for ``metrics``; error answers raise ApiError."""

    @abc.abstractmethod
    def _send(self, req: Request) -> R:
        """The transport: ``Client`` sends over http.client, ``AsyncClient`` over aiohttp."""

    def _call(self, method: str, path: str, doc: Any = None, body: bytes | None = None,
              content_type: str | None = None, arrow: bool = False) -> R:
        """One request by path: a JSON ``doc`` or a raw ``body``; a pyarrow.Table back with ``arrow``."""
        return self._send(Request.of(method, path, doc, body, content_type, "arrow" if arrow else "json"))

    # health
    def healthz(self) -> R:
        return self._call("GET", "/healthz")

    def readyz(self) -> R:
        return self._call("GET", "/readyz")

    def metrics(self) -> R:
        """The Prometheus text exposition."""
        return self._send(Request("GET", "/metrics", answer="text"))

    # tables
    def create_table(self, name: str, columns: Columns, primary_key: str | list[str], indexes: Iterable[str] = (),
                     partitions: int | None = None, cluster_by: str | None = None, replicas: int | None = None,
                     partition_key: str | list[str] | None = None, retention: dict[str, str] | None = None) -> R:
        """``primary_key``: a column, or the columns of a composite key in key order;
        ``partition_key``: a leading run of them (default: the first); ``retention``:
        ``{"column": c, "keep": "30d"}``."""
        cols = [c if isinstance(c, dict) else {"name": c[0], "type": c[1]} for c in columns]
        doc: dict[str, Any] = {"name": name, "columns": cols, "primary_key": primary_key, "indexes": list(indexes)}
        for k, v in (("partitions", partitions), ("cluster_by", cluster_by), ("replicas", replicas),
                     ("partition_key", partition_key), ("retention", retention)):
            if v is not None:
                doc[k] = v
        return self._call("POST", "/v1/tables", doc)

    def list_tables(self, as_of: int | None = None) -> R:
        return self._call("GET", "/v1/tables" + _q(as_of=as_of))

    def describe(self, table: str, as_of: int | None = None) -> R:
        return self._call("GET", f"/v1/tables/{_seg(table)}" + _q(as_of=as_of))

    def drop_table(self, table: str) -> R:
        return self._call("DELETE", f"/v1/tables/{_seg(table)}")

    def set_retention(self, table: str, retention: dict[str, str] | None) -> R:
        """``{"column": c, "keep": "30d"}``, or None to keep every row."""
        return self._call("PATCH", f"/v1/tables/{_seg(table)}", {"retention": retention})

    def add_column(self, table: str, name: str, type: str) -> R:
        return self._call("POST", f"/v1/tables/{_seg(table)}/columns", {"name": name, "type": type})

    def drop_column(self, table: str, column: str) -> R:
        return self._call("DELETE", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}")

    def rename_column(self, table: str, column: str, new_name: str) -> R:
        return self._call("PATCH", f"/v1/tables/{_seg(table)}/columns/{_seg(column)}", {"name": new_name})

    # rows
    def upsert(self, table: str, rows: Rows) -> R:
        """Rows as a pyarrow Table / RecordBatch, a list of dicts, or one dict."""
        body, ctype = _rows(rows)
        return self._call("POST", f"/v1/tables/{_seg(table)}/rows", body=body, content_type=ctype)

    def delete(self, table: str, keys: Iterable[Any]) -> R:
        return self._call("POST", f"/v1/tables/{_seg(table)}/delete", {"keys": [_key_doc(k) for k in keys]})

    def delete_where(self, table: str, where: list[Any] | None = None, bbox: dict[str, Any] | None = None,
                     prefix: list[Any] | None = None) -> R:
        """Delete every row matching the terms (a query's; at least one) at one commit
        timestamp T: ``{"deleted": n, "commit_ts": T}`` (RFC 0016 §6)."""
        doc = {k: v for k, v in (("where", where), ("bbox", bbox), ("prefix", prefix)) if v is not None}
        return self._call("POST", f"/v1/tables/{_seg(table)}/delete", doc)

    def get(self, table: str, key: object, as_of: int | None = None) -> R:
        """The row as a dict (the JSON forms of the column types), or None if absent at T.
        A key of several columns is a list or tuple of its components, in key order."""
        parts = key if isinstance(key, (list, tuple)) else [key]
        path = f"/v1/tables/{_seg(table)}/rows/" + "/".join(_seg(key_json(p)) for p in parts) + _q(as_of=as_of)
        return self._send(Request("GET", path, absent="row_not_found"))

    def get_many(self, table: str, keys: Iterable[Any], columns: Iterable[str] | None = None,
                 as_of: int | None = None) -> R:
        """``{"as_of": T, "rows": [row or None, ...]}``: the rows of ``keys``, in the order asked."""
        doc = _present(keys=[_key_doc(k) for k in keys], columns=None if columns is None else list(columns),
                       as_of=as_of)
        return self._call("POST", f"/v1/tables/{_seg(table)}/get", doc)

    def scan_page(self, table: str, prefix: Any = None, start: Any = None, end: Any = None,
                  where: Where | None = None, bbox: Any = None, columns: Iterable[str] | None = None,
                  limit: int | None = None, as_of: int | None = None, after: str | None = None) -> R:
        """One page of an ordered scan (a ``ScanResult``): the rows whose key starts with ``prefix``
        and lies in ``[start, end)`` (each a list of leading key components), in key order;
        ``after``: a page's ``next``, which continues that scan at its snapshot."""
        if after is not None:
            doc: dict[str, Any] = {"after": after}
        else:
            doc = {**_query_doc(where, bbox, as_of, columns, limit),
                   **_present(prefix=_key_doc(prefix, True), start=_key_doc(start, True), end=_key_doc(end, True))}
        return self._send(Request.of("POST", f"/v1/tables/{_seg(table)}/scan", doc, answer="page"))

    def query(self, table: str, where: Where | None = None, bbox: Any = None, as_of: int | None = None,
              columns: Iterable[str] | None = None, limit: int | None = None) -> R:
        """The matching rows as a pyarrow.Table (Arrow IPC on the wire: types survive exactly)."""
        doc = _query_doc(where, bbox, as_of, columns, limit)
        return self._call("POST", f"/v1/tables/{_seg(table)}/query", doc, arrow=True)

    def query_json(self, table: str, where: Where | None = None, bbox: Any = None, as_of: int | None = None,
                   columns: Iterable[str] | None = None, limit: int | None = None) -> R:
        return self._call("POST", f"/v1/tables/{_seg(table)}/query", _query_doc(where, bbox, as_of, columns, limit))

    def aggregate(self, table: str, aggregates: list[dict[str, Any]],
                  group_by: list[str | dict[str, Any]] | None = None, where: Where | None = None, bbox: Any = None,
                  as_of: int | None = None, arrow: bool = False, partitions: list[int] | None = None,
                  nan: str | None = None) -> R:
        """Grouped aggregates (``{"as_of", "rows", "stats"}``; ``arrow``: a pyarrow.Table); ``partitions``:
        only those table partitions' rows; ``nan``: ``"ignore"`` or ``"largest"`` (docs/openapi.yaml); a
        ``group_by`` entry may be a bucket, ``{"bucket": "ts", "width": "5m"}`` (RFC 0016)."""
        doc = {"aggregates": aggregates} | _present(group_by=group_by, where=where, bbox=bbox, as_of=as_of,
                                                    partitions=partitions, nan=nan)
        return self._call("POST", f"/v1/tables/{_seg(table)}/aggregate", doc, arrow=arrow)

    def histogram(self, table: str, column: str, bbox: Any, cells: Iterable[int], where: Where | None = None,
                  as_of: int | None = None) -> R:
        """Counts per cell of a grid over ``bbox`` (``{"as_of", "counts", "stats"}``)."""
        doc = {"column": column, "bbox": bbox, "cells": list(cells)} | _present(where=where, as_of=as_of)
        return self._call("POST", f"/v1/tables/{_seg(table)}/histogram", doc)

    # admin
    def status(self) -> R:
        return self._call("GET", "/v1/admin/status")

    def segments(self, table: str | None = None) -> R:
        return self._call("GET", "/v1/admin/segments" + _q(table=table))

    def admin(self, job: str) -> R:
        """Run a background job now: ``seal``, ``offload``, ``checkpoint`` or ``gc``."""
        return self._call("POST", f"/v1/admin/{job}")

    def gc(self, table: str | None = None, dry_run: bool = False) -> R:
        """One garbage-collection pass now (or, ``dry_run``, its victims only)."""
        doc = {"dry_run": bool(dry_run)} | ({"table": table} if table is not None else {})
        return self._call("POST", "/v1/admin/gc", doc)

    def cluster(self) -> R:
        return self._call("GET", "/v1/admin/cluster")

    def add_member(self, raft_address: str) -> R:
        return self._call("POST", "/v1/admin/cluster/members", {"raft_address": raft_address})

    def remove_member(self, raft_address: str, force: bool = False) -> R:
        force_q = "?force=true" if force else ""
        return self._call("DELETE", f"/v1/admin/cluster/members/{_seg(raft_address)}{force_q}")


def _present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def key_json(v: object) -> object:
    """A key component as JSON (and URLs) carry it: a datetime as ISO-8601 (UTC when naive), a
    date as YYYY-MM-DD, bytes as base64, a uuid as its text; anything else as it is."""
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)).isoformat()
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, uuid.UUID):
        return str(v)
    return v


def _key_doc(key: object, prefix: bool = False) -> object:
    """A key (or, ``prefix``, leading components) in a JSON body."""
    if key is None:
        return None
    if isinstance(key, (list, tuple)):
        return [key_json(v) for v in key]
    return [key_json(key)] if prefix else key_json(key)
