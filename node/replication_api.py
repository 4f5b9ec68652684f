"""Replication messages between nodes (docs/format/replication.md): the follower's endpoints
and the leader's HTTP transport. Authenticated and marked like every internal call."""
from __future__ import annotations

import asyncio
import json
import struct

from aiohttp import web

from node.cluster import Cluster
from node.http_params import bound, ApiError, json_object
from rowstore.errors import FencedError
from rowstore.replication.follower import Piece
from rowstore.replication.leader import Transport
from rowstore.replication.position import Position

_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20
PROMISED = "X-Terrascale-Promised"  # a fenced answer: the epoch the replica promised


def add_replication_routes(api, router) -> None:
    router.add_post("/v1/internal/repl/append", bound(api, append))
    router.add_post("/v1/internal/repl/fence", bound(api, fence))
    router.add_post("/v1/internal/repl/promote", bound(api, promote))


def encode(header: dict, data: list[bytes]) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(head)), head, *data])


def decode(body: bytes) -> tuple[dict, list[Piece]]:
    """The header and its pieces, checked against the body (400 on any mismatch)."""
    if len(body) < 4:
        raise ApiError(400, "bad_request", "a replication message starts with its header's length")
    (n,) = _LEN.unpack_from(body)
    if n > MAX_HEADER or 4 + n > len(body):
        raise ApiError(400, "bad_request", "the header length runs past the body")
    try:
        h = json.loads(body[4 : 4 + n])
        if not isinstance(h, dict) or not isinstance(h.get("table"), str):
            raise ValueError("not an object with a table id")
        for k in ("pid", "epoch", "base"):
            if isinstance(h.get(k), bool) or not isinstance(h.get(k), int) or not 0 <= h[k] < 2**31:
                raise ValueError(f"{k} is not a small integer")
        start = Position.of(h.get("start"))
        pieces, at = [], 4 + n
        for p in h.get("pieces", []):
            segid, seq, off, ln = p
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p) or segid >= 2**32:
                raise ValueError(f"bad piece {p!r}"[:100])
            if at + ln > len(body):
                raise ValueError("a piece runs past the body")
            pieces.append(Piece(segid, seq, off, memoryview(body)[at : at + ln]))
            at += ln
        if at != len(body):
            raise ValueError("bytes after the last piece")
    except (ValueError, TypeError, KeyError) as e:
        raise ApiError(400, "bad_request", f"not a replication message: {e}"[:300]) from None
    h["start"] = start
    return h, pieces


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
                                           request.headers.get("X-Terrascale-Forwarded-By", ""))
    except FencedError as e:
        return _fenced(e)
    return web.json_response(out)


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
    return web.json_response(out)


async def promote(api, request):
    doc = await json_object(request, {"table", "pid"}, ("table", "pid"))
    if not isinstance(doc["table"], str) or isinstance(doc["pid"], bool) or not isinstance(doc["pid"], int):
        raise ApiError(400, "bad_request", '"table" is a table name, "pid" an integer')
    api.db  # noqa: B018 - 503 while starting or stopping
    if api.node.cluster is None or not api.node.cluster.multi:
        raise ApiError(409, "not_a_cluster", "replication needs a cluster (catalog raft://)")
    led = await api.node.replication.take_if_mine(doc["table"], doc["pid"])
    return web.json_response({"leading": led})


class HttpTransport(Transport):
    """A leader's appends over the internal HTTP endpoint, with a per-call deadline."""

    def __init__(self, cluster: Cluster, timeout_s: float):
        self.cluster, self.timeout_s = cluster, timeout_s

    async def append(self, node: str, header: dict, data: list[bytes]) -> dict:
        body = encode(header, data)
        status, headers, payload = await asyncio.wait_for(
            self.cluster.call(node, "POST", "/v1/internal/repl/append", body=body,
                              headers={"Content-Type": "application/octet-stream"}), self.timeout_s)
        try:
            doc = json.loads(payload)
        except ValueError:
            doc = {}
        if status == 409 and doc.get("error", {}).get("code") == "fenced":
            raise FencedError(doc["error"]["message"], int(headers.get(PROMISED, "0") or 0))
        if status != 200:
            raise ConnectionError(f"node {node} answered {status} to an append: {payload[:200]!r}")
        return doc
