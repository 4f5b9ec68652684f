"""Replication messages between nodes (docs/format/replication.md): the follower's endpoints
(append — one message, or several of different partitions in one request — fence, promote).
Authenticated and marked like every internal call; the leader's side is
:mod:`node.cluster.transport`."""
from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from aiohttp import web

from node.cluster.transport import PROMISED, decode, decode_many
from node.errors import ApiError
from node.http.edge import answer
from node.http.params import bound, json_object
from rowstore.errors import FencedError


def add_replication_routes(api, router) -> None:
    router.add_post("/v1/internal/repl/append", bound(api, append))
    router.add_post("/v1/internal/repl/append_many", bound(api, append_many))
    router.add_post("/v1/internal/repl/fence", bound(api, fence))
    router.add_post("/v1/internal/repl/promote", bound(api, promote))


def _fenced(e: FencedError) -> web.Response:
    """409 ``fenced``; the promised epoch in a header (the error body has its fixed shape)."""
    return web.json_response({"error": {"code": "fenced", "message": str(e)}}, status=409,
                             headers={PROMISED: str(e.promised)})


async def _partition(api, table_id: str, pid: int) -> None:
    """404 unless ``table_id`` is a live table of this cluster and ``pid`` one of its
    partitions (a message about anything else must change nothing); 409 on a single node."""
    api.db  # noqa: B018 - 503 while starting or stopping
    if api.node.cluster is None or not api.node.cluster.multi:
        raise ApiError(409, "not_a_cluster", "replication needs a cluster (catalog raft://)")
    parts = api.node.replication.known.get(table_id)
    if parts is None:
        api.node.replication.known = {d.table_id: d.partitions for d in await api.db.list_tables()}
        parts = api.node.replication.known.get(table_id)
    if parts is None:
        raise ApiError(404, "table_not_found", f"no table with id {table_id!r}"[:200])
    if not 0 <= pid < parts:
        raise ApiError(400, "bad_request", f"table {table_id} has partitions 0..{parts - 1}")


async def append(api, request):
    """Make the leader's pieces durable here; answer this replica's position."""
    h, pieces = decode(await request.read())
    await _partition(api, h["table"], h["pid"])
    try:
        out = await api.db.leadership.append(h["table"], h["pid"], h["epoch"], h["base"], h["start"], pieces,
                                           request.headers.get("X-Terrascale-Forwarded-By", ""), h["clock"])
    except FencedError as e:
        return _fenced(e)
    return web.json_response(out)


async def append_many(api, request):
    """Several leaders' messages (of this node's partitions) in one request: each made durable
    here as ``append`` would, the partitions concurrently (their groups meet in one device
    flush) and each partition's messages in order; a list of each message's own answer — the
    status and document a single ``append`` would have answered. A malformed body is 400 and
    applies nothing."""
    msgs = [decode(bytes(m)) for m in decode_many(await request.read())]
    by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, (h, _) in enumerate(msgs):
        by_partition[(h["table"], h["pid"])].append(i)
    answers: list[dict] = [{}] * len(msgs)
    via = request.headers.get("X-Terrascale-Forwarded-By", "")

    async def one(i: int) -> dict:
        h, pieces = msgs[i]
        try:
            await _partition(api, h["table"], h["pid"])
            return {"status": 200, "body": await api.db.leadership.append(
                h["table"], h["pid"], h["epoch"], h["base"], h["start"], pieces, via, h["clock"])}
        except FencedError as e:
            return {"status": 409, "body": {"error": {"code": "fenced", "message": str(e)}}, "promised": e.promised}
        except Exception as e:  # noqa: BLE001 - translated as the edge answers a single append
            resp = answer(request, e)
            return {"status": resp.status, "body": json.loads(resp.body)}

    async def in_order(indexes: list[int]) -> None:
        for i in indexes:
            answers[i] = await one(i)

    await asyncio.gather(*(in_order(ix) for ix in by_partition.values()))
    return web.json_response({"answers": answers})


async def fence(api, request):
    doc = await json_object(request, {"table", "pid", "epoch", "force"}, ("table", "pid", "epoch"))
    if not isinstance(doc["table"], str) or not all(isinstance(doc[k], int) and not isinstance(doc[k], bool)
                                                    and 0 <= doc[k] < 2**31 for k in ("pid", "epoch")):
        raise ApiError(400, "bad_request", '"table" is a table id, "pid" and "epoch" integers')
    if not isinstance(doc.get("force", False), bool):
        raise ApiError(400, "bad_request", '"force" is true or false')
    await _partition(api, doc["table"], doc["pid"])
    try:
        out = await api.db.leadership.fence(doc["table"], doc["pid"], doc["epoch"], doc.get("force", False))
    except FencedError as e:
        return _fenced(e)
    return web.json_response({**out, "writable": api.db.can_write()})


async def promote(api, request):
    doc = await json_object(request, {"table", "pid"}, ("table", "pid"))
    if not isinstance(doc["table"], str) or isinstance(doc["pid"], bool) or not isinstance(doc["pid"], int):
        raise ApiError(400, "bad_request", '"table" is a table name, "pid" an integer')
    api.db  # noqa: B018 - 503 while starting or stopping
    if api.node.cluster is None or not api.node.cluster.multi:
        raise ApiError(409, "not_a_cluster", "replication needs a cluster (catalog raft://)")
    led = await api.node.replication.take_if_mine(doc["table"], doc["pid"])
    return web.json_response({"leading": led})
