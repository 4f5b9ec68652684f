"""Endpoints nodes call on each other (docs/rfcs/0010-replication.md; fields:
docs/format/placement.md). Authenticated like every other endpoint; not for clients —
their answers follow the documented error shape all the same."""
from __future__ import annotations

import time

from aiohttp import web

from node.http.params import bound, off_loop_if_big, json_object
from node.errors import ApiError
from node.cluster.members import FORWARDED, INCARNATION
from node.wire import ARROW_STREAM, read_arrow_stream, write_arrow_stream
from rowstore.hlc import ms_of


def add_internal_routes(api, router) -> None:
    router.add_get("/v1/internal/closed", bound(api, closed))
    router.add_post("/v1/internal/read", bound(api, read))
    router.add_post("/v1/internal/plan", bound(api, plan))
    router.add_post("/v1/internal/changes", bound(api, changes))
    router.add_post("/v1/internal/txn/reserve", bound(api, reserve))
    router.add_post("/v1/internal/txn/prepare", bound(api, prepare))
    router.add_post("/v1/internal/txn/commit", bound(api, commit))
    router.add_post("/v1/internal/txn/abort", bound(api, abort))
    router.add_post("/v1/internal/forget", bound(api, forget))


MAX_SKEW_MS = 10_000  # how far ahead of this node's clock another node's timestamp may be


def _int(raw, name: str) -> int:
    if isinstance(raw, str) and raw.isdigit() and len(raw) <= 20:
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < 2**64:
        raise ApiError(400, "bad_request", f"{name} is an integer 0..2^64-1, not {raw!r}"[:200])
    return raw


def _ts(raw, name: str) -> int:
    """A timestamp from another node: observed by this node's clock, so never far ahead of
    it (a wild one would push every later commit timestamp up with it)."""
    ts = _int(raw, name)
    if ms_of(ts) > time.time_ns() // 1_000_000 + MAX_SKEW_MS:
        raise ApiError(400, "bad_request", f"{name} {ts} is more than {MAX_SKEW_MS // 1000} s ahead of this "
                                           "node's clock")
    return ts


def _name(raw) -> str:
    if not isinstance(raw, str):
        raise ApiError(400, "bad_request", '"table" is a table name')
    return raw


async def closed(api, request):
    """This node's closed timestamp, after observing the caller's (HLC receive rule)."""
    db = api.db
    if "observe" in request.query:
        db.clock.observe(_ts(request.query["observe"], "observe"))
    return web.json_response({"closed_ts": db.closed_ts, "node": api.node.cfg.node_id,
                              "incarnation": api.node.incarnation})


async def read(api, request):
    """A query restricted to this node's partitions ``partitions`` at T (any columns: the
    caller projects after merging)."""
    doc = await json_object(request, {"table", "partitions", "as_of", "where", "bbox", "limit"},
                             ("table", "partitions", "as_of"))
    pids = doc["partitions"]
    if not isinstance(pids, list) or not pids:
        raise ApiError(400, "bad_request", '"partitions" is a non-empty list of partition numbers')
    pids = [_int(p, "a partition") for p in pids]
    limit = doc.get("limit")
    t, _ = await api.router.local_read(_name(doc["table"]), pids, _ts(doc["as_of"], "as_of"), doc.get("where"),
                                       doc.get("bbox"), None if limit is None else _int(limit, "limit"))
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def _share(api, request, fields: set, required: tuple):
    """A request for this node's share of a table read across nodes: (doc, partitions), the
    partitions checked to be served here (421 otherwise)."""
    doc = await json_object(request, fields | {"table", "partitions"}, ("table", "partitions", *required))
    pids = doc["partitions"]
    if not isinstance(pids, list) or not pids:
        raise ApiError(400, "bad_request", '"partitions" is a non-empty list of partition numbers')
    pids = [_int(p, "a partition") for p in pids]
    await api.router.mine(_name(doc["table"]), pids)
    return doc, pids


async def plan(api, request):
    """This node's share of a read plan (no lease: the coordinating node takes it)."""
    doc, pids = await _share(api, request, {"as_of", "where", "bbox"}, ("as_of",))
    out = await api.db.read_plan(doc["table"], _ts(doc["as_of"], "as_of"), doc.get("where"), doc.get("bbox"),
                                 False, 600.0, partitions=pids, trusted=True)
    return web.json_response(out.to_json())


async def changes(api, request):
    """This node's share of a change feed, in (after, upto]."""
    doc, pids = await _share(api, request, {"after", "upto"}, ("after", "upto"))
    t, _ = await api.db.changes(doc["table"], _int(doc["after"], "after"), _ts(doc["upto"], "upto"), partitions=pids,
                                trusted=True)
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def reserve(api, request):
    q = request.query
    for k in ("table", "table_id", "schema_version", "floor", "txn"):
        if k not in q:
            raise ApiError(400, "bad_request", f"missing {k}")
    if request.content_type != ARROW_STREAM:
        raise ApiError(415, "unsupported_media_type", f"rows come as {ARROW_STREAM}")
    body = await request.read()
    rows = await off_loop_if_big(len(body), read_arrow_stream, body)
    delete = q.get("delete") == "1"
    await api.router.served_here(q["table"], rows, delete)
    coordinator = (request.headers.get(FORWARDED), request.headers.get(INCARNATION))
    r = await api.db.participant.reserve(q["table"], q["table_id"], _int(q["schema_version"], "schema_version"),
                                         rows, _ts(q["floor"], "floor"), _int(q["txn"], "txn"), delete,
                                         coordinator if all(coordinator) else None)
    return web.json_response({"ts": r.ts, "rows": r.rows, "existed": r.existed})


async def prepare(api, request):
    doc = await json_object(request, {"txn", "ts"}, ("txn", "ts"))
    await api.db.participant.prepare(_int(doc["txn"], "txn"), _ts(doc["ts"], "ts"))
    return web.json_response({"prepared": True})


async def commit(api, request):
    doc = await json_object(request, {"txn"}, ("txn",))
    return web.json_response({"commit_ts": await api.db.participant.commit(_int(doc["txn"], "txn"))})


async def abort(api, request):
    doc = await json_object(request, {"txn"}, ("txn",))
    await api.db.participant.abort(_int(doc["txn"], "txn"))
    return web.json_response({"aborted": True})


async def forget(api, request):
    """Another node altered or dropped a table: read its definition from the catalog again."""
    doc = await json_object(request, {"table"}, ("table",))
    if not isinstance(doc["table"], str):
        raise ApiError(400, "bad_request", '"table" is a name')
    api.db.forget_cached_definitions(doc["table"])
    return web.json_response({"forgotten": doc["table"]})

