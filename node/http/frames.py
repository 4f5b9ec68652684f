"""A subscription's items as JSON text frames (docs/rfcs/0015-subscriptions.md §1): a JSON
array of changes, ``{"closed": T}``; the stream a route serves is this node's subscription
(``LocalFrames``) or several nodes' shares merged (``node/http/merge.py``), both read the
same way (``FrameStream``)."""
from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from node.http.answers import json_text
from node.http.params import off_loop_if_big
from node.wire import table_to_rows
from rowstore.db.database import Database
from rowstore.db.read.subscribe import Changes, Item, Subscription
from rowstore.errors import SubscriptionEndedError

FRAME_CHANGES = 1000  # changes per text frame at most
FRAME_BYTES = 256 << 10  # and bytes: a frame fits the line and message limits of common clients


@dataclass(frozen=True)
class Frame:
    text: bytes  # the JSON text
    kind: str  # changes, closed
    changes: int = 0  # changes in it
    closed: int | None = None  # a closed frame's T


class FrameStream(Protocol):
    """What a route serves: frames until the end (``next`` then raises SubscriptionEndedError)."""

    async def next(self) -> Frame: ...

    def end(self, code: str, message: str, drop: bool = False) -> None: ...

    async def finished(self) -> SubscriptionEndedError: ...

    def close(self) -> None:
        """Release what it holds (the subscription, connections to other nodes)."""


class LocalFrames:
    """This node's subscription, as frames."""

    def __init__(self, db: Database, sub: Subscription):
        self.db, self.sub = db, sub
        self._ready: deque[Frame] = deque()

    async def next(self) -> Frame:
        while not self._ready:
            self._ready.extend(await frames(await self.sub.next(), self.sub))
        return self._ready.popleft()

    def end(self, code: str, message: str, drop: bool = False) -> None:
        self.sub.end(code, message, drop)

    async def finished(self) -> SubscriptionEndedError:
        return await self.sub.finished()

    def close(self) -> None:
        self.db.unsubscribe(self.sub)


async def frames(item: Item, sub: Subscription) -> list[Frame]:
    """An item's frames. Subscribers of a round that take the same rows and columns (every
    subscriber without a filter, say) share its frames: they are made once."""
    if not isinstance(item, Changes):
        return [Frame(json_text({"closed": item.ts}), "closed", 0, item.ts)]
    memo = item.round.memo
    key = ("frames", tuple(sub.filter.columns), item.idx.tobytes())
    made: asyncio.Future[list[Frame]] | None = memo.get(key)
    if made is None:
        made = memo[key] = asyncio.ensure_future(off_loop_if_big(
            item.nbytes, change_frames, item, sub.filter.columns, sub.schema.pk.names))
    return await asyncio.shield(made)


def change_frames(item: Changes, columns: list[str], keys: list[str]) -> list[Frame]:
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
    return fit_frames(changes)


def fit_frames(changes: list[dict[str, Any]]) -> list[Frame]:
    """``changes`` as frames of at most ``FRAME_CHANGES`` changes and ``FRAME_BYTES`` bytes."""
    out: list[Frame] = []
    for a in range(0, len(changes), FRAME_CHANGES):
        _fit(changes[a : a + FRAME_CHANGES], out)
    return out


def _fit(changes: list[dict[str, Any]], out: list[Frame]) -> None:
    """``changes`` as frames of at most ``FRAME_BYTES`` (halved until they fit; a change larger
    than that travels alone)."""
    text = json_text(changes)
    if len(text) <= FRAME_BYTES or len(changes) == 1:
        out.append(Frame(text, "changes", len(changes)))
        return
    half = len(changes) // 2
    _fit(changes[:half], out)
    _fit(changes[half:], out)
