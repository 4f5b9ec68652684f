"""Device rounds: the write groups of every active file on one device, in one thread hop.

RFC 0011 step 3. With one ``fdatasync`` per device round (the log device), what a commit
touching three partitions still waited for was three thread hops, each encoding its group
in Python, writing it and waiting for the shared flush — and each hop's thread queued for
the GIL behind the event loop several times (at start, after the write, after the flush).
Here the groups that files hand over while a hop is in flight wait, and the next hop takes
them all: it encodes and writes each, then makes them durable with one device flush, and
the loop hears back once.

The rule that keeps a failed flush honest (fsyncgate, ``GroupCommit.flush`` in
terrafs/backends/logdev_commit.py) is the device's: a flush that fails fails every group of
the hop, since it covered all of them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

from terrafs.iopool import run_io

T = TypeVar("T")


class DeviceRounds:
    """Runs ``work`` callables in batches: one I/O-thread hop per batch, one flush after.

    ``flush()`` (called in that thread) must make durable every write the batch's callables
    made; it raises if the device failed to. One hop is in flight at a time; callables
    handed over meanwhile go in the next, so a busy device makes larger, fewer rounds.
    """

    def __init__(self, flush: Callable[[], None]):
        self._flush = flush
        self._waiting: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._hop: asyncio.Task[None] | None = None
        self.hops = 0  # rounds run (the metrics' and tests' view of the batching)
        self.works = 0  # callables run

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in the next round; its result once the round's flush covered it."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append((work, fut))
        if self._hop is None or self._hop.done():
            self._hop = asyncio.ensure_future(self._hops())
        return await fut

    async def _hops(self) -> None:
        await asyncio.sleep(0)  # the other files of this tick's commit hand theirs over too
        while self._waiting:
            batch, self._waiting = self._waiting, []
            try:
                answers = await run_io(self._round, [w for w, _ in batch])
            except BaseException as e:  # noqa: BLE001 - cancelled or the pool is gone: every waiter hears it
                answers = [(False, e)] * len(batch)
            for (_, fut), (ok, value) in zip(batch, answers):
                if fut.done():
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)

    def _round(self, works: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """I/O thread: every callable, then one flush covering each that succeeded."""
        answers: list[tuple[bool, Any]] = []
        for w in works:
            try:
                answers.append((True, w()))
            except Exception as e:  # noqa: BLE001 - that group fails alone; its file hears why
                answers.append((False, e))
        self.hops += 1
        self.works += len(works)
        if any(ok for ok, _ in answers):
            try:
                self._flush()
            except Exception as e:  # noqa: BLE001 - the flush covered every write of the round
                answers = [(False, e) if ok else (ok, v) for ok, v in answers]
        return answers
