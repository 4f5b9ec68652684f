"""Commit timestamps in flight and the closed timestamp (docs/rfcs/0003-time-travel.md).

Every batch takes its timestamp through :meth:`Timeline.begin` and leaves with
:meth:`end` once it is applied or has failed. ``closed`` is the largest T such
that no batch with ts <= T can still become visible: just below the oldest batch
in flight, or the clock's last timestamp when none is. A batch is acknowledged
only after ``closed >= ts`` (:meth:`wait_closed`), so a read at ``closed`` sees
every acknowledged commit.

``floor`` is what no read of the present may go below although ``closed`` may: a batch
prepared here whose other shares may already be visible on other nodes (a reader that saw
them there must see this share too, once decided), and an election's floor (every T the
previous leader served reads at). A read of the present is at :attr:`present` and waits for
``closed`` to reach it (RFC 0010 §5, "Clocks"; simulation seed 860).
"""
from __future__ import annotations

import asyncio
import heapq

from rowstore.hlc import HybridClock, ts_from_ms


class Timeline:
    def __init__(self, clock: HybridClock):
        self.clock = clock
        self._heap: list[int] = []
        self._live: dict[int, int] = {}
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._n = 0
        self.floor = 0  # no read of the present below it (the module's docstring)

    async def begin(self) -> int:
        """A new commit timestamp, registered in flight (no await after the clock's)."""
        ts = await self.clock.now()
        self._live[ts] = self._live.get(ts, 0) + 1
        heapq.heappush(self._heap, ts)
        return ts

    async def begin_many(self, n: int) -> list[int]:
        """``n`` new commit timestamps, increasing: all of them in flight, or — when the clock
        fails midway (its mark not persisted: the catalog) — none. One left behind would hold
        ``closed`` below it for ever, and no commit here would be acknowledged again."""
        out: list[int] = []
        try:
            for _ in range(n):
                out.append(await self.begin())
        except BaseException:
            for ts in out:
                self.end(ts)
            raise
        return out

    def begin_above(self, floor: int) -> int:
        """A timestamp for a batch coordinated by another node (RFC 0010 §3): at least
        ``floor`` (the coordinator's clock), above everything this clock issued and above the
        closed timestamp, registered in flight. Synchronous, so nothing moves in between; the
        caller then makes the clock's persisted mark cover it (``clock.observe_durably``)."""
        ts = max(floor, self.clock.last + 1, self.closed + 1)
        self.clock.observe(ts)
        self._live[ts] = self._live.get(ts, 0) + 1
        heapq.heappush(self._heap, ts)
        return ts

    def move(self, old: int, new: int) -> None:
        """Replace in-flight ``old`` by ``new >= old`` (the batch's final timestamp: the largest
        any participant took). While ``old`` was in flight nothing at or above it closed."""
        if new < old:
            raise ValueError(f"a batch's timestamp moves up only ({old} -> {new})")
        self.clock.observe(new)
        self._live[new] = self._live.get(new, 0) + 1
        heapq.heappush(self._heap, new)
        self.end(old)

    def end(self, ts: int) -> None:
        left = self._live[ts] - 1
        if left:
            self._live[ts] = left
        else:
            del self._live[ts]
        while self._heap and self._heap[0] not in self._live:
            heapq.heappop(self._heap)
        self._release()

    @property
    def closed(self) -> int:
        """Just below the oldest batch in flight; with none, the present (an idle node's closed
        timestamp keeps up with the clock, so reads at it never fall behind the retention
        horizon): the clock observes it, so every later batch gets a larger timestamp."""
        if self._heap:
            return self._heap[0] - 1
        now = max(self.clock.last, ts_from_ms(self.clock.now_ms()) - 1)
        self.clock.observe(now)
        return now

    def hold(self, ts: int) -> None:
        """No read of the present at a T below ``ts`` from now on (the module's docstring)."""
        self.floor = max(self.floor, ts)

    @property
    def present(self) -> int:
        """The T of a read of the present: ``closed``, or ``floor`` when above it (then the read
        waits for ``closed`` to reach it)."""
        return max(self.closed, self.floor)

    @property
    def visible(self) -> int:
        """A read timestamp that sees every acknowledged commit, without reading the wall
        clock (a point read's fast path): just below the oldest batch in flight, or the last
        timestamp handed out — no commit can lie between it and ``closed``."""
        return self._heap[0] - 1 if self._heap else self.clock.last

    @property
    def in_flight(self) -> int:
        return sum(self._live.values())

    async def wait_closed(self, ts: int, timeout: float | None = None) -> bool:
        """Wait until every batch with a timestamp <= ts has been applied or has failed."""
        if self.closed >= ts:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._n += 1
        heapq.heappush(self._waiters, (ts, self._n, fut))
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
            return True
        except asyncio.TimeoutError:
            return self.closed >= ts

    def _release(self) -> None:
        c = self.closed
        while self._waiters and self._waiters[0][0] <= c:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)
