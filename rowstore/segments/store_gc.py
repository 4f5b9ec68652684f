"""The store's side of copy-forward garbage collection (RFC 0009), mixed into
:class:`rowstore.segments.store.SegmentStore`: a collector's copy written invisible (a pending
row) until its pass publishes it, the copies of a pass that crashed dropped, and the segments'
live counts lowered as index merges purge row versions."""
from __future__ import annotations

import builtins
import json
import logging
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from catalog.abc import Catalog, Check, Delete, Op, Put
from rowstore.errors import RowstoreError
from rowstore.rowids import split_rowids
from rowstore.segments.columnar_layout import BLOCK_SIZE
from rowstore.segments.records import PENDING_PREFIX, SEG_PREFIX, SegmentRecord, SegState
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError
from terrafs.fs import TerrascaleFS
from terrafs.ranges import RangeAllocator
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.segments.store")


class CopyForward:
    """The collector's copies and the live counts (state: the store's ``fs``, ``catalog``,
    ``node``, ``segids``)."""

    # the store's state read here (rowstore.segments.store.SegmentStore)
    fs: TerrascaleFS
    catalog: Catalog
    node: str
    segids: RangeAllocator

    async def create_copy(self, table: str, partition: int, content: Callable[[int], AsyncIterable[bytes]],
                          columnar: bool = False) -> SegmentRecord:
        """A garbage collector's copy (RFC 0009): the object, its file row, a reserved segid and
        a pending row ``gc/pending/<segid>`` in ONE transaction. The segment row is written
        only by the pass's publishing transaction (:meth:`published_ops`); until then the copy
        is invisible and recovery (:meth:`drop_pending`) deletes it."""
        for _ in range(100):
            segid, checks, ops = await self.segids.reserve()
            key = f"{PENDING_PREFIX}{segid:08x}"
            pend = {"segid": segid, "table": table, "partition": partition, "owner": self.node}

            def extra(f: FileRecord, key: str = key, pend: dict[str, Any] = pend, checks: Sequence[Check] = checks,
                      ops: Sequence[Op] = ops) -> tuple[builtins.list[Check], builtins.list[Op]]:
                return [*checks, Check(key, 0)], [*ops, Put(key, json.dumps(dict(pend, inode=f.inode)).encode())]

            try:
                f = await self.fs.create_sealed(content(segid), extra=extra,
                                                block_size=BLOCK_SIZE if columnar else None)
            except CatalogConflictError:
                continue  # another allocator took this segid range row first (the copy is rebuilt)
            return SegmentRecord(segid, table, partition, SegState.OFFLOADED, self.node, f.inode,
                                 bytes=f.size, live_bytes=f.size, location=f.location, format=2 if columnar else 1)
        raise RowstoreError("could not allocate a segment id for a copy")

    async def drop_pending(self) -> builtins.list[int]:
        """Delete this node's unpublished copies (a pass that crashed before publishing)."""
        gone: builtins.list[int] = []
        for e in await self.catalog.scan(PENDING_PREFIX):
            p = json.loads(e.value)
            if p["owner"] != self.node:
                continue
            try:  # the segid is not returned (docs/format/segment.md §6)
                await self.fs.delete(p["inode"], [Check(e.key, e.version)], [Delete(e.key)])
            except CatalogConflictError:
                continue
            gone.append(p["segid"])
            log.info("event=gc_pending_dropped segid=%d inode=%d", p["segid"], p["inode"])
        return gone

    async def superseded(self, rowids: np.ndarray) -> None:
        """Row versions an index merge purged: their segments' ``live_rows``/``live_bytes`` go
        down now (a garbage-collection pass recounts them all; a conflict is left to it)."""
        segs, _ = split_rowids(rowids)
        ids, counts = np.unique(segs, return_counts=True)
        for segid, n in zip(ids.tolist(), counts.tolist()):
            e = await self.catalog.get(f"{SEG_PREFIX}{segid:08x}")
            if e is None:
                continue
            rec = SegmentRecord.from_bytes(e.value)
            if rec.state not in (SegState.SEALED, SegState.OFFLOADED) or not rec.rows:
                continue  # an active segment's counts are set at seal; a retired one's are 0
            live = max(rec.live_rows - n, 0)
            upd = replace(rec, live_rows=live, live_bytes=rec.bytes * live // rec.rows)
            await commit(self.catalog, [Check(e.key, e.version)], [Put(e.key, upd.to_bytes())])
