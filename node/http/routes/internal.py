"""Endpoints nodes call on each other (docs/rfcs/0010-replication.md; fields:
docs/format/placement.md). Authenticated like every other endpoint; not for clients —
their answers follow the documented error shape all the same."""
from __future__ import annotations


from typing import Any

from aiohttp import web

from node.http.api import Api
from node.http.params import bound, int_arg, json_object, off_loop_if_big, partition_list, table_arg, ts_arg
from node.errors import ApiError
from node.cluster.members import FORWARDED, INCARNATION
from node.cluster.spread import DEFAULT_LIMIT, key_of_json, page_arrow
from node.wire import ARROW_STREAM, read_arrow_stream, write_arrow_stream
from node.http.answers import json_answer


def add_internal_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_get("/v1/internal/closed", bound(api, closed))
    router.add_post("/v1/internal/read", bound(api, read))
    router.add_post("/v1/internal/plan", bound(api, plan))
    router.add_post("/v1/internal/scan", bound(api, scan))
    router.add_post("/v1/internal/get", bound(api, get))
    router.add_post("/v1/internal/changes", bound(api, changes))
    router.add_post("/v1/internal/txn/reserve", bound(api, reserve))
    router.add_post("/v1/internal/txn/prepare", bound(api, prepare))
    router.add_post("/v1/internal/txn/commit", bound(api, commit))
    router.add_post("/v1/internal/txn/abort", bound(api, abort))
    router.add_post("/v1/internal/forget", bound(api, forget))


async def closed(api: Api, request: web.Request) -> web.Response:
    """This node's closed timestamp, after observing the caller's (HLC receive rule)."""
    db = api.db
    if "observe" in request.query:
        db.clock.observe(ts_arg(request.query["observe"], "observe"))
    return json_answer({"closed_ts": db.closed_ts, "present_ts": db.present_ts, "node": api.cfg.node_id,
                              "incarnation": api.incarnation})


async def read(api: Api, request: web.Request) -> web.Response:
    """A query restricted to this node's partitions ``partitions`` at T (any columns: the
    caller projects after merging)."""
    doc = await json_object(request, {"table", "partitions", "as_of", "where", "bbox", "limit"},
                             ("table", "partitions", "as_of"))
    pids = partition_list(doc["partitions"])
    limit = doc.get("limit")
    t, _ = await api.router.local_read(table_arg(doc["table"]), pids, ts_arg(doc["as_of"], "as_of"), doc.get("where"),
                                       doc.get("bbox"), None if limit is None else int_arg(limit, "limit"))
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def scan(api: Api, request: web.Request) -> web.Response:
    """This node's share of a scan across nodes: its partitions' page at T, with each row's
    encoded key for the caller's merge (``node/cluster/spread.py``)."""
    doc, pids = await _share(api, request, {"as_of", "after", "prefix", "start", "end", "where", "bbox", "columns",
                                            "limit"}, ("as_of",))
    try:
        after = key_of_json(doc.get("after"))
    except ValueError as e:
        raise ApiError(400, "bad_request", str(e)) from None
    page = await api.db.scan(doc["table"], doc.get("prefix"), doc.get("start"), doc.get("end"), after,
                             doc.get("where"), doc.get("bbox"), doc.get("columns"),
                             int_arg(doc.get("limit", DEFAULT_LIMIT), "limit"), ts_arg(doc["as_of"], "as_of"),
                             partitions=pids, trusted=True)
    t = page_arrow(page)
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def get(api: Api, request: web.Request) -> web.Response:
    """This node's rows of some keys at T (a multi-get across nodes), with ``__pos``."""
    doc, pids = await _share(api, request, {"keys", "as_of", "columns"}, ("keys", "as_of"))
    t, _ = await api.db.get_rows(doc["table"], doc["keys"], ts_arg(doc["as_of"], "as_of"), doc.get("columns"), pids,
                                 trusted=True)
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def _share(api: Api, request: web.Request, fields: set[str], required: tuple[str, ...]
                 ) -> tuple[dict[str, Any], list[int]]:
    """A request for this node's share of a table read across nodes: (doc, partitions), the
    partitions checked to be served here (421 otherwise)."""
    doc = await json_object(request, fields | {"table", "partitions"}, ("table", "partitions", *required))
    pids = partition_list(doc["partitions"])
    await api.router.mine(table_arg(doc["table"]), pids)
    return doc, pids


