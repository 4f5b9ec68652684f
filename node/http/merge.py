"""A subscription across nodes (docs/rfcs/0015-subscriptions.md §8): one share per node leading
some of the table's partitions — this node's own subscription, or a WebSocket to the other
node's ``/v1/internal/subscribe`` — all from one ``from``, merged so that the merged stream is
ordered as one node's is (§5): the changes between ``closed M`` and the next ``closed M'``
lie in ``(M, M']``. A share's change frame holds changes up to that share's next closed
timestamp, which another share may not have reached yet; so the merge holds every change
until every share has closed at or past its ``commit_ts``, then sends what that releases
(each share's changes in the order it sent them) and ``closed M``, M the smallest closed
timestamp of the shares. When a share ends (its leader changed, its node stopped, a share
fell behind) the merged subscription ends too, with a code its subscriber resumes from
(``moved``): the client's resume from its last closed T is the one recovery path, never a
splice of streams."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

import aiohttp
import orjson

from node.cluster.members import Cluster
from node.http.answers import json_text
from node.http.frames import Frame, FrameStream, fit_frames
from rowstore.errors import SubscriptionEndedError

MERGE_FRAMES = 16  # frames waiting between the shares and the subscriber; beyond, shares wait (and fall behind)
_PASSED_ON = frozenset({"slow_subscriber", "schema_changed", "table_dropped", "stopping"})


class RemoteShare:
    """Another node's share, read from its internal subscription's WebSocket."""

    def __init__(self, node: str, ws: aiohttp.ClientWebSocketResponse):
        self.node, self.ws = node, ws

    @classmethod
    async def open(cls, cluster: Cluster, node: str, path: str) -> RemoteShare:
        return cls(node, await cluster.open_stream(node, path, 1 << 26))

    async def next(self) -> Frame:
        msg = await self.ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"node {self.node} ended its share of the subscription ({msg.type.name})")
        text = msg.data.encode()
        if text.startswith(b"["):
            return Frame(text, "changes", text.count(b'"commit_ts"'))
        doc = json.loads(text)
        if "closed" in doc:
            return Frame(text, "closed", 0, int(doc["closed"]))
        err = doc["error"]
        raise SubscriptionEndedError(err["code"], f"node {self.node}: {err['message']}")

    def close(self) -> None:
        asyncio.ensure_future(self.ws.close())


class MergedFrames:
    """Shares merged into one stream of frames (``FrameStream``); ``limit`` bounds the bytes of
    changes held for shares ahead of the slowest (beyond it the subscription ends, ``unavailable``,
    and its subscriber resumes)."""

    def __init__(self, shares: list[FrameStream | RemoteShare], limit: int = 16 << 20):
        self.shares, self.limit = shares, limit
        self.ended: SubscriptionEndedError | None = None
        self._queue: asyncio.Queue[tuple[int, Frame] | None] = asyncio.Queue(MERGE_FRAMES)
        self._closed = [0] * len(shares)
        self._held: list[list[tuple[int, int, Any]]] = [[] for _ in shares]  # (commit_ts, bytes, change)
        self._held_bytes = 0
        self._out: deque[Frame] = deque()
        self._sent = 0
        self._over = asyncio.Event()
        self._pulls = [asyncio.ensure_future(self._pull(i, s)) for i, s in enumerate(shares)]

    async def _pull(self, i: int, share: FrameStream | RemoteShare) -> None:
        try:
            while True:
                await self._queue.put((i, await share.next()))
        except SubscriptionEndedError as e:
            self.end(e.code if e.code in _PASSED_ON else "moved", f"{e}; resume from the last closed timestamp")
        except (ConnectionError, OSError, aiohttp.ClientError, asyncio.TimeoutError) as e:
            self.end("moved", f"a node serving the table's partitions stopped answering ({e}); resume from the "
                              "last closed timestamp")

    async def next(self) -> Frame:
        while not self._out:
            got = await self._queue.get()
            if got is None:
                assert self.ended is not None  # the sentinel follows an end
                raise self.ended
            self._take(*got)
        return self._out.popleft()

    def _take(self, i: int, f: Frame) -> None:
        """One share's frame: its changes held; on a closed frame, what every share has now
        closed past goes out, then ``closed``."""
        if f.closed is None:
            changes = orjson.loads(f.text)
            each = len(f.text) // max(1, len(changes))
            self._held[i].extend((c["commit_ts"], each, c) for c in changes)
            self._held_bytes += each * len(changes)
            if self._held_bytes > self.limit:
                self.end("unavailable", f"a node's share of the subscription ran more than {self.limit} bytes "
                                        "ahead of another's; resume from the last closed timestamp")
            return
        self._closed[i] = f.closed
        low = min(self._closed)
        if low <= self._sent:
            return
        out: list[Any] = []
        for j, held in enumerate(self._held):
            if held:
                out.extend(c for t, _, c in held if t <= low)
                self._held[j] = [h for h in held if h[0] > low]
                self._held_bytes -= sum(n for t, n, _ in held if t <= low)
        self._out.extend(fit_frames(out))
        self._sent = low
        self._out.append(Frame(json_text({"closed": low}), "closed", 0, low))

    def end(self, code: str, message: str, drop: bool = True) -> None:
        """No more frames: what waits is dropped (its subscriber resumes from a closed T)."""
        if self.ended is not None:
            return
        self.ended = SubscriptionEndedError(code, message)
        self._over.set()
        for t in self._pulls:
            if t is not asyncio.current_task():
                t.cancel()
        self._out.clear()
        with contextlib.suppress(asyncio.QueueEmpty):
            while True:
                self._queue.get_nowait()
        self._queue.put_nowait(None)

    async def finished(self) -> SubscriptionEndedError:
        await self._over.wait()
        assert self.ended is not None  # set before _over
        return self.ended

    def close(self) -> None:
        self.end("closed", "the subscription was closed")
        for s in self.shares:
            s.close()
