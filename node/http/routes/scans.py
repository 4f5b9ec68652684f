"""Reads by key (docs/REFERENCE.md §3, docs/rfcs/0013-measurement-keys.md): ordered scans of a
key prefix or range, page by page with a cursor, and many rows by key at once — each answered
as JSON or, for scans, an Arrow stream."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from node.errors import ApiError
from node.http.api import Api
from node.http.cursors import Cursor, CursorKeys
from node.http.params import THREAD_BYTES, THREAD_ROWS, as_of_value, bound, json_object, off_loop_if_big, where_terms
from node.wire import ARROW_STREAM, row_to_json, table_to_rows, write_arrow_stream
from rowstore.db.read.scans import ScanPage
from node.http.answers import json_answer, json_text

NEXT = "X-Terrascale-Next"  # an Arrow page's cursor (JSON answers carry it as "next")
MAX_PAGE = 100_000  # rows a page may ask for: the serving node's memory is bounded by the page
_SCAN = ("prefix", "start", "end", "where", "bbox", "columns", "limit")


def add_scan_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/tables/{table}/scan", bound(api, scan))
    router.add_post("/v1/tables/{table}/get", bound(api, get_many))


async def scan(api: Api, request: web.Request) -> web.StreamResponse:
    """``POST /v1/tables/{t}/scan``: one page of rows in key order, and the cursor of the next."""
    table = request.match_info["table"]
    doc = await json_object(request, {*_SCAN, "as_of", "after"})
    d = await api.db.describe(table)
    if "after" in doc:
        if set(doc) != {"after"}:
            raise ApiError(400, "invalid_query", '"after" comes alone: the cursor holds the rest of the scan')
        cur = await _keys(api).open(doc["after"])
        if cur.table_id != d.table_id:
            raise ApiError(400, "invalid_cursor", f"the cursor is of another table than {table!r}")
        req, after = cur.request, cur.last
        as_of: int | None = cur.T
    else:
        req = {k: doc[k] for k in _SCAN if doc.get(k) is not None}
        req["where"] = where_terms(doc, request)
        req["limit"] = _limit(doc.get("limit", 10_000))
        as_of, after = as_of_value(doc.get("as_of")), None
    forwarded, page = await api.spread.scan(request, d, req, as_of, after)
    if forwarded is not None:
        return forwarded
    assert page is not None  # not forwarded: read here or across the nodes
    nxt = None
    if page.more and page.last is not None:
        nxt = await _keys(api).seal(Cursor(d.table_id, page.T, req, page.last))
    return await _answer(request, page, nxt)


def _limit(raw: object) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_PAGE:
        raise ApiError(400, "invalid_query", f'"limit" is a page\'s rows, 1..{MAX_PAGE}, not {raw!r}'[:200])
    return raw


async def _answer(request: web.Request, page: ScanPage, nxt: str | None) -> web.StreamResponse:
    t = page.rows
    if ARROW_STREAM in request.headers.get("Accept", ""):
        body = await off_loop_if_big(t.nbytes, write_arrow_stream, t)
        headers = {"X-Terrascale-As-Of": str(page.T), **({NEXT: nxt} if nxt else {})}
        return web.Response(body=body, content_type=ARROW_STREAM, headers=headers)
    text = await off_loop_if_big(t.num_rows * (THREAD_BYTES // THREAD_ROWS),
                                 lambda: json_text({"as_of": page.T, "rows": table_to_rows(t), "next": nxt}))
    return web.Response(body=text, content_type="application/json")


def _keys(api: Api) -> CursorKeys:
    return api.cursor_keys


async def get_many(api: Api, request: web.Request) -> web.StreamResponse:
    """``POST /v1/tables/{t}/get``: ``{"keys": [key, …], "columns", "as_of"}`` → the rows in the
    order asked, ``null`` where no row has the key at T."""
    table = request.match_info["table"]
    doc = await json_object(request, {"keys", "columns", "as_of"}, required=("keys",))
    keys = doc["keys"]
    if not isinstance(keys, list):
        raise ApiError(400, "bad_request", '"keys" must be a list of primary keys')
    if len(keys) > MAX_PAGE:
        raise ApiError(413, "too_large", f"{len(keys)} keys; a request takes at most {MAX_PAGE}")
    columns, as_of = doc.get("columns"), as_of_value(doc.get("as_of"))
    if not api.multi:  # the point-read path per key: cached blocks, generated decoders
        T, found = await api.db.get_dicts(table, keys, as_of, columns)
        schema = (await api.db.describe(table, T, trusted=True)).schema
        return json_answer({"as_of": T, "rows": [None if r is None else row_to_json(r, schema)
                                                        for r in found]})
    d = await api.db.describe(table)
    T, rows = await api.spread.get_many(d, keys, columns, as_of)
    out: list[dict[str, Any] | None] = [None] * len(keys)
    got = await off_loop_if_big(rows.nbytes, table_to_rows, rows.drop_columns(["__pos"]))
    for pos, row in zip(rows.column("__pos").to_pylist(), got):
        out[pos] = row
    return json_answer({"as_of": T, "rows": out})
