"""Live subscriptions (docs/rfcs/0015-subscriptions.md, docs/REFERENCE.md §3):
``GET /v1/tables/{t}/subscribe`` as a WebSocket, or as server-sent events for clients
without one. Everything a subscription can be refused for is checked before the upgrade and
answered as any request's error; then the engine's items become JSON text frames — a JSON
array of changes, ``{"closed": T}``, and last, when the node ends it, ``{"error": …}``."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pyarrow as pa
from aiohttp import WSCloseCode, WSMsgType, web

from node.errors import ApiError
from node.http.answers import json_text
from node.http.api import Api
from node.http.params import CONFIG, bound, off_loop_if_big, parse_json
from node.wire import table_to_rows
from rowstore.db.read.subscribe import Changes, Closed, Item, Subscription
from rowstore.errors import SubscriptionEndedError

ROUTE = "/v1/tables/{table}/subscribe"
EVENT_STREAM = "text/event-stream"
FRAME_CHANGES = 1000  # changes per text frame at most
FRAME_BYTES = 256 << 10  # and bytes: a frame fits the line and message limits of common clients
_LAST_WORDS_S = 5.0  # how long an ended subscription's last frame and close may take
_JSON_PARAMS = ("where", "bbox", "prefix", "columns")
# the node ended the subscription: the WebSocket close code that says so (RFC 6455 §7.4.1)
_CLOSE = {"slow_subscriber": WSCloseCode.POLICY_VIOLATION, "stopping": WSCloseCode.GOING_AWAY}


def add_subscribe_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_get(ROUTE, bound(api, subscribe))


async def subscribe(api: Api, request: web.Request) -> web.StreamResponse:
    ws = web.WebSocketResponse(compress=False, max_msg_size=1 << 16)
    upgrade = ws.can_prepare(request).ok
    if not upgrade and EVENT_STREAM not in request.headers.get("Accept", ""):
        raise ApiError(400, "bad_request", f"a subscription is a WebSocket upgrade, or a GET with Accept: "
                                           f"{EVENT_STREAM}")
    args = _args(request)
    if len(api.subscriptions) >= api.cfg.subscriptions_max:
        api.metrics.subscription_drops.labels("too_many").inc()
        raise ApiError(429, "too_many_subscriptions", f"this node has {len(api.subscriptions)} open subscriptions, "
                                                      f"its limit (subscriptions.max)")
    db = api.db
    table = request.match_info["table"]
    if api.multi and len(await api.cluster.owns(d := await db.describe(table))) < d.partitions:
        raise ApiError(503, "unavailable", f"table {table!r} has partitions led by other nodes; subscriptions "
                                           "across nodes are not served yet (docs/rfcs/0015-subscriptions.md §8)")
    sub = await db.subscribe(table, **args)
    api.subscriptions.add(sub)
    api.metrics.subscriptions.set(len(api.subscriptions))
    watch = asyncio.ensure_future(_watch(api, request, sub))
    try:
        if upgrade:
            await ws.prepare(request)
            await _serve_websocket(api, ws, sub)
            return ws
        return await _serve_events(api, request, sub)
    finally:
        watch.cancel()
        api.subscriptions.discard(sub)
        api.metrics.subscriptions.set(len(api.subscriptions))
        db.unsubscribe(sub)


async def _watch(api: Api, request: web.Request, sub: Subscription) -> None:
    """When the node ends the subscription its handler sends the last frame and closes; one
    stuck in a send (a subscriber that stopped reading: its socket is full) is cut off after
    ``_LAST_WORDS_S``."""
    e = await sub.finished()
    if e.code in ("gone", "closed"):
        return
    api.metrics.subscription_drops.labels(e.code).inc()
    await asyncio.sleep(_LAST_WORDS_S)
    if request.transport is not None:
        request.transport.abort()


def _args(request: web.Request) -> dict[str, Any]:
    """The query string: each filter URL-encoded JSON (the shapes /query and /scan take),
    ``from`` a commit timestamp (or, over SSE, the ``Last-Event-ID`` a reconnect sends)."""
    q = request.query
    extra = set(q) - {*_JSON_PARAMS, "from"}
    if extra:
        raise ApiError(400, "bad_request", f"unknown query parameter(s): {', '.join(sorted(extra))}"[:200])
    depth = request.app[CONFIG].max_json_depth
    out: dict[str, Any] = {}
    for k in _JSON_PARAMS:
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


async def _serve_websocket(api: Api, ws: web.WebSocketResponse, sub: Subscription) -> None:
    """Frames until the subscriber leaves (its close ends the subscription) or the node ends it:
    then its last frame says why, and the connection closes (``_watch`` cuts it off when the
    subscriber does not take that frame)."""
    async def listen() -> None:
        with contextlib.suppress(Exception):
            async for _ in ws:  # a subscriber sends nothing; its close frame ends this loop
                pass
        sub.end("gone", "the subscriber left", drop=True)

    listener = asyncio.ensure_future(listen())
    try:
        while True:
            try:
                item = await sub.next()
            except SubscriptionEndedError as e:
                if e.code != "gone":
                    await _send(api, lambda b: ws.send_frame(b, WSMsgType.TEXT),
                                json_text({"error": {"code": e.code, "message": str(e)}}), "error")
                    await ws.close(code=_CLOSE.get(e.code, WSCloseCode.TRY_AGAIN_LATER), message=e.code.encode())
                return
            for text, kind, n in await _frames(item, sub):
                await _send(api, lambda b: ws.send_frame(b, WSMsgType.TEXT), text, kind, n)
    except ConnectionError:
        return
    finally:
        listener.cancel()


async def _serve_events(api: Api, request: web.Request, sub: Subscription) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    try:
        while True:
            try:
                item = await sub.next()
            except SubscriptionEndedError as e:
                text = b"event: error\ndata: " + json_text({"error": {"code": e.code, "message": str(e)}}) + b"\n\n"
                await _send(api, resp.write, text, "error")
                return resp
            for text, kind, n in await _frames(item, sub):
                head = b"id: %d\n" % item.ts if isinstance(item, Closed) else b""
                await _send(api, resp.write, head + b"data: " + text + b"\n\n", kind, n)
    except ConnectionError:  # the subscriber left: a write to its closed connection
        return resp


async def _send(api: Api, send: Any, data: Any, kind: str, changes: int = 0) -> None:
    await send(data)
    m = api.metrics
    m.subscription_frames.labels(kind).inc()
    m.subscription_bytes.inc(len(data))
    if changes:
        m.subscription_changes.inc(changes)


async def _frames(item: Item, sub: Subscription) -> list[tuple[bytes, str, int]]:
    """An item as text frames: (JSON text, kind, changes in it)."""
    if not isinstance(item, Changes):
        return [(json_text({"closed": item.ts}), "closed", 0)]
    return await off_loop_if_big(item.nbytes, _change_frames, item, sub.filter.columns, sub.schema.pk.names)


def _change_frames(item: Changes, columns: list[str], keys: list[str]) -> list[tuple[bytes, str, int]]:
    r, idx = item.round, item.idx
    if len(idx) * 2 >= r.rows:  # most of the round: its rows as JSON once, for every subscriber with these columns
        memo = ("json", tuple(columns))
        rows = r.memo.get(memo)
        if rows is None:
            rows = r.memo[memo] = table_to_rows(pa.Table.from_batches([r.batch]).select(columns))
        picked = [rows[i] for i in idx.tolist()]
    else:
        picked = table_to_rows(pa.Table.from_batches([r.batch.take(pa.array(idx))]).select(columns))
    ts, deleted = r.ts[idx].tolist(), r.deleted[idx].tolist()
    changes = [{"op": "delete", "commit_ts": t, "row": {k: row[k] for k in keys}} if gone else
               {"op": "upsert", "commit_ts": t, "row": row} for row, t, gone in zip(picked, ts, deleted)]
    out: list[tuple[bytes, str, int]] = []
    for a in range(0, len(changes), FRAME_CHANGES):
        _fit(changes[a : a + FRAME_CHANGES], out)
    return out


def _fit(changes: list[dict[str, Any]], out: list[tuple[bytes, str, int]]) -> None:
    """``changes`` as frames of at most ``FRAME_BYTES`` (halved until they fit; a change larger
    than that travels alone)."""
    text = json_text(changes)
    if len(text) <= FRAME_BYTES or len(changes) == 1:
        out.append((text, "changes", len(changes)))
        return
    half = len(changes) // 2
    _fit(changes[:half], out)
    _fit(changes[half:], out)


async def end_subscriptions(api: Api) -> None:
    """The node stops: every subscription hears why, then its connection closes (a subscription
    would otherwise hold the shutdown for ``node.shutdown_timeout``)."""
    for sub in list(api.subscriptions):
        sub.end("stopping", "the node is stopping; resume from the last closed timestamp")
