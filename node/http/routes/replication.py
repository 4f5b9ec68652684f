"""Replication messages between nodes (docs/format/replication.md): the follower's endpoints
(append — one message, several of different partitions in one request, or frames of them on
a stream — fence, promote).
Authenticated and marked like every internal call; the leader's side is
:mod:`node.cluster.transport`."""
from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Coroutine
from typing import Any, cast

from aiohttp import WSCloseCode, WSMsgType, web

from node.cluster.members import FORWARDED
from node.cluster.stream import FRAME_ID, STREAM
from node.cluster.transport import PROMISED, decode, decode_many
from node.errors import ApiError
from node.http.api import Api
from node.http.edge import answer
from node.http.params import bound, json_object
from rowstore.errors import FencedError
from rowstore.replication.follower import SegmentPiece
from node.http.answers import json_answer

log = logging.getLogger("terrascale.node")

_Message = tuple[dict[str, Any], list[SegmentPiece]]  # a replication message: header, pieces
_Order = dict[tuple[str, int], asyncio.Future[None]]  # (table id, partition) -> set once its last message is done


def add_replication_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/internal/repl/append", bound(api, append))
    router.add_post("/v1/internal/repl/append_many", bound(api, append_many))
    router.add_get(STREAM, bound(api, stream))
    router.add_post("/v1/internal/repl/fence", bound(api, fence))
    router.add_post("/v1/internal/repl/promote", bound(api, promote))


def _fenced(e: FencedError) -> web.Response:
    """409 ``fenced``; the promised epoch in a header (the error body has its fixed shape)."""
    return json_answer({"error": {"code": "fenced", "message": str(e)}}, status=409,
                             headers={PROMISED: str(e.promised)})


def _cluster_node(api: Api) -> None:
    api.db  # noqa: B018 - 503 while starting or stopping
    if not api.multi:
        raise ApiError(409, "not_a_cluster", "replication needs a cluster (catalog raft://)")


async def _partition(api: Api, table_id: str, pid: int) -> None:
    """404 unless ``table_id`` is a live table of this cluster and ``pid`` one of its
    partitions (a message about anything else must change nothing); 409 on a single node."""
    _cluster_node(api)
    parts = await api.replication.partitions_of(table_id)
    if parts is None:
        raise ApiError(404, "table_not_found", f"no table with id {table_id!r}"[:200])
    if not 0 <= pid < parts:
        raise ApiError(400, "bad_request", f"table {table_id} has partitions 0..{parts - 1}")


async def append(api: Api, request: web.Request) -> web.Response:
    """Make the leader's pieces durable here; answer this replica's position."""
    h, pieces = decode(await request.read())
    await _partition(api, h["table"], h["pid"])
    try:
        out = await api.db.leadership.append(h["table"], h["pid"], h["epoch"], h["base"], h["start"], pieces,
                                           request.headers.get("X-Terrascale-Forwarded-By", ""), h["clock"])
    except FencedError as e:
        return _fenced(e)
    return json_answer(out)


async def append_many(api: Api, request: web.Request) -> web.Response:
    """Several leaders' messages (of this node's partitions) in one request: each made durable
    here as ``append`` would, the partitions concurrently (their groups meet in one device
    flush) and each partition's messages in order; a list of each message's own answer — the
    status and document a single ``append`` would have answered. A malformed body is 400 and
    applies nothing."""
    msgs = [decode(bytes(m)) for m in decode_many(await request.read())]
    via = request.headers.get(FORWARDED, "")
    return json_answer({"answers": await _apply(api, request, msgs, via, {})})


async def stream(api: Api, request: web.Request) -> web.WebSocketResponse:
    """A leader node's replication stream (a websocket): each binary frame is a frame id (u64)
    and an ``append_many`` body, answered — as soon as its messages are durable here, frames
    in any order — by a frame of the same id and the ``append_many`` answer (a malformed body:
    ``{"error": …}``, nothing of it applied). Frames run concurrently; the messages of one
    partition run in the order they arrived, across frames. Closed at shutdown; what is in
    flight then still finishes (a leader's stream sees the close and fails its frames)."""
    _cluster_node(api)
    ws = web.WebSocketResponse(max_msg_size=api.cfg.max_body, compress=False)
    await ws.prepare(request)
    api.streams.add(ws)
    via = request.headers.get(FORWARDED, "")
    order: _Order = {}
    frames: set[asyncio.Task[None]] = set()
    try:
        async for msg in ws:
            if msg.type != WSMsgType.BINARY or len(msg.data) < FRAME_ID.size:
                await ws.close(code=WSCloseCode.UNSUPPORTED_DATA, message=b"binary frames only")
                break
            t = asyncio.ensure_future(_frame(api, request, ws, msg.data, via, order))
            frames.add(t)
            t.add_done_callback(frames.discard)
    finally:
        api.streams.discard(ws)
        if frames:
            await asyncio.gather(*frames, return_exceptions=True)
    return ws