async def plan(api: Api, request: web.Request) -> web.Response:
    """This node's share of a read plan (no lease: the coordinating node takes it)."""
    doc, pids = await _share(api, request, {"as_of", "where", "bbox"}, ("as_of",))
    out = await api.db.read_plan(doc["table"], ts_arg(doc["as_of"], "as_of"), doc.get("where"), doc.get("bbox"),
                                 False, 600.0, partitions=pids, trusted=True)
    return json_answer(out.to_json())


async def changes(api: Api, request: web.Request) -> web.Response:
    """This node's share of a change feed, in (after, upto]."""
    doc, pids = await _share(api, request, {"after", "upto"}, ("after", "upto"))
    t, _ = await api.db.changes(doc["table"], int_arg(doc["after"], "after"), ts_arg(doc["upto"], "upto"),
                                partitions=pids, trusted=True)
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def reserve(api: Api, request: web.Request) -> web.Response:
    q = request.query
    for k in ("table", "table_id", "schema_version", "floor", "txn"):
        if k not in q:
            raise ApiError(400, "bad_request", f"missing {k}")
    by, incarnation = request.headers.get(FORWARDED), request.headers.get(INCARNATION)
    coordinator = (by, incarnation) if by and incarnation else None
    if request.content_type == "application/json":  # a delete by predicate's share: its terms
        return await _reserve_where(api, request, coordinator)
    if request.content_type != ARROW_STREAM:
        raise ApiError(415, "unsupported_media_type", f"rows come as {ARROW_STREAM}")
    body = await request.read()
    rows = await off_loop_if_big(len(body), read_arrow_stream, body)
    delete = q.get("delete") == "1"
    await api.router.served_here(q["table"], rows, delete)
    r = await api.db.participant.reserve(q["table"], q["table_id"], int_arg(q["schema_version"], "schema_version"),
                                         rows, ts_arg(q["floor"], "floor"), int_arg(q["txn"], "txn"), delete,
                                         coordinator)
    return json_answer({"ts": r.ts, "rows": r.rows, "existed": r.existed})


async def _reserve_where(api: Api, request: web.Request, coordinator: tuple[str, str] | None) -> web.Response:
    q = request.query
    doc = await json_object(request, {"where", "bbox", "prefix", "partitions"}, ("partitions",))
    pids = doc["partitions"]
    if not isinstance(pids, list) or not pids:
        raise ApiError(400, "bad_request", '"partitions" is a list of partition numbers')
    pids = [int_arg(p, "a partition") for p in pids]
    await api.router.mine(q["table"], pids)
    version = int_arg(q["schema_version"], "schema_version")
    r = await api.db.participant.reserve_where(q["table"], q["table_id"], version, doc.get("where"), doc.get("bbox"),
                                               doc.get("prefix"), pids, ts_arg(q["floor"], "floor"),
                                               int_arg(q["txn"], "txn"), coordinator)
    return json_answer({"ts": r.ts, "rows": 0, "existed": 0})


async def prepare(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"txn", "ts"}, ("txn", "ts"))
    n = await api.db.participant.prepare(int_arg(doc["txn"], "txn"), ts_arg(doc["ts"], "ts"))
    return json_answer({"prepared": True, "rows": n})


async def commit(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"txn"}, ("txn",))
    return json_answer({"commit_ts": await api.db.participant.commit(int_arg(doc["txn"], "txn"))})


async def abort(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"txn"}, ("txn",))
    await api.db.participant.abort(int_arg(doc["txn"], "txn"))
    return json_answer({"aborted": True})


async def forget(api: Api, request: web.Request) -> web.Response:
    """Another node altered or dropped a table: read its definition from the catalog again."""
    doc = await json_object(request, {"table"}, ("table",))
    if not isinstance(doc["table"], str):
        raise ApiError(400, "bad_request", '"table" is a name')
    api.db.forget_cached_definitions(doc["table"])
    return json_answer({"forgotten": doc["table"]})

