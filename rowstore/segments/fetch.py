"""Fetching many rows by rowid, vectorized: one decode per segment, few reads.

Rows of one segment are located (active: the in-memory offset index; sealed: the
B+ tree, or for many rows its whole leaf level, cached), their bytes gathered from
the blocks they lie in (each block fetched once: ``terrafs.gather``), then decoded
in one call. When a query wants a large share of a
segment, a sequential scan with a localid mask is cheaper than locating rows. A columnar
segment (version 2) reads only the target's columns: the pages holding the rows, or
whole groups of rows when a large share of a group is wanted.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from rowstore.codec.rows import Decoded, decode_rows
from rowstore.errors import DanglingRowidError, RowstoreError, SegmentNotFoundError, UnavailableError
from rowstore.rowids import split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.segments.columnar import ColumnarSegment
from rowstore.segments.sealed import SealedSegment
from rowstore.segments.records import SegState
from rowstore.segments.store import SegmentStore
from terrafs.errors import ObjectNotFoundError

_SCAN_SHARE = 8  # scan the segment when more than 1/8 of its rows are wanted
_FEW = 16  # fewer rows than this from a sealed segment: walk the tree for each
_OFFSET_SEGMENTS = 64
_CONCAT_ON_LOOP = 1 << 16  # rows gathered into one batch on the event loop
_OFFSETS: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()  # (where, segid) -> row ends


async def fetch(store: SegmentStore, rowids: np.ndarray, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
                where: str = "") -> Decoded:
    """Rows for ``rowids`` (any order, no duplicates) decoded into ``target``, in rowid order.
    A rowid no segment has is corruption (DanglingRowidError, naming ``where``: the table and
    partition the rowids came from), never an IndexError or a bare "no segment"."""
    rowids = np.asarray(rowids, np.uint64)
    if len(rowids) > 1 and bool((rowids[1:] <= rowids[:-1]).any()):  # a scan's rowids are often sorted already
        rowids = np.sort(rowids)
    if len(rowids) == 0:
        return _empty(target)
    segs, locs = split_rowids(rowids)
    cuts = np.flatnonzero(np.diff(segs)) + 1
    parts = []
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(rowids)]):
        segid = int(segs[a])
        try:
            parts.append(await _segment_rows(store, segid, locs[a:b], schemas, target, where))
        except ObjectNotFoundError as e:
            raise await _collected_meanwhile(store, segid, e) from e
    return await _concat_big(parts, target)


async def _concat_big(parts: list[Decoded], target: SchemaVersion) -> Decoded:
    """``concat``, in a worker thread when it copies many rows (a scan's every row)."""
    if len(parts) > 1 and sum(p.batch.num_rows for p in parts) > _CONCAT_ON_LOOP:
        return await asyncio.to_thread(concat, parts, target)
    return concat(parts, target)


async def _collected_meanwhile(store: SegmentStore, segid: int, e: ObjectNotFoundError) -> Exception:
    """A segment's object gone mid-read: retryable when the collector retired or deleted the
    segment meanwhile (with ``gc.grace`` 0 s its object goes at once; the index names its copies
    now), corruption otherwise (its row still names the object)."""
    try:
        rec, _ = await store.record(segid)
    except SegmentNotFoundError:
        rec = None
    if rec is None or rec.state == SegState.RETIRED:
        return UnavailableError(f"segment {segid} was collected during the read; retry")
    return e


def _dangling(where: str, segid: int, loc: int, reason: str) -> DanglingRowidError:
    return DanglingRowidError(where or f"segment {segid}", (segid << 32) | loc, reason)


async def _segment_rows(store: SegmentStore, segid: int, locs: np.ndarray, schemas: Callable[[int], SchemaVersion],
                        target: SchemaVersion, where: str = "") -> Decoded:
    async def from_active(seg: ActiveSegment) -> Decoded:
        if len(locs) and int(locs.max()) >= seg.durable_rows:
            raise _dangling(where, segid, int(locs.max()), f"the active segment has {seg.durable_rows} rows")
        return await _from_active(seg, locs, schemas, target)

    got = await store.read_active(segid, from_active)
    if got is not None:
        return got
    try:
        sealed = await store.sealed(segid)
    except SegmentNotFoundError:
        raise _dangling(where, segid, int(locs[0]), "no such segment exists (deleted, or never written)") from None
    if int(locs.max()) >= sealed.footer.rows:
        raise _dangling(where, segid, int(locs.max()), f"the segment has {sealed.footer.rows} rows")
    if isinstance(sealed, ColumnarSegment):
        return await _from_columnar(sealed, locs.astype(np.int64), target)
    if len(locs) * _SCAN_SHARE > sealed.footer.rows:
        return await _by_scan(store, segid, locs, schemas, target)
    if len(locs) < _FEW:
        spans = [await sealed.locate(int(i)) for i in locs]
        offs = np.array([s for s, _ in spans], np.int64)
        lens = np.array([n for _, n in spans], np.int64)
    else:  # many rows: every offset from the leaf level at once (cached per segment)
        ends = await _row_ends(sealed)
        offs = ends[locs.astype(np.int64)]
        lens = ends[locs.astype(np.int64) + 1] - offs
    buf, starts = await sealed.sf.read_ranges(offs, lens)
    return decode_rows(buf, starts, schemas, target, sealed.where)


async def _from_columnar(seg: ColumnarSegment, locs: np.ndarray, target: SchemaVersion) -> Decoded:
    """Rows of a columnar segment: groups of which a large share is wanted are read whole
    (their chunks of the target's columns, sequentially, two groups in flight), the others'
    rows page by page in one read; a group wanted whole is taken as it is decoded."""
    gs = locs // seg.meta.group_rows  # sorted (as locs): each group's stretch found by its edges, not a sort
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    ids, counts = gs[starts], np.diff(np.r_[starts, len(gs)])
    lens = np.minimum(seg.meta.group_rows, seg.footer.rows - ids * seg.meta.group_rows)
    whole = counts * _SCAN_SHARE > lens
    if not whole.any():
        return await seg.take(locs, target)
    mask = np.zeros(seg.groups, bool)
    mask[ids[whole]] = True
    by_group: dict[int, Decoded] = {}
    async for g, d in seg.scan_groups(target, mask):
        i = int(np.searchsorted(ids, g))
        sel = locs[starts[i] : starts[i] + counts[i]] - g * seg.meta.group_rows
        by_group[g] = d if len(sel) == d.batch.num_rows else take(d, sel)  # sorted, unique: all of them
    if not whole.all():
        rest = ~whole[np.searchsorted(ids, gs)]
        few, at = await seg.take(locs[rest], target), 0
        for g, n in zip(ids[~whole].tolist(), counts[~whole].tolist()):
            by_group[g], at = _slice(few, at, n), at + n
    return await _concat_big([by_group[g] for g in ids.tolist()], target)


async def _row_ends(sealed: SealedSegment) -> np.ndarray:
    """Row offsets of a sealed segment plus the end of the row section (an LRU of segments:
    4 bytes a row, bounded by ``_OFFSET_SEGMENTS``)."""
    key = (sealed.where, sealed.footer.segid)
    got = _OFFSETS.get(key)
    if got is None:
        got = np.append((await sealed.row_offsets()).astype(np.int64), sealed.footer.rows_len)
        _OFFSETS[key] = got
        if len(_OFFSETS) > _OFFSET_SEGMENTS:
            _OFFSETS.popitem(last=False)
    else:
        _OFFSETS.move_to_end(key)
    return got


async def _from_active(seg: ActiveSegment, locs: np.ndarray, schemas: Callable[[int], SchemaVersion],
                       target: SchemaVersion) -> Decoded:
    if len(locs) and int(locs.max()) >= seg.durable_rows:
        raise RowstoreError(f"segment {seg.segid}: no row {int(locs.max())} (rows: {seg.durable_rows})")
    buf, starts = await seg.file.read_ranges(*seg.locate(locs))
    return decode_rows(buf, starts, schemas, target, seg.where)


async def _by_scan(store: SegmentStore, segid: int, locs: np.ndarray, schemas: Callable[[int], SchemaVersion],
                   target: SchemaVersion) -> Decoded:
    want = np.zeros(int(locs.max()) + 1, bool)
    want[locs] = True
    parts, base = [], 0
    async for d in store.scan(segid, target, schemas):
        n = d.batch.num_rows
        m = want[base : base + n] if base < len(want) else np.zeros(0, bool)
        if len(m) < n:
            m = np.r_[m, np.zeros(n - len(m), bool)]
        if m.any():
            idx = np.flatnonzero(m)
            parts.append(_slice(d, int(idx[0]), len(idx)) if idx[-1] - idx[0] + 1 == len(idx) else take(d, idx))
        base += n
        if base >= len(want):
            break
    return concat(parts, target)


def take(d: Decoded, idx: np.ndarray) -> Decoded:
    return Decoded(d.batch.take(pa.array(idx)), d.commit_ts[idx], d.deleted[idx], d.schema_ver[idx])


def _slice(d: Decoded, a: int, n: int) -> Decoded:
    """Rows ``a..a+n`` of ``d`` without copying (a stretch of a segment wanted whole)."""
    if a == 0 and n == d.batch.num_rows:
        return d
    return Decoded(d.batch.slice(a, n), d.commit_ts[a : a + n], d.deleted[a : a + n], d.schema_ver[a : a + n])


def concat(parts: list[Decoded], target: SchemaVersion) -> Decoded:
    parts = [p for p in parts if p.batch.num_rows]
    if not parts:
        return _empty(target)
    if len(parts) == 1:
        return parts[0]
    t = pa.Table.from_batches([p.batch for p in parts]).combine_chunks()
    batch = t.to_batches()[0] if t.num_rows else parts[0].batch.slice(0, 0)
    return Decoded(batch, np.concatenate([p.commit_ts for p in parts]), np.concatenate([p.deleted for p in parts]),
                   np.concatenate([p.schema_ver for p in parts]))


def _empty(target: SchemaVersion) -> Decoded:
    return decode_rows(np.zeros(0, np.uint8), np.zeros(0, np.int64), lambda v: target, target)
