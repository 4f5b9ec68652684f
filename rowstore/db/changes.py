"""The commit tail: the committed batches of watched tables, held from the moment they are
applied until a subscription's pump takes them once the closed timestamp passes them
(docs/rfcs/0015-subscriptions.md §2).

A batch is held by reference to its encoded rows — the bytes its append wrote, each row's
header stamped with its own commit timestamp and deletion flag — never copied. A table
nobody watches costs one dictionary lookup per batch."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from rowstore.codec.rows import Encoded, EncodedParts


@dataclass(frozen=True)
class Committed:
    """One partition's share of one committed batch."""

    pid: int
    rows: Encoded | EncodedParts
    ts: int  # the largest commit timestamp among its rows


class CommitTail:
    def __init__(self) -> None:
        self._watchers: dict[str, int] = {}  # table id -> subscriptions watching it
        self._held: dict[str, list[Committed]] = {}
        self._arrived: dict[str, asyncio.Event] = {}

    def watch(self, table_id: str) -> None:
        """Hold the table's batches from now on (until as many ``unwatch``)."""
        self._watchers[table_id] = self._watchers.get(table_id, 0) + 1
        self._held.setdefault(table_id, [])
        self._arrived.setdefault(table_id, asyncio.Event())

    def unwatch(self, table_id: str) -> None:
        left = self._watchers[table_id] - 1
        if left:
            self._watchers[table_id] = left
            return
        del self._watchers[table_id], self._held[table_id], self._arrived[table_id]

    def watching(self, table_id: str) -> bool:
        """Whether a subscription holds the table's batches (a writer keeps their rows for it)."""
        return table_id in self._held

    def committed(self, table_id: str, pid: int, rows: Encoded | EncodedParts, ts: int) -> None:
        """A batch of the table was applied (it is durable and visible once ``ts`` closes).
        Called by every commit path right after ``Partition.apply``, before the batch's
        timestamp ends: so a closed timestamp C covers every batch held with ts <= C."""
        held = self._held.get(table_id)
        if held is not None:
            held.append(Committed(pid, rows, ts))
            self._arrived[table_id].set()

    def newest(self, table_id: str) -> int:
        """The largest timestamp among the table's held batches (0: none held)."""
        return max((c.ts for c in self._held.get(table_id, ())), default=0)

    def take(self, table_id: str, upto: int) -> list[Committed]:
        """The held batches at or below ``upto`` (a closed timestamp), in the order applied;
        they are no longer held."""
        held = self._held.get(table_id)
        if not held:
            return []
        out = [c for c in held if c.ts <= upto]
        if out:
            held[:] = [c for c in held if c.ts > upto]
        if not held:
            self._arrived[table_id].clear()
        return out

    async def arrival(self, table_id: str, timeout: float) -> None:
        """Until a batch of the table is held, or ``timeout`` seconds."""
        ev = self._arrived.get(table_id)
        if ev is None or ev.is_set():
            return
        try:
            await asyncio.wait_for(ev.wait(), timeout)
        except asyncio.TimeoutError:
            pass
