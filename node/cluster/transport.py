"""The replication messages' wire form (docs/format/replication.md) and the leader's transport:
a leader's appends sent to a follower node on one stream (``/v1/internal/repl/stream``, frames
of several partitions' messages, :mod:`node.cluster.stream`), or to an older follower over
HTTP (``/v1/internal/repl/append_many``, ``/v1/internal/repl/append``) (RFC 0011, step 2).
The follower's endpoints are :mod:`node.http.routes.replication`."""
from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import aiohttp

from node.cluster.members import Cluster
from node.cluster.stream import STREAM, Stream, StreamClosed, batch_answers
from node.errors import ApiError
from rowstore.errors import FencedError
from rowstore.replication.follower import SegmentPiece
from rowstore.replication.leader import Transport
from rowstore.segments.position import Position

_LEN = struct.Struct("<I")
MAX_HEADER = 1 << 20
PROMISED = "X-Terrascale-Promised"  # a fenced answer: the epoch the replica promised


def encode(header: dict[str, Any], data: list[bytes]) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([_LEN.pack(len(head)), head, *data])


def decode(body: bytes) -> tuple[dict[str, Any], list[SegmentPiece]]:
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
        h.setdefault("clock", 0)  # the leader's present (absent from an older leader)
        if isinstance(h["clock"], bool) or not isinstance(h["clock"], int) or not 0 <= h["clock"] < 2**63:
            raise ValueError("clock is not a timestamp")
        pieces, at = [], 4 + n
        for p in h.get("pieces", []):
            segid, seq, off, ln = p
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in p) or segid >= 2**32:
                raise ValueError(f"bad piece {p!r}"[:100])
            if at + ln > len(body):
                raise ValueError("a piece runs past the body")
            pieces.append(SegmentPiece(segid, seq, off, memoryview(body)[at : at + ln]))
            at += ln
        if at != len(body):
            raise ValueError("bytes after the last piece")
    except (ValueError, TypeError, KeyError) as e:
        raise ApiError(400, "bad_request", f"not a replication message: {e}"[:300]) from None
    h["start"] = start
    return h, pieces


def encode_many(bodies: list[bytes]) -> bytes:
    """Several messages in one body: their count, then each one's length and bytes."""
    return b"".join([_LEN.pack(len(bodies)), *(_LEN.pack(len(b)) + b for b in bodies)])


def decode_many(body: bytes) -> list[memoryview]:
    """The messages of a batch body, checked against it (400 on any mismatch: none applied)."""
    view = memoryview(body)
    if len(view) < 4:
        raise ApiError(400, "bad_request", "a batch of replication messages starts with their count")
    (n,) = _LEN.unpack_from(view)
    if not 1 <= n <= MAX_BATCH:
        raise ApiError(400, "bad_request", f"a batch holds 1..{MAX_BATCH} messages, not {n}")
    out, at = [], 4
    for _ in range(n):
        if at + 4 > len(view):
            raise ApiError(400, "bad_request", "a message length runs past the body")
        (ln,) = _LEN.unpack_from(view, at)
        if at + 4 + ln > len(view):
            raise ApiError(400, "bad_request", "a message runs past the body")
        out.append(view[at + 4 : at + 4 + ln])
        at += 4 + ln
    if at != len(view):
        raise ApiError(400, "bad_request", "bytes after the last message")
    return out


MAX_BATCH = 256  # messages per batch request
APPEND, APPEND_MANY = "/v1/internal/repl/append", "/v1/internal/repl/append_many"


