"""Hybrid logical clock for commit timestamps (docs/rfcs/0003-time-travel.md).

``ts = physical_ms << 16 | logical``: strictly increasing per node, close to
wall-clock time, and monotonic across restarts and clock steps because the
node persists a reserved high-water mark in the catalog *before* it issues
timestamps under it, and starts above the mark after a restart.
"""
from __future__ import annotations

import asyncio
import struct
import time
from typing import Callable

from catalog.abc import Catalog, Check, Put
from rowstore.errors import RowstoreError
from terrafs.catalog_ops import commit

LOGICAL_BITS = 16
RESERVE_MS = 1000  # how far ahead of the clock the persisted mark runs
MAX_TS = 2**63 - 1


def ts_from_ms(ms: int) -> int:
    return ms << LOGICAL_BITS


def ms_of(ts: int) -> int:
    return ts >> LOGICAL_BITS


class HybridClock:
    def __init__(self, catalog: Catalog, node_id: str, now_ms: Callable[[], int] | None = None):
        self.catalog, self.key = catalog, f"node/{node_id}/hlc"
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._last = 0
        self._reserved = 0  # timestamps below this are covered by the persisted mark
        self._version = 0  # catalog version of the mark this clock last wrote
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Start strictly above anything a previous incarnation could have issued."""
        e = await self.catalog.get(self.key)
        if e is not None:
            (mark,) = struct.unpack("<Q", e.value)
            self._last, self._version = mark, e.version
        await self._reserve(ts_from_ms(self._now_ms()))

    async def _reserve(self, ts: int) -> None:
        mark = max(ts, self._last) + ts_from_ms(RESERVE_MS)
        # Checked against the version this clock last wrote: a second process with the
        # same node id would make timestamps collide, so it is refused, not overwritten.
        res = await commit(self.catalog, [Check(self.key, self._version)],
                           [Put(self.key, struct.pack("<Q", mark))])
        if not res.committed:
            raise RowstoreError(f"{self.key} changed under this node: is another node using its id?")
        self._reserved, self._version = mark, res.revision

    async def now(self) -> int:
        """A new timestamp, larger than every one issued before (also across restarts)."""
        ts = max(ts_from_ms(self._now_ms()), self._last + 1)
        if ts >= self._reserved:
            async with self._lock:
                if ts >= self._reserved:
                    await self._reserve(ts)
        ts = max(ts, self._last + 1)
        if ts > MAX_TS:
            raise RowstoreError("commit timestamp space exhausted")
        self._last = ts
        return ts

    def present(self) -> int:
        """The largest timestamp this clock could hand out as a read's T now (the closed
        timestamp of an idle node), without issuing one."""
        return max(self._last, ts_from_ms(self._now_ms()))

    def now_ms(self) -> int:
        """The physical clock, in ms."""
        return self._now_ms()

    def observe(self, ts: int) -> None:
        """HLC receive rule: a timestamp seen from elsewhere moves this clock forward."""
        if ts > self._last:
            self._last = ts

    async def observe_durably(self, ts: int) -> None:
        """``observe``, and the persisted mark moved past ``ts`` before returning (a timestamp
        chosen by another node and written here must stay below whatever this node issues
        after a restart)."""
        self.observe(ts)
        if ts >= self._reserved:
            async with self._lock:
                if ts >= self._reserved:
                    await self._reserve(ts)

    @property
    def last(self) -> int:
        return self._last
