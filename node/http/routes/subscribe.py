"""Live subscriptions (docs/rfcs/0015-subscriptions.md, docs/REFERENCE.md §3):
``GET /v1/tables/{t}/subscribe`` as a WebSocket, or as server-sent events for clients
without one. Everything a subscription can be refused for is checked before the upgrade and
answered as any request's error; then frames (node/http/frames.py) — a JSON array of changes,
``{"closed": T}``, and last, when the node ends it, ``{"error": …}``. In a cluster, each node
leading some of the table's partitions serves its share (``GET /v1/internal/subscribe``) and
the node the subscriber reached merges them (node/http/merge.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from node.errors import ApiError
from node.http.answers import json_text
from node.http.api import Api
from node.http.frames import FrameStream, LocalFrames
from node.http.merge import MergedFrames, RemoteShare
from node.http.params import CONFIG, bound, int_arg, parse_json
from rowstore.db.read.subscribe import parse_filter, prefix_partition
from rowstore.errors import SubscriptionEndedError

ROUTE = "/v1/tables/{table}/subscribe"
INTERNAL = "/v1/internal/subscribe"  # a node's share of a subscription across nodes
EVENT_STREAM = "text/event-stream"
_LAST_WORDS_S = 5.0  # how long an ended subscription's last frame and close may take
_JSON_PARAMS = ("where", "bbox", "prefix", "columns")
# the node ended the subscription: the WebSocket close code that says so (RFC 6455 §7.4.1)
_CLOSE = {"slow_subscriber": WSCloseCode.POLICY_VIOLATION, "stopping": WSCloseCode.GOING_AWAY}


def add_subscribe_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_get(ROUTE, bound(api, subscribe))
    router.add_get(INTERNAL, bound(api, internal))


async def subscribe(api: Api, request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse(compress=False, max_msg_size=1 << 16)
    upgrade = ws.can_prepare(request).ok
    if not upgrade and EVENT_STREAM not in request.headers.get("Accept", ""):
        raise ApiError(400, "bad_request", f"a subscription is a WebSocket upgrade, or a GET with Accept: "
                                           f"{EVENT_STREAM}")
    args = _args(request, _JSON_PARAMS)
    _room_for_one(api)
    stream = await _open(api, request.match_info["table"], args)
    return await _serve(api, request, ws if upgrade else None, stream)


async def internal(api: Api, request: web.Request) -> web.StreamResponse:
    """Node to node: this node's share of a subscription across nodes — the ``partitions``
    (a JSON list) it leads, from the ``from`` the merging node chose."""
    ws = web.WebSocketResponse(compress=False, max_msg_size=1 << 16)
    if not ws.can_prepare(request).ok:
        raise ApiError(400, "bad_request", "a share of a subscription is a WebSocket")
    args = _args(request, (*_JSON_PARAMS, "table", "partitions"))
    table, pids = args.pop("table", None), args.pop("partitions", None)
    if not isinstance(table, str) or not isinstance(pids, list) or "from_ts" not in args:
        raise ApiError(400, "bad_request", "a share names its table, partitions and from")
    _room_for_one(api)
    db = api.db
    sub = await db.subscribe(table, **args, partitions=[int_arg(p, "a partition") for p in pids], trusted=True)
    return await _serve(api, request, ws, LocalFrames(db, sub))


def _room_for_one(api: Api) -> None:
    if len(api.subscriptions) >= api.cfg.subscriptions_max:
        api.metrics.subscription_drops.labels("too_many").inc()
        raise ApiError(429, "too_many_subscriptions", f"this node has {len(api.subscriptions)} open subscriptions, "
                                                      f"its limit (subscriptions.max)")


async def _open(api: Api, table: str, args: dict[str, Any]) -> FrameStream:
    """This node's subscription, or — its partitions led by several nodes — every leader's
    share merged (node/http/merge.py), each checked before anything is sent."""
    db = api.db
    if not api.multi:
        return LocalFrames(db, await db.subscribe(table, **args))
    d = await db.describe(table)
    assert d.schema is not None  # describe() refuses a dropped table
    parse_filter(d.schema, *(args.get(k) for k in _JSON_PARAMS))  # refused here, not by a share
    by_node = (await api.router.placement(d, fresh=True)).by_node()
    pick = prefix_partition(d.schema, args.get("prefix"), d.partitions)
    if pick is not None:  # a prefix covering the partition key: only its partition's leader
        by_node = {n: [pick] for n, pids in by_node.items() if pick in pids}
        if not by_node:
            raise ApiError(503, "unavailable", f"table {table!r}: partition {pick} has no leader now; retry")
    me = api.cluster.node_id
    if set(by_node) == {me}:
        return LocalFrames(db, await db.subscribe(table, **args, partitions=by_node[me]))
    F = await db.snapshot(args.pop("from_ts", None))  # every share from one T (410, 409 here)
    shares: list[FrameStream | RemoteShare] = []
    try:
        for node, pids in sorted(by_node.items()):
            if node == me:
                shares.append(LocalFrames(db, await db.subscribe(table, F, **args, partitions=pids, trusted=True)))
            else:
                shares.append(await RemoteShare.open(api.cluster, node, _share_path(table, pids, F, args)))
    except (aiohttp.WSServerHandshakeError, ConnectionError) as e:
        for s in shares:
            s.close()
        raise ApiError(503, "unavailable", f"table {table!r}: a node leading its partitions did not take the "
                                           f"subscription ({e}); retry") from None
    except BaseException:
        for s in shares:
            s.close()
        raise
    return MergedFrames(shares, api.cfg.subscription_buffer_bytes)


def _share_path(table: str, pids: list[int], F: int, args: dict[str, Any]) -> str:
    q = {"table": json.dumps(table), "partitions": json.dumps(pids), "from": str(F),
         **{k: json.dumps(args[k]) for k in _JSON_PARAMS if args.get(k) is not None}}
    return f"{INTERNAL}?{urlencode(q)}"


async def _serve(api: Api, request: web.Request, ws: web.WebSocketResponse | None,
                 stream: FrameStream) -> web.StreamResponse:
    api.subscriptions.add(stream)
    api.metrics.subscriptions.set(len(api.subscriptions))
    watch = asyncio.ensure_future(_watch(api, request, stream))
    try:
        if ws is not None:
            await ws.prepare(request)
            await _serve_websocket(api, ws, stream)
            return ws
        return await _serve_events(api, request, stream)
    finally:
        watch.cancel()
        api.subscriptions.discard(stream)
        api.metrics.subscriptions.set(len(api.subscriptions))
        stream.close()


async def _watch(api: Api, request: web.Request, stream: FrameStream) -> None:
    """When the node ends the subscription its handler sends the last frame and closes; one
    stuck in a send (a subscriber that stopped reading: its socket is full) is cut off after
    ``_LAST_WORDS_S``."""
    e = await stream.finished()
    if e.code in ("gone", "closed"):
        return
    api.metrics.subscription_drops.labels(e.code).inc()
    await asyncio.sleep(_LAST_WORDS_S)
    if request.transport is not None:
        request.transport.abort()


def _args(request: web.Request, names: tuple[str, ...]) -> dict[str, Any]:
    """The query string: each of ``names`` URL-encoded JSON (the shapes /query and /scan take),
    ``from`` a commit timestamp (or, over SSE, the ``Last-Event-ID`` a reconnect sends)."""
    q = request.query
    extra = set(q) - {*names, "from"}
    if extra:
        raise ApiError(400, "bad_request", f"unknown query parameter(s): {', '.join(sorted(extra))}"[:200])
    depth = request.app[CONFIG].max_json_depth
    out: dict[str, Any] = {}
    for k in names:
        if k in q:
            try:
                out[k] = parse_json(q[k].encode(), depth)
            except ApiError as e:
                raise ApiError(400, "invalid_query", f"{k}: not JSON ({e.message})"[:200]) from None
    where, most = out.get("where"), request.app[CONFIG].max_query_terms
    if isinstance(where, list) and len(where) > most:
        raise ApiError(413, "too_large", f"{len(where)} where terms; a subscription takes at most {most} "
                                         "(node.max_query_terms)")
    raw = q.get("from", request.headers.get("Last-Event-ID"))
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 20):
            raise ApiError(400, "invalid_as_of", f"from must be a commit timestamp (a non-negative integer), "
                                                 f"not {raw!r}"[:200])
        out["from_ts"] = int(raw)
    return out


async def _serve_websocket(api: Api, ws: web.WebSocketResponse, stream: FrameStream) -> None:
    """Frames until the subscriber leaves (its close ends the subscription) or the node ends it:
    then its last frame says why, and the connection closes (``_watch`` cuts it off when the
    subscriber does not take that frame)."""
    async def listen() -> None:
        with contextlib.suppress(Exception):
            async for _ in ws:  # a subscriber sends nothing; its close frame ends this loop
                pass
        stream.end("gone", "the subscriber left", drop=True)

    def send(b: bytes) -> Awaitable[None]:
        return ws.send_frame(b, WSMsgType.TEXT)

    listener = asyncio.ensure_future(listen())
    try:
        while True:
            try:
                f = await stream.next()
            except SubscriptionEndedError as e:
                if e.code != "gone":
                    await _send(api, send, json_text({"error": {"code": e.code, "message": str(e)}}), "error")
                    await ws.close(code=_CLOSE.get(e.code, WSCloseCode.TRY_AGAIN_LATER), message=e.code.encode())
                return
            await _send(api, send, f.text, f.kind, f.changes)
    except ConnectionError:
        return
    finally:
        listener.cancel()


async def _serve_events(api: Api, request: web.Request, stream: FrameStream) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
        while True:
            try:
                f = await stream.next()
            except SubscriptionEndedError as e:
                text = b"event: error\ndata: " + json_text({"error": {"code": e.code, "message": str(e)}}) + b"\n\n"
                await _send(api, resp.write, text, "error")
                return resp
            head = b"id: %d\n" % f.closed if f.closed is not None else b""
            await _send(api, resp.write, head + b"data: " + f.text + b"\n\n", f.kind, f.changes)
    except ConnectionError:  # the subscriber left: a write to its closed connection
        return resp


async def _send(api: Api, send: Any, data: Any, kind: str, changes: int = 0) -> None:
    await send(data)
    m = api.metrics
    m.subscription_frames.labels(kind).inc()
    m.subscription_bytes.inc(len(data))
    if changes:
        m.subscription_changes.inc(changes)


async def end_subscriptions(api: Api) -> None:
    """The node stops: every subscription hears why, then its connection closes (a subscription
    would otherwise hold the shutdown for ``node.shutdown_timeout``)."""
    for stream in list(api.subscriptions):
        stream.end("stopping", "the node is stopping; resume from the last closed timestamp")