class HttpTransport(Transport):
    """A leader's appends to its followers — one stream per follower node (RFC 0011, step 2):
    a websocket (:mod:`node.cluster.stream`) carrying frames of ``append_many`` bodies, up to
    ``IN_FLIGHT`` unanswered. The appends of every partition this node leads for that follower
    that arrive while every slot is taken leave together in the next frame, and each caller gets
    its own message's answer. A follower without the stream endpoint (an older version) gets
    HTTP requests instead — ``append_many``, one in flight, or one ``append`` per message if it
    lacks that too. The protocol stays per partition (each link keeps one message in flight);
    a follower runs a frame's partitions concurrently, so their groups share its device flushes."""

    def __init__(self, cluster: Cluster, timeout_s: float, streams: bool = True) -> None:
        self.cluster, self.timeout_s = cluster, timeout_s
        self._queued: dict[str, list[tuple[bytes, asyncio.Future[dict[str, Any]]]]] = {}
        self._sending: set[str] = set()
        self._streams: dict[str, Stream] = {}
        self.streams = streams  # False: HTTP requests only (the tests of that path)
        self._http_only: set[str] = set()  # nodes without the stream endpoint (an older version)
        self._single_only: set[str] = set()  # nodes without append_many (an older version)
        self.requests = self.messages = 0  # append requests (or frames) sent, and the messages they carried

    async def append(self, node: str, header: dict[str, Any], data: list[bytes]) -> dict[str, Any]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(node, []).append((encode(header, data), fut))
        if node not in self._sending:
            self._sending.add(node)
            asyncio.ensure_future(self._stream(node))
        try:
            return _answer(node, await asyncio.wait_for(fut, self.timeout_s))
        except asyncio.TimeoutError:
            s = self._streams.pop(node, None)  # not answered in time: the next message opens a new stream
            if s is not None:
                s.close(StreamClosed(f"node {node} stopped answering on the replication stream"))
            raise

    async def _stream(self, node: str) -> None:
        """Send what is queued for ``node`` until nothing is (a frame at a time; each waits for
        a free slot of the stream, or for the HTTP request before it)."""
        try:
            while True:
                queue = self._queued.get(node, [])
                batch = [(b, f) for b, f in queue[:MAX_BATCH] if not f.done()]  # a caller gave up: skip
                self._queued[node] = queue[MAX_BATCH:]
                if not batch:
                    if not self._queued[node]:
                        return
                    continue
                await self._send(node, batch)
        finally:
            self._sending.discard(node)

    async def _send(self, node: str, batch: list[tuple[bytes, asyncio.Future[dict[str, Any]]]]) -> None:
        try:
            stream = await self._open(node)
            if stream is not None:
                await self.cluster.fault(node)
                await stream.send(encode_many([b for b, _ in batch]), [f for _, f in batch])
                self.requests += 1
                self.messages += len(batch)
            else:
                await self._send_http(node, batch)
        except Exception as e:  # noqa: BLE001 - the request failed: every message in it did
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)

    async def _open(self, node: str) -> Stream | None:
        """The open stream to ``node`` (opened now if none is), or None: HTTP requests to it."""
        if not self.streams or node in self._http_only:
            return None
        s = self._streams.get(node)
        if s is not None and not s.closed:
            return s
        try:
            ws = await self.cluster.open_stream(node, STREAM, MAX_FRAME)
        except aiohttp.WSServerHandshakeError as e:
            if e.status not in (404, 405):
                raise ConnectionError(f"node {node} refused the replication stream: {e.status} {e.message}") from e
            self._http_only.add(node)  # a follower of an older version
            return None
        self._streams[node] = s = Stream(node, ws)
        return s

    async def _send_http(self, node: str, batch: list[tuple[bytes, asyncio.Future[dict[str, Any]]]]) -> None:
        if len(batch) == 1 or node in self._single_only:
            for body, fut in batch:
                status, headers, payload = await self._call(node, APPEND, body)
                if not fut.done():
                    fut.set_result(_single(status, headers, payload))
            return
        status, headers, payload = await self._call(node, APPEND_MANY, encode_many([b for b, _ in batch]))
        if status in (404, 405):  # a follower of an older version: one message per request
            self._single_only.add(node)
            await self._send_http(node, batch)
            return
        if status != 200:
            raise ConnectionError(f"node {node} answered {status} to a batch of appends: {payload[:200]!r}")
        for (_, fut), a in zip(batch, batch_answers(node, payload, len(batch))):
            if not fut.done():
                fut.set_result(a)

    async def _call(self, node: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.requests += 1
        self.messages += _LEN.unpack_from(body)[0] if path == APPEND_MANY else 1
        return await asyncio.wait_for(self.cluster.call(node, "POST", path, body=body, headers={
            "Content-Type": "application/octet-stream"}), self.timeout_s)


MAX_FRAME = 1 << 30  # the largest frame a stream carries (a node's max_body bounds what it accepts)


def _single(status: int, headers: dict[str, str], payload: bytes) -> dict[str, Any]:
    """A single ``append``'s HTTP answer in the form of one answer of a batch."""
    try:
        body = json.loads(payload)
    except ValueError:
        body = {"raw": payload[:200].decode(errors="replace")}
    return {"status": status, "body": body, "promised": int(headers.get(PROMISED, "0") or 0)}


def _answer(node: str, a: dict[str, Any]) -> dict[str, Any]:
    """One append's answer: the follower's document, FencedError, or ConnectionError."""
    body = a.get("body")
    if a["status"] == 409 and isinstance(body, dict) and body.get("error", {}).get("code") == "fenced":
        raise FencedError(body["error"]["message"], int(a.get("promised") or 0))
    if a["status"] != 200 or not isinstance(body, dict):
        raise ConnectionError(f"node {node} answered {a['status']} to an append: {json.dumps(body)[:200]}")
    return body
