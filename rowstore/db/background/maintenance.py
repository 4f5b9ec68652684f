"""Background work on a node's tables: checkpoint key memtables over the budget, merge
index runs, seal and offload segments. The node's jobs (``node/daemon/jobs.py``) run them on
schedules — the checkpoint also as soon as the memtables pass their budget — and the admin
API on demand."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from rowstore.db.partition import Partition
from rowstore.db.read.leaderless import advance_from
from rowstore.errors import UnavailableError
from rowstore.segments.records import SegmentRecord
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog
from rowstore.timeline import Timeline
from rowstore.db.registry import TableRegistry

log = logging.getLogger("rowstore.database")
WATERMARK_EVERY_S = 10.0
STALL = 4  # memtables at this many times their budget: writes wait for a checkpoint


class Maintenance:
    def __init__(self, store: SegmentStore, definitions: TableCatalog, tables: TableRegistry, timeline: Timeline,
                 memtable_budget: int, horizon: Callable[[], int], monotonic: Callable[[], float] = time.monotonic):
        """``horizon()``: what merges may purge below; ``monotonic``: the time idle partitions'
        watermarks are paced by (a simulation runs it on virtual time)."""
        self.store, self.definitions, self.tables, self.timeline = store, definitions, tables, timeline
        self.memtable_budget, self.horizon, self.monotonic = memtable_budget, horizon, monotonic
        self._marked: dict[tuple[str, int], float] = {}  # (table id, pid) -> when its watermark last moved
        self._checkpointing = asyncio.Lock()  # one checkpoint round at a time: the jobs' or a stalled write's
        self.stalls = 0  # writes that waited for a checkpoint

    def memtable_bytes(self) -> int:
        return sum(p.mem_bytes for p in self.tables.partitions())

    async def room(self) -> None:
        """Wait, before a write, while the memtables hold ``STALL`` times their budget: a
        sustained ingest outruns the scheduled checkpoints (at 190k rows/s, 1.8 GB of memtables
        after 28M rows against a budget of 64 MiB), so the write checkpoints the largest itself —
        one writer at a time, the others wait for it — and goes on once they are under.
        Returns at once (no await) under the limit. A checkpoint that frees nothing (its
        object store failing) ends the wait with its error: the write is refused, not queued."""
        while self.memtable_bytes() > STALL * self.memtable_budget:
            async with self._checkpointing:
                before = self.memtable_bytes()
                if before <= STALL * self.memtable_budget:
                    return
                self.stalls += 1
                t0 = time.monotonic()
                await self._checkpoint(force=False)
                after = self.memtable_bytes()
                log.info("event=write_stall memtable_bytes=%d after=%d budget=%d seconds=%.3f", before, after,
                         self.memtable_budget, time.monotonic() - t0)
                if after >= before:
                    raise UnavailableError(f"memtables hold {before} bytes (budget {self.memtable_budget}) "
                                           "and a checkpoint freed none: writes wait for checkpoints")

    async def maintain(self) -> dict[str, Any]:
        """One round of background work: checkpoint the largest memtables while over the
        budget, run the merges the policy wants, offload sealed segments."""
        out = await self.checkpoint(force=False)
        out.update(await self.offload())
        closed = self.timeline.closed
        out["progress"] = sum([await p.progress(closed) for p in self.tables.partitions()])
        return out

    async def checkpoint(self, force: bool = True) -> dict[str, Any]:
        """Checkpoint memtables: all of them, or (``force=False``) the largest until the
        budget is met. Then run any merge the policy wants."""
        async with self._checkpointing:
            done = await self._checkpoint(force)
        merged = 0
        for p in self.tables.partitions():
            merged += await p.merge(self.horizon())
        return {"checkpointed": done, "merged": merged}

    async def _checkpoint(self, force: bool) -> int:
        """Every partition's memtables (``force``), or the largest until the budget is met —
        of the partitions whose manifest nothing holds, when they free any: a GC pass holds
        its partition's manifest while it relocates, and that memtable, which no checkpoint can
        take meanwhile, grows to be the largest (a stalled write chose it and waited: 37–83 s
        stalls at 50M rows, when a merge held the manifest for its whole run too)."""
        parts = self.tables.partitions()
        if not force:
            free = [p for p in parts if not p.busy and p.mem_bytes]
            parts = self._largest(free or parts)
        return len([p for p in parts if await p.checkpoint()])

    def _largest(self, parts: list[Partition]) -> list[Partition]:
        """The largest memtables of ``parts`` that bring the node's total to the budget."""
        total, chosen = self.memtable_bytes(), []
        for p in sorted(parts, key=lambda p: p.mem_bytes, reverse=True):
            if total <= self.memtable_budget:
                break
            chosen.append(p)
            total -= p.mem_bytes
        return chosen

    async def seal(self) -> dict[str, Any]:
        sealed = [s for p in self.tables.partitions() if (s := await p.roll()) is not None]
        return {"sealed": sealed}

    async def offload(self) -> dict[str, Any]:
        done, touched = [], set()
        for segid in await self.store.pending_offload():
            rec, _ = await self.store.record(segid)
            d = self.tables.definition(rec.table)
            if d is None:
                continue  # a table this node has not opened (it will be, at the next start)
            assert d.schema is not None  # the registry keeps each table's newest definition with a schema
            try:
                await self.store.offload(segid, d.schema, await self.tables.schemas_of(d))
            except UnavailableError as e:  # its partition moved on the way: the new leader offloads it
                log.info("event=offload_skipped segment=%d reason=%r", segid, e)
                continue
            done.append(segid)
            touched.add((rec.table, rec.partition))
        await self.mark(self._idle() | touched)
        return {"offloaded": done}

    def _idle(self) -> set[tuple[str, int]]:
        """Partitions led here whose rows are all in objects (none in an active segment) and
        whose watermark has not moved for ``WATERMARK_EVERY_S``: it follows the closed timestamp
        (one catalog write each), so an idle partition stays readable without its leader up to
        a recent time."""
        now = self.monotonic()
        due = set()
        for p in self.tables.partitions():
            k = (p.table_id, p.pid)
            seg = self.store.current_or_none(p.table_id, p.pid)
            if seg is not None and seg.durable_rows:
                continue  # an active segment with rows: the offload after its seal moves the watermark
            if k not in self._marked or now - self._marked[k] >= WATERMARK_EVERY_S:
                due.add(k)
        return due

    async def mark(self, due: set[tuple[str, int]]) -> None:
        """Move the watermarks of ``due`` (what any node may read without the partition's
        leader, RFC 0010 §6): one closed timestamp, then one listing of the segment rows."""
        if not due:
            return
        now = self.monotonic()
        closed = self.timeline.closed  # before the listing (offloaded_reads.advance_from)
        listed = await self.store.list()
        for k in sorted(due):
            self._marked[k] = now
            try:
                await advance_from(self.store, closed, listed, *k)
            except Exception as e:  # noqa: BLE001 - the offload stands; the next round tries again
                log.warning("event=watermark_failed table=%s partition=%d error=%r", k[0], k[1], e)

    async def segment_records(self, table: str | None = None) -> list[tuple[str, SegmentRecord]]:
        """(table name, record as this node sees it now) for every segment, or one table's."""
        recs = await self.store.list()
        if table is not None:
            d = await self.definitions.describe(table)
            recs = [r for r in recs if r.table == d.table_id]
        names = self.tables.names()
        return [(names.get(r.table, r.table), self.store.live(r)) for r in recs]
