"""Moving a one-copy partition between nodes through the object store (RFC 0010 §7).

A partition with one replica has its write-ahead on its node's block device only, so it
cannot be shipped the way replicated partitions are (a newcomer would have to hold every
write before it counts, and the leaving node may no longer write the catalog once it left
the membership). Instead its node, while still a member, **releases** it: new writes are
refused (503, retried by the client), the ones in flight finish, its active segment is
sealed, every sealed segment is offloaded and the index checkpointed — after which every
row of the partition is in objects and index runs any node can read. The node layer then
moves the placement (one compare-and-set) and the new node **takes** the partition: it
opens the index from the checkpoint and replays whatever follows the mark (nothing, or
objects), with its clock above every commit of the partition.

A crash anywhere before the placement switch leaves the partition where it was (its
segments sealed or offloaded, which recovery handles as always); after it, on the new node.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
import time

from catalog.errors import CatalogError
from rowstore.db.read.leaderless import read_watermark
from rowstore.errors import RowstoreError, UnavailableError
from rowstore.schema import SchemaVersion
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableDef
from rowstore.index.key_manifest import Claim
from rowstore.db.partition import Partition
from rowstore.db.registry import TableRegistry

log = logging.getLogger("rowstore.db.handoff")


class Handoffs:
    def __init__(self, store: SegmentStore, tables: TableRegistry, *, observe: Callable[[int], None]):
        """``observe(ts)``: the clock's observe; a partition taken here commits above the log it
        took (invariant C of RFC 0010), so it has no default."""
        self.store, self.tables, self.observe = store, tables, observe
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    def _lock(self, table_id: str, pid: int) -> asyncio.Lock:
        return self._locks.setdefault((table_id, pid), asyncio.Lock())

    async def release(self, d: TableDef, pid: int) -> int:
        """Make partition ``pid`` of ``d`` whole in objects and stop writing it here; returns
        the newest commit timestamp it holds. The partition stays readable here until
        :meth:`switch`; on failure it takes writes again."""
        async with self._lock(d.table_id, pid):
            table = await self.tables.table(d)
            if pid not in table.owned or (d.table_id, pid) in self.store.shippers:
                raise UnavailableError(f"partition {pid} of {d.name!r} is not served here with one copy")
            part = table.parts[pid]
            t0 = time.perf_counter()
            part.retired = True  # every write from now on fails whole (503): the client retries elsewhere
            try:
                await part.drain()
                await self.store.roll(d.table_id, pid, empty=True)
                latest = await self.tables.latest_def(d)
                assert latest.schema is not None  # the newest definition with a schema
                schemas = await self.tables.schemas_of(latest)
                top = 0
                for rec in await part.segments():
                    if rec.state == SegState.ACTIVE:  # rolled, its seal still under way
                        if rec.owner != self.store.node or rec.segid not in self.store.active:
                            raise RowstoreError(f"segment {rec.segid} of {d.name}/{pid} is active on {rec.owner}")
                        rec = await self.store.seal(rec.segid)
                    if rec.state == SegState.SEALED:
                        rec = await self._offload(rec, latest.schema, schemas)
                    top = max(top, rec.max_ts or 0)
                await part.checkpoint()
            except BaseException:
                part.retired = False
                raise
            log.info("event=partition_released table=%s partition=%d max_ts=%d seconds=%.3f", d.name, pid, top,
                     time.perf_counter() - t0)
            return top

    async def _offload(self, rec: SegmentRecord, key_schema: SchemaVersion,
                       schemas: Callable[[int], SchemaVersion]) -> SegmentRecord:
        """Offload one sealed segment; the maintenance round may be offloading it at the same
        time (then one of the two fails its switch): wait for the other and go on."""
        for _ in range(50):
            try:
                return await self.store.offload(rec.segid, key_schema, schemas)
            except (RowstoreError, CatalogError, KeyError):
                rec, _ = await self.store.record(rec.segid)
                if rec.state == SegState.OFFLOADED:
                    return rec
                await asyncio.sleep(0.1)
        raise RowstoreError(f"segment {rec.segid} could not be offloaded")

    async def switch(self, d: TableDef, pid: int, switch: Callable[[], Awaitable[bool]]) -> bool:
        """After :meth:`release`: ``await switch()`` moves the placement (the node layer's
        compare-and-set); if it did, stop serving the partition here, else take writes again.
        Under the index's publish lock, so no checkpoint, merge or collection pass of this
        node publishes the partition's manifest once the new node may have read it."""
        async with self._lock(d.table_id, pid):
            table = await self.tables.table(d)
            if pid not in table.owned:
                return False
            part = table.parts[pid]
            failed: BaseException | None = None
            async with part.index.publish_lock:
                try:
                    moved = await switch()
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    # The compare-and-set may have committed: taking writes again could make
                    # two owners. Stop serving; the reconcile takes the partition back if the
                    # placement still names this node.
                    moved, failed = True, e
                if not moved:
                    part.retired = False
                    return False
                part.index.moved = True
                table.unserve(pid)
            for inode in self.store.release_local(d.table_id, pid):
                await self.store.fs.close_active(inode)
            if failed is not None:
                log.warning("event=handoff_outcome_unknown table=%s partition=%d error=%r", d.name, pid, failed)
                raise failed
            log.info("event=partition_handed_off table=%s partition=%d", d.name, pid)
            return True

    async def take(self, d: TableDef, pid: int, epoch: int) -> bool:
        """Serve partition ``pid`` of ``d``, which the placement now names this node for at
        ``epoch`` (its previous node released it). Whether it was taken now."""
        async with self._lock(d.table_id, pid):
            # commit above every commit the partition holds
            recs = [r for r in await self.store.list(table=d.table_id) if r.partition == pid]
            wm = await read_watermark(self.store.catalog, d.table_id, pid)
            self.observe(max([r.max_ts or 0 for r in recs] + [wm.ts if wm else 0]))
            table = await self.tables.table(d)  # a table opened now opens it with the others
            if pid in table.owned:
                return False
            part = Partition(self.store, d.table_id, pid, table.kind, table.indexed)
            latest = await self.tables.latest_def(d)
            assert latest.schema is not None  # the newest definition with a schema
            n = await part.open(await self.tables.schemas_of(latest), latest.schema, Claim(self.store.node, epoch))
            self.observe(part.newest_ts)
            table.serve(part, epoch)
            log.info("event=partition_taken table=%s partition=%d replayed=%d", d.name, pid, n)
            return True
