"""A subscription across nodes (docs/rfcs/0015-subscriptions.md §8): one share per node leading
some of the table's partitions — this node's own subscription, or a WebSocket to the other
node's ``/v1/internal/subscribe`` — all from one ``from``, merged: change frames pass on as
they arrive (each share's in its own commit order), and ``{"closed": T}`` goes out once T is
the smallest closed timestamp every share has reported — at or below it every share has sent
every change. When a share ends (its leader changed, its node stopped, a share fell behind)
the merged subscription ends too, with a code its subscriber resumes from (``moved``): the
client's resume from its last closed T is the one recovery path, never a splice of streams."""
from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp

from node.cluster.members import Cluster
from node.http.answers import json_text
from node.http.frames import Frame, FrameStream
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
    """Shares merged into one stream of frames (``FrameStream``)."""

    def __init__(self, shares: list[FrameStream | RemoteShare]):
        self.shares = shares
        self.ended: SubscriptionEndedError | None = None
        self._queue: asyncio.Queue[tuple[int, Frame] | None] = asyncio.Queue(MERGE_FRAMES)
        self._closed = [0] * len(shares)
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
        while True:
            got = await self._queue.get()
            if got is None:
                assert self.ended is not None  # the sentinel follows an end
                raise self.ended
            i, f = got
            if f.closed is None:
                return f
            self._closed[i] = f.closed
            low = min(self._closed)
            if low > self._sent:
                self._sent = low
                return Frame(json_text({"closed": low}), "closed", 0, low)

    def end(self, code: str, message: str, drop: bool = True) -> None:
        """No more frames: what waits is dropped (its subscriber resumes from a closed T)."""
        if self.ended is not None:
            return
        self.ended = SubscriptionEndedError(code, message)
        self._over.set()
        for t in self._pulls:
            if t is not asyncio.current_task():
                t.cancel()
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