async def close_streams(api: Api) -> None:
    """Close every open stream (the node is stopping; frames in flight still finish)."""
    await asyncio.gather(*(ws.close(code=WSCloseCode.GOING_AWAY, message=b"stopping") for ws in list(api.streams)),
                         return_exceptions=True)


async def _frame(api: Api, request: web.Request, ws: web.WebSocketResponse, data: bytes, via: str,
                 order: _Order) -> None:
    fid = data[:FRAME_ID.size]
    try:
        try:
            # decode_many takes any buffer (it reads through a memoryview): the frame is not copied
            msgs = [decode(bytes(m)) for m in decode_many(cast(bytes, memoryview(data)[FRAME_ID.size:]))]
        except ApiError as e:
            out: dict[str, Any] = {"error": {"code": e.code, "message": e.message}}
        else:
            out = {"answers": await _apply(api, request, msgs, via, order)}
        if not ws.closed:
            await ws.send_bytes(fid + json.dumps(out, separators=(",", ":")).encode())
    except ConnectionError:
        pass  # the leader went away: it failed this frame on its side
    except Exception as e:  # noqa: BLE001 - unanswerable: close, so the leader fails it now, not at its deadline
        log.warning("event=replication_frame_failed error=%r", e)
        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"a frame failed")


async def _apply(api: Api, request: web.Request, msgs: list[_Message], via: str,
                 order: _Order) -> list[dict[str, Any]]:
    """Each message's answer, as ``append`` would give it: the partitions concurrently, the
    messages of one partition one after another — after those of earlier calls sharing
    ``order`` (partition -> the future its last message sets when done)."""
    loop = asyncio.get_running_loop()
    by_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, (h, _) in enumerate(msgs):
        by_partition[(h["table"], h["pid"])].append(i)
    answers: list[dict[str, Any]] = [{}] * len(msgs)

    async def one(i: int) -> dict[str, Any]:
        h, pieces = msgs[i]
        try:
            await _partition(api, h["table"], h["pid"])
            return {"status": 200, "body": await api.db.leadership.append(
                h["table"], h["pid"], h["epoch"], h["base"], h["start"], pieces, via, h["clock"])}
        except FencedError as e:
            return {"status": 409, "body": {"error": {"code": "fenced", "message": str(e)}}, "promised": e.promised}
        except Exception as e:  # noqa: BLE001 - translated as the edge answers a single append
            resp = answer(request, e)
            assert isinstance(resp.body, bytes)  # a JSON answer's (web.json_response)
            return {"status": resp.status, "body": json.loads(resp.body)}

    async def in_order(key: tuple[str, int], indexes: list[int], before: asyncio.Future[None] | None,
                       done: asyncio.Future[None]) -> None:
        try:
            if before is not None:
                await asyncio.shield(before)
            for i in indexes:
                answers[i] = await one(i)
        finally:
            done.set_result(None)
            if order.get(key) is done:
                del order[key]

    runs: list[Coroutine[Any, Any, None]] = []
    for key, indexes in by_partition.items():
        done: asyncio.Future[None] = loop.create_future()
        runs.append(in_order(key, indexes, order.get(key), done))
        order[key] = done
    await asyncio.gather(*runs)
    return answers


async def fence(api: Api, request: web.Request) -> web.Response:
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
    return json_answer({**out, "writable": api.db.can_write()})


async def promote(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"table", "pid"}, ("table", "pid"))
    if not isinstance(doc["table"], str) or isinstance(doc["pid"], bool) or not isinstance(doc["pid"], int):
        raise ApiError(400, "bad_request", '"table" is a table name, "pid" an integer')
    _cluster_node(api)
    led = await api.replication.take_if_mine(doc["table"], doc["pid"])
    return json_answer({"leading": led})
