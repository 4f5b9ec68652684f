"""Rows (docs/REFERENCE.md §3): upsert and delete — small JSON writes coalesced with their
neighbours (node/http/coalesce.py), everything routed to the partitions' leaders (RFC 0010)
— a row by key, and queries, answered as JSON or an Arrow stream. Large bodies are parsed
and encoded in a worker thread, so one big request never stalls the others."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import unquote

import pyarrow as pa
from aiohttp import web

from node.errors import ApiError
from node.http.coalesce import _Request
from node.http.params import (THREAD_BYTES, THREAD_ROWS, as_of_param, as_of_value, bound, json_body, json_object,
                              off_loop_if_big, parse_json, rows_of, where_terms)
from node.http.ports import HandlerApi
from node.wire import ARROW_STREAM, read_arrow_stream, row_to_json, rows_to_table, table_to_rows, write_arrow_stream
from rowstore.db.read.reader import MAX_LIMIT
from rowstore.tables.conform import conform
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import check_key_lists, show
from node.http.answers import json_answer, json_text


_PREDICATE = ("where", "bbox", "prefix")  # a delete by predicate's terms, as a query's


def add_row_routes(api: HandlerApi, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/tables/{table}/rows", bound(api, upsert))
    router.add_post("/v1/tables/{table}/delete", bound(api, delete_rows))
    router.add_get("/v1/tables/{table}/rows/{key:.+}", bound(api, get_row))  # one path segment per key component
    router.add_post("/v1/tables/{table}/query", bound(api, query))


async def upsert(api: HandlerApi, request: web.Request) -> web.StreamResponse:
    table = request.match_info["table"]
    db = api.db
    body = await request.read()
    forwarded: web.StreamResponse | None
    res: tuple[int, int] | None  # (count, commit_ts)
    if request.content_type == ARROW_STREAM:
        data = await off_loop_if_big(len(body), read_arrow_stream, body)
    elif request.content_type in ("application/json", "application/octet-stream", ""):
        d = await db.describe(table)
        schema = d.schema
        assert schema is not None  # a live table's (Database.describe)
        if len(body) <= THREAD_BYTES:  # small: on the loop, and coalesced with its neighbours
            rows = rows_of(api.parsed(body))
            req = api.writes.prepare(d, rows, False)
            if req is not None:  # in a cluster the router first finds where its rows go
                forwarded, res = await _prepared(api, request, d, req, lambda: conform(rows_to_table(
                    rows, schema), schema), False)
                if forwarded is not None:
                    return forwarded
                assert res is not None  # not forwarded: committed
                api.metrics.rows_written.labels("upsert").inc(res[0])
                return json_answer({"committed": res[0], "commit_ts": res[1]})
            data = rows_to_table(rows, schema)
        else:
            depth = api.cfg.max_json_depth
            data = await asyncio.to_thread(lambda: rows_to_table(rows_of(parse_json(body, depth)), schema))
    else:
        raise ApiError(415, "unsupported_media_type",
                       f"rows come as application/json or {ARROW_STREAM}, not {request.content_type}")
    t0 = time.perf_counter()
    forwarded, res = await api.router.upsert(request, table, data)
    if forwarded is not None:
        return forwarded
    assert res is not None  # not forwarded: committed
    count, ts = res
    m = api.metrics
    m.write_wait.observe(time.perf_counter() - t0)
    m.batch_rows.observe(data.num_rows)
    m.rows_written.labels("upsert").inc(count)
    return json_answer({"committed": count, "commit_ts": ts})


async def delete_rows(api: HandlerApi, request: web.Request) -> web.StreamResponse:
    """By key (``keys``), or by predicate (``where``, ``bbox``, ``prefix``: RFC 0016 §6)."""
    doc = await json_object(request, {"keys", *_PREDICATE})
    terms = {k: doc[k] for k in _PREDICATE if doc.get(k) is not None}
    if "keys" in doc and terms:
        raise ApiError(400, "bad_request", "a delete takes keys or where/bbox/prefix, not both")
    if "keys" not in doc:
        if not terms:
            raise ApiError(400, "bad_request", "a delete takes keys, or where, bbox or prefix (at least one)")
        return await _delete_where(api, request, terms)
    if not isinstance(doc["keys"], list):
        raise ApiError(400, "invalid_rows", '"keys" must be a list')
    table, db = request.match_info["table"], api.db
    d = await db.describe(table)
    schema = d.schema
    assert schema is not None  # a live table's (Database.describe)
    keys = doc["keys"]
    req = api.writes.prepare(d, keys, True)
    forwarded: web.StreamResponse | None
    res: tuple[int, int] | None  # (count, commit_ts)
    if req is not None:  # coalesced, routed by the partitions it computed
        forwarded, res = await _prepared(api, request, d, req, lambda: pa.RecordBatch.from_arrays(
            check_key_lists(keys, schema.pk), names=schema.pk.names), True)
        if forwarded is not None:
            return forwarded
    else:
        forwarded, res = await api.router.delete(request, table, doc["keys"])
        if forwarded is not None:
            return forwarded
    assert res is not None  # not forwarded: committed
    api.metrics.rows_written.labels("delete").inc(len(doc["keys"]))
    return json_answer({"deleted": res[0], "commit_ts": res[1]})


async def _delete_where(api: HandlerApi, request: web.Request, terms: dict[str, object]) -> web.StreamResponse:
    forwarded, res = await api.router.delete_where(request, request.match_info["table"], terms)
    if forwarded is not None:
        return forwarded
    assert res is not None  # not forwarded: committed
    api.metrics.rows_written.labels("delete").inc(res[0])
    return json_answer({"deleted": res[0], "commit_ts": res[1]})


async def _prepared(api: HandlerApi, request: web.Request, d: TableDef, req: _Request,
                    batch_of: Callable[[], pa.RecordBatch], delete: bool
                    ) -> tuple[web.StreamResponse | None, tuple[int, int] | None]:
    """A prepared small write: (forwarded response, None) or (None, (count, commit_ts))."""
    if not api.router.multi:
        res = await api.writes.submit(req)
        return None, (res.count, res.commit_ts)
    out: tuple[web.StreamResponse | None, tuple[int, int] | None] = await api.router.write(
        request, d, req.pids, lambda: api.writes.submit(req), batch_of, delete)
    return out


def key_of_path(request: web.Request) -> object:
    """The key of ``…/rows/{k1}/{k2}…``: one URL-encoded path segment per component, in key
    order (a key of one column: its one segment, as before composite keys)."""
    raw = request.rel_url.raw_path.split("/rows/", 1)[1]
    parts = [unquote(p) for p in raw.split("/")]
    return parts[0] if len(parts) == 1 else parts


async def get_row(api: HandlerApi, request: web.Request) -> web.StreamResponse:
    table, raw = request.match_info["table"], key_of_path(request)
    as_of = as_of_param(request)
    db = api.db
    d = await db.describe(table)
    # to the node serving the key's partition
    forwarded: web.StreamResponse | None = await api.router.get(request, d, raw)
    if forwarded is not None:
        return forwarded
    row = await db.get(table, raw, as_of)  # the key's text, checked against its type there
    if row is None:
        raise ApiError(404, "row_not_found", f"no row with key {show(raw)} in {table!r}"
                       + (f" as of {as_of}" if as_of is not None else ""))
    schema = d.schema
    assert schema is not None  # a live table's (Database.describe)
    if as_of is not None or set(row) != {c.name for c in schema.columns}:
        schema = (await db.describe(table, as_of)).schema
    return json_answer(row_to_json(row, schema))


async def query(api: HandlerApi, request: web.Request) -> web.StreamResponse:
    table = request.match_info["table"]
    body = await request.read()
    doc = await json_body(request) if body and not body.isspace() else {}  # no body: every row
    if not isinstance(doc, dict):
        raise ApiError(400, "invalid_query", "the query is a JSON object")
    extra = set(doc) - {"where", "bbox", "as_of", "columns", "limit"}
    if extra:
        raise ApiError(400, "invalid_query", f"unknown field(s): {', '.join(sorted(extra))}")
    as_of = as_of_value(doc.get("as_of"))
    limit = doc.get("limit", 10_000)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ApiError(400, "invalid_query", f'"limit" must be a non-negative integer, not {limit!r}')
    api.db  # noqa: B018 - 503 before ready
    forwarded: web.StreamResponse | None
    res: tuple[pa.Table, int] | None  # (rows, T)
    forwarded, res = await api.router.query(request, table, where_terms(doc, request), doc.get("bbox"),
                                             doc.get("columns"), limit if limit <= MAX_LIMIT else None, as_of)
    if forwarded is not None:
        return forwarded
    assert res is not None  # not forwarded: read here or across the nodes
    t, T = res
    if t.num_rows > limit:
        t = t.slice(0, limit)
    if ARROW_STREAM in request.headers.get("Accept", ""):
        payload = await off_loop_if_big(t.nbytes, write_arrow_stream, t)
        return web.Response(body=payload, content_type=ARROW_STREAM, headers={"X-Terrascale-As-Of": str(T)})
    text = await off_loop_if_big(t.num_rows * (THREAD_BYTES // THREAD_ROWS),
                                 lambda: json_text({"rows": table_to_rows(t), "as_of": T}))
    return web.Response(body=text, content_type="application/json", headers={"X-Terrascale-As-Of": str(T)})
