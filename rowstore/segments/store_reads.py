"""Reads of the segment table's rows and segments, mixed into
:class:`rowstore.segments.store.SegmentStore`: a row or rows by rowid from an active file or an
offloaded object (from memory when its block or pages are cached), a segment's rows in order,
the opened objects kept per segid, and what queries skip segments and groups by."""
from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa

from catalog.abc import Entry
from rowstore.codec.rows import Decoded, decode_rows
from rowstore.errors import DanglingRowidError, RowstoreError, SegmentNotFoundError, UnavailableError
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.columnar import ColumnarSegment, SealedReader, open_segment
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.sealed import ClusterRange
from rowstore.segments.wal import CommittedBatch
from terrafs.errors import ClosedError, TerrafsError
from terrafs.fs import TerrascaleFS

T = TypeVar("T")


class SegmentReads:
    """Rows and segments read (state: the store's ``active``, ``_sealed``, ``_clusters``,
    ``schemas``, ``not_led``, ``fs``)."""

    # the store's state read and set here (rowstore.segments.store.SegmentStore)
    fs: TerrascaleFS
    schemas: Callable[[int], SchemaVersion] | None
    active: dict[int, ActiveSegment]
    _sealed: dict[int, SealedReader]
    _clusters: dict[int, ClusterRange | None]
    not_led: set[tuple[str, int]]

    if TYPE_CHECKING:  # the store's methods used here
        async def list(self, owner: str | None = None, table: str | None = None) -> builtins.list[SegmentRecord]: ...

        async def record(self, segid: int) -> tuple[SegmentRecord, Entry]: ...

    async def clusters(self, segids: Collection[int]) -> dict[int, ClusterRange | None]:
        """segid -> its cluster range (None: none), for query pruning; one catalog scan when a
        segid is new to this node (a segid's range never changes until it is deleted)."""
        if any(s not in self._clusters for s in segids):
            for r in await self.list():
                if r.state != SegState.ACTIVE:
                    self._clusters[r.segid] = tuple(r.cluster) if r.cluster else None
            for s in segids:
                self._clusters.setdefault(s, None)
        return self._clusters

    async def scan(self, segid: int, target: SchemaVersion,
                   schemas: Callable[[int], SchemaVersion] | None = None) -> AsyncIterator[Decoded]:
        """Every row of a segment in localid order, as decoded Arrow batches."""
        schemas = self._schemas(schemas)
        seg = self.active.get(segid)
        if seg is not None:
            try:
                group: list[CommittedBatch] = []  # small commits decoded together: one decode per ~_SCAN_ROWS
                async for b in seg.batches():
                    group.append(b)
                    if sum(len(x.starts) for x in group) >= _SCAN_ROWS:
                        yield _decoded(group, schemas, target, seg.where)
                        group = []
                if group:
                    yield _decoded(group, schemas, target, seg.where)
            except ClosedError as e:  # released meanwhile: its partition moved to another leader
                raise UnavailableError(f"segment {segid} is no longer open here (its partition moved); "
                                       "retry") from e
        else:
            async for d in (await self.sealed(segid)).scan(schemas, target):
                yield d

    def _schemas(self, given: Callable[[int], SchemaVersion] | None) -> Callable[[int], SchemaVersion]:
        """The lookup rows are decoded with: the caller's, else the store's own."""
        if given is None and self.schemas is None:
            raise RowstoreError("this segment store decodes rows with their table's schema lookup only; pass it")
        got = given or self.schemas
        assert got is not None  # (checked above)
        return got

    async def sealed(self, segid: int) -> SealedReader:
        s = self._sealed.get(segid)
        if s is None:
            rec, _ = await self.record(segid)
            if rec.state not in (SegState.OFFLOADED, SegState.RETIRED):  # retired: readable until deleted
                if (rec.table, rec.partition) in self.not_led:  # a read begun before it stopped leading
                    raise UnavailableError(f"partition {rec.partition} is no longer led by this node (its "
                                           f"{rec.state.value} segment {segid} was released during the read); retry")
                raise RowstoreError(f"segment {segid} is {rec.state.value}, not offloaded")
            s = self._sealed[segid] = await open_segment(await self.fs.open_sealed(rec.inode))
        return s

    async def columnar_segments(self, segids: Collection[int]) -> dict[int, ColumnarSegment]:
        """The offloaded columnar segments among ``segids``, opened (their metadata read once):
        what reads skip groups of rows with. Others (active, row-wise, gone) are left out."""
        out: dict[int, ColumnarSegment] = {}
        for s in segids:
            seg = self._sealed.get(s)
            if seg is None and s not in self.active:
                try:
                    seg = await self.sealed(s)
                except (RowstoreError, TerrafsError):
                    continue  # not offloaded (sealed on its way, retired and gone): nothing to skip with
            if isinstance(seg, ColumnarSegment):
                out[s] = seg
        return out

    def row_bytes_cached(self, rowid: int) -> tuple[bytes, str] | None:
        """``row_bytes`` without I/O: when the memory cache holds the row's block (and, for an
        offloaded segment, the tree pages on its path are parsed already); else None."""
        seg: ActiveSegment | SealedReader | None
        seg = self.active.get(rowid >> 32)
        rows = seg.durable_rows if seg is not None else 0
        if seg is None:
            seg = self._sealed.get(rowid >> 32)
            rows = seg.footer.rows if seg is not None else 0
        if seg is None or (rowid & 0xFFFFFFFF) >= rows:
            return None  # (a localid past the end: row_bytes reports it)
        if isinstance(seg, ColumnarSegment):
            raw = seg.row_bytes_cached(rowid & 0xFFFFFFFF)
        else:
            raw = seg.get_raw_cached(rowid & 0xFFFFFFFF)
        return None if raw is None else (raw, seg.where)

    def row_cached(self, rowid: int, target: SchemaVersion,
                   decode: Callable[[bytes, str], dict[str, Any]]) -> dict[str, Any] | None:
        """One row as a dict of ``target``'s columns without I/O (None: something must be read).
        Row bytes are decoded by ``decode`` (the point decoders); a columnar segment's row is
        taken from its decoded pages."""
        seg = self._sealed.get(rowid >> 32)
        if isinstance(seg, ColumnarSegment) and rowid >> 32 not in self.active:
            loc = rowid & 0xFFFFFFFF
            return seg.row_cached(loc, target) if loc < seg.footer.rows else None
        got = self.row_bytes_cached(rowid)
        return None if got is None else decode(*got)

    async def row(self, rowid: int, target: SchemaVersion, decode: Callable[[bytes, str], dict[str, Any]],
                  where: str = "") -> dict[str, Any]:
        """``row_cached``, reading what it needs; a rowid no segment holds is DanglingRowidError."""
        got = self.row_cached(rowid, target, decode)
        if got is not None:
            return got
        if rowid >> 32 not in self.active:
            try:
                seg = await self.sealed(rowid >> 32)
            except SegmentNotFoundError:
                seg = None  # row_bytes says so, naming where
            except RowstoreError:
                seg = None  # not offloaded (yet): an active segment's row, read below
            if isinstance(seg, ColumnarSegment):
                loc = rowid & 0xFFFFFFFF
                if loc >= seg.footer.rows:
                    raise DanglingRowidError(where or seg.where, rowid, f"the segment has {seg.footer.rows} rows")
                return await seg.row(loc, target)
        return decode(*await self.row_bytes(rowid, where))

    async def read_active(self, segid: int, read: Callable[[ActiveSegment], Awaitable[T]]) -> T | None:
        """``read(seg)`` of segment ``segid`` while it is active here; None when it is not, or
        when it stopped being active during the read (sealed, offloaded, or its partition
        released: the file closed or removed under the read) — the caller reads its sealed
        object then. Any other failure, or a storage failure of a segment still active, is
        raised: it is not a segment changing state."""
        seg = self.active.get(segid)
        if seg is None:
            return None
        try:
            return await read(seg)
        except (TerrafsError, OSError):
            if segid in self.active:
                raise
            return None

    async def row_bytes(self, rowid: int, where: str = "") -> tuple[bytes, str]:
        """One row's encoded bytes and where they came from (for a point read); a rowid no
        segment holds is DanglingRowidError naming ``where`` (the table and partition)."""
        segid, loc = rowid >> 32, rowid & 0xFFFFFFFF

        async def from_active(seg: ActiveSegment) -> tuple[bytes, str]:
            if loc >= seg.durable_rows:
                raise DanglingRowidError(where or seg.where, rowid, f"the active segment has {seg.durable_rows} rows")
            return await seg.get_raw(loc), seg.where

        got = await self.read_active(segid, from_active)
        if got is not None:
            return got
        try:
            sealed = await self.sealed(segid)
        except SegmentNotFoundError:
            raise DanglingRowidError(where or f"segment {segid}", rowid, "no such segment exists") from None
        if loc >= sealed.footer.rows:
            raise DanglingRowidError(where or sealed.where, rowid, f"the segment has {sealed.footer.rows} rows")
        if isinstance(sealed, ColumnarSegment):
            return await sealed.row_bytes(loc), sealed.where
        return await sealed.get_raw(loc), sealed.where

    async def get(self, ids: np.ndarray, target: SchemaVersion,
                  schemas: Callable[[int], SchemaVersion] | None = None) -> Decoded:
        """Rows by rowid (all in one segment), from its active file or its object."""
        schemas = self._schemas(schemas)
        segs, locs = split_rowids(np.atleast_1d(ids))
        if len(set(segs.tolist())) != 1:
            raise RowstoreError("get() takes rowids of one segment")
        segid = int(segs[0])
        seg = self.active.get(segid)
        if seg is not None:
            return await seg.get(locs, schemas, target)
        sealed = await self.sealed(segid)
        if isinstance(sealed, ColumnarSegment):  # rows in the order asked
            order = np.argsort(locs, kind="stable")
            d = await sealed.take(locs[order].astype(np.int64), target)
            back = np.empty_like(order)
            back[order] = np.arange(len(order))
            return Decoded(d.batch.take(pa.array(back)), d.commit_ts[back], d.deleted[back], d.schema_ver[back])
        return await sealed.get(locs, schemas, target)


_SCAN_ROWS = 8192  # rows of an active segment's commits decoded at once by a scan


def _decoded(group: list[CommittedBatch], schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
             where: str) -> Decoded:
    """Consecutive committed batches' rows decoded in one call (a replay of many small commits
    pays the decoder's fixed cost once, not per commit)."""
    if len(group) == 1:
        return decode_rows(group[0].rows, group[0].starts, schemas, target, where)
    offs = np.cumsum([0] + [len(b.rows) for b in group[:-1]])
    return decode_rows(np.concatenate([b.rows for b in group]),
                       np.concatenate([b.starts + o for b, o in zip(group, offs)]), schemas, target, where)
