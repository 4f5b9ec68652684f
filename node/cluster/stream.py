"""The leader's end of a replication stream (RFC 0011, step 2; docs/format/replication.md): one
websocket per follower node, opened once, carrying frames of ``append_many`` bodies, several
frames in flight, each answered by its id. The follower's end is
:mod:`node.http.routes.replication` (``stream``). No HTTP request is made per frame: an HTTP
round trip between two nodes cost ~220 µs of two event loops here, a frame on an open
websocket ~90 µs."""
from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Iterable
from typing import Any

import aiohttp
from node.errors import NodeError

log = logging.getLogger("terrascale.node")

FRAME_ID = struct.Struct("<Q")
STREAM = "/v1/internal/repl/stream"
IN_FLIGHT = 4  # frames sent and not yet answered, per follower node


_CLOSING: set[asyncio.Task[bool]] = set()


class StreamClosed(NodeError, ConnectionError):
    """The stream to a follower closed (or never opened): every frame in flight on it failed."""


class Stream:
    """One open websocket to ``node``. ``send`` takes a slot (at most ``IN_FLIGHT`` frames
    unanswered), sends the frame and returns; the reader hands each answer, in whatever order
    the follower sends them, to the futures of its frame. Deadlines are the callers': a message
    not answered in time makes the transport close the stream (a peer that stopped answering
    is not trusted with the next frame: the next one opens a new stream)."""

    def __init__(self, node: str, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.node, self.ws = node, ws
        self.slots = asyncio.Semaphore(IN_FLIGHT)
        self.pending: dict[int, list[asyncio.Future[dict[str, Any]]]] = {}
        self.next_id = 0
        self.closed = False
        self.reader = asyncio.ensure_future(self._read())

    async def send(self, body: bytes, futs: list[asyncio.Future[dict[str, Any]]]) -> None:
        """Send one frame (an ``append_many`` body) whose answers go to ``futs``, in order."""
        await self.slots.acquire()
        if self.closed:
            self.slots.release()
            raise StreamClosed(f"the replication stream to node {self.node} closed")
        fid, self.next_id = self.next_id, self.next_id + 1
        self.pending[fid] = futs
        try:
            await self.ws.send_bytes(FRAME_ID.pack(fid) + body)
        except Exception as e:  # noqa: BLE001 - a broken stream: its frames failed
            self.close(StreamClosed(f"node {self.node} does not answer: {e!r}"[:300]))

    async def _read(self) -> None:
        err: Exception = StreamClosed(f"node {self.node} closed the replication stream")
        try:
            async for msg in self.ws:
                if msg.type != aiohttp.WSMsgType.BINARY or len(msg.data) < FRAME_ID.size:
                    err = StreamClosed(f"node {self.node} sent a {msg.type.name} message on the replication stream")
                    break
                (fid,) = FRAME_ID.unpack_from(msg.data)
                self._answer(fid, msg.data[FRAME_ID.size:])
        except Exception as e:  # noqa: BLE001 - the stream broke: everything in flight failed
            err = StreamClosed(f"node {self.node}'s replication stream broke: {e!r}"[:300])
        self.close(err)

    def _answer(self, fid: int, payload: bytes) -> None:
        got = self._finish(fid)
        if got is None:
            return  # not a frame in flight (the stream closed meanwhile)
        try:
            answers = batch_answers(self.node, payload, len(got))
        except ConnectionError as e:
            _fail(got, e)
            return
        for f, a in zip(got, answers):
            if not f.done():
                f.set_result(a)

    def _finish(self, fid: int) -> list[asyncio.Future[dict[str, Any]]] | None:
        futs = self.pending.pop(fid, None)
        if futs is not None:
            self.slots.release()
        return futs

    def close(self, err: Exception) -> None:
        """Fail every frame in flight with ``err`` and close the websocket (idempotent)."""
        if not self.closed:
            self.closed = True
            t = asyncio.ensure_future(self.ws.close())
            _CLOSING.add(t)  # held until done: the loop keeps only a weak reference to a task
            t.add_done_callback(_CLOSING.discard)
        for fid in list(self.pending):
            _fail(self._finish(fid) or (), err)


def _fail(futs: Iterable[asyncio.Future[dict[str, Any]]], err: Exception) -> None:
    for f in futs:
        if not f.done():
            f.set_exception(err)


def batch_answers(node: str, payload: bytes, n: int) -> list[dict[str, Any]]:
    """The per-message answers of a frame or an ``append_many`` request, or ConnectionError."""
    try:
        doc = json.loads(payload)
    except ValueError:
        doc = {}
    answers = doc.get("answers") if isinstance(doc, dict) else None
    if not isinstance(answers, list) or len(answers) != n or \
            not all(isinstance(a, dict) and isinstance(a.get("status"), int) for a in answers):
        raise ConnectionError(f"node {node} refused a batch of appends: {payload[:200]!r}")
    return answers
