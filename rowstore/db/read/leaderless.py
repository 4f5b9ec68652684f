"""Reads of a partition from its objects alone, when its leader does not answer (RFC 0010 §6).

Which rows of an offloaded segment are visible at T is normally the leader's key index (a
newer version or a deletion in any later segment hides a row). A partition's *watermark*
(``rs/wm/<table id>/<pid:03d>``, docs/format/replication.md) says up to which commit
timestamp every commit of the partition is in offloaded segments; below it any node can
work visibility out from the objects themselves: per key the newest version at or below T,
deletions hiding their key. Above it the rows may be only on the leader's replicas, and the
read is refused rather than answered short.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from catalog.abc import Catalog, Check, Put
from rowstore.errors import UnavailableError
from rowstore.index.rowid_kernels import match_sorted
from rowstore.reads.plan import SegmentSlice, visible_bitmap
from rowstore.reads.retention import kept_terms
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.rowids import rowids, split_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableDef
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.timeline import Timeline
from terrafs.catalog_ops import commit
from terrafs.fs import TerrascaleFS

log = logging.getLogger("rowstore.db.offloaded_reads")
WATERMARK_PREFIX = "rs/wm/"
_GONE = (SegState.OFFLOADED, SegState.RETIRED)


def watermark_key(table_id: str, pid: int) -> str:
    return f"{WATERMARK_PREFIX}{table_id}/{pid:03d}"


@dataclass(frozen=True)
class Watermark:
    seq: int  # every non-copy segment with seq <= it is offloaded (or retired)
    ts: int  # every commit at or below it is in those segments (or their copies)

    def to_bytes(self) -> bytes:
        return json.dumps({"seq": self.seq, "ts": self.ts}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Watermark:
        d = json.loads(raw)
        return cls(int(d["seq"]), int(d["ts"]))


async def read_watermark(catalog: Catalog, table_id: str, pid: int) -> Watermark | None:
    e = await catalog.get(watermark_key(table_id, pid))
    return None if e is None else Watermark.from_bytes(e.value)


async def read_watermarks(catalog: Catalog, table_id: str) -> dict[int, Watermark]:
    """Every partition's watermark of a table, by partition (one scan)."""
    prefix = f"{WATERMARK_PREFIX}{table_id}/"
    return {int(e.key[len(prefix):]): Watermark.from_bytes(e.value) for e in await catalog.scan(prefix)}


async def advance_watermark(store: SegmentStore, timeline: Timeline, table_id: str, pid: int) -> Watermark | None:
    """After this node (the partition's leader) offloaded one of its segments: move the
    partition's watermark up to what is offloaded now. None: it cannot move."""
    closed = timeline.closed  # first: a commit at or below it is done, in some segment already
    return await advance_from(store, closed, await store.list(table=table_id), table_id, pid)


async def advance_from(store: SegmentStore, closed: int, listed: list[SegmentRecord], table_id: str,
                       pid: int) -> Watermark | None:
    """:func:`advance_watermark` with the closed timestamp read *before* ``listed`` was."""
    recs = sorted((r for r in listed if r.table == table_id and r.partition == pid and not r.copy),
                  key=lambda r: r.seq)
    k = 0  # no segment at all: every commit at or below ``closed`` is nowhere (there is none)
    for r in recs:
        if r.state not in _GONE:
            break
        k = r.seq
    floor = closed
    for r in recs:
        if r.seq <= k:
            continue
        if r.state == SegState.ACTIVE and r.segid not in store.active:
            return None  # another node's active segment: its rows' timestamps are unknown here
        live = store.live(r)
        if live.max_ts:  # holds rows (an empty active segment's rows will all be above ``closed``)
            floor = min(floor, live.min_ts - 1)
    new = Watermark(k, floor)
    key = watermark_key(table_id, pid)
    for _ in range(5):
        e = await store.catalog.get(key)
        old = None if e is None else Watermark.from_bytes(e.value)
        if old is not None and old.ts >= new.ts and old.seq >= new.seq:
            return old
        best = new if old is None else Watermark(max(old.seq, new.seq), max(old.ts, new.ts))
        res = await commit(store.catalog, [Check(key, 0 if e is None else e.version)], [Put(key, best.to_bytes())])
        if res.committed:
            return best
    log.warning("event=watermark_contended table=%s partition=%d", table_id, pid)
    return None


async def visible_offloaded(store: SegmentStore, d: TableDef, schemas: Callable[[int], SchemaVersion], pid: int,
                            T: int, listed: list[SegmentRecord],
                            match: Callable[[pa.RecordBatch], np.ndarray] | None = None,
                            ) -> tuple[np.ndarray, list[tuple[pa.RecordBatch, np.ndarray]]]:
    """The rowids (sorted) of the partition's rows visible at T, worked out from its objects
    in one scan of each; with ``match(batch) -> mask``, also the matching rows committed at or
    below T as (batch, their rowids) — the caller keeps the visible ones, without a second scan.

    Refused (UnavailableError) when T is above the partition's watermark."""
    wm = await read_watermark(store.catalog, d.table_id, pid)
    if wm is None or T > wm.ts:
        have = "nothing offloaded yet" if wm is None else f"its objects hold every commit up to {wm.ts}"
        raise UnavailableError(f"table {d.name!r}: partition {pid} has no leader answering and {have}; "
                               f"a read at {T} needs its leader (retry, or read as of an earlier time)")
    assert d.schema is not None  # a definition at T from describe(): not dropped
    recs = [r for r in listed if r.table == d.table_id and r.partition == pid and r.state == SegState.OFFLOADED
            and r.min_ts <= T and r.rows]
    keys, ts, dead, ids, kept = [], [], [], [], []
    for r in recs:
        n = 0
        async for dec in store.scan(r.segid, d.schema, schemas):
            m = dec.batch.num_rows
            rid = rowids(r.segid, np.arange(n, n + m, dtype=np.uint32))
            n += m
            keys.append(pa.array(encode_columns(d.schema.pk, key_arrays(d.schema.pk, dec.batch))))
            ts.append(dec.commit_ts)
            dead.append(dec.deleted)
            ids.append(rid)
            if match is not None:
                want = np.asarray(match(dec.batch), bool) & (dec.commit_ts <= np.uint64(T)) & ~dec.deleted
                if want.any():
                    kept.append((dec.batch.filter(pa.array(want)), rid[want]))
    if not keys:
        return np.zeros(0, np.uint64), kept
    t = pa.table({"k": pa.concat_arrays(keys), "ts": np.concatenate(ts), "dead": np.concatenate(dead),
                  "id": np.concatenate(ids)})
    t = t.filter(pc.less_equal(t.column("ts"), pa.scalar(T, pa.uint64())))
    if t.num_rows == 0:
        return np.zeros(0, np.uint64), kept
    t = t.take(pc.sort_indices(t, [("k", "ascending"), ("ts", "descending")]))
    k = t.column("k").combine_chunks()
    first = np.ones(t.num_rows, bool)  # the newest version of each key at or below T
    if t.num_rows > 1:
        first[1:] = pc.not_equal(k.slice(1), k.slice(0, t.num_rows - 1)).to_numpy(zero_copy_only=False)
    return np.sort(t.column("id").to_numpy()[first & ~t.column("dead").to_numpy()]), kept


async def plan_offloaded(store: SegmentStore, fs: TerrascaleFS, d: TableDef, schemas: Callable[[int], SchemaVersion],
                         pids: list[int], T: int) -> list[SegmentSlice]:
    """The read plan's slices of ``pids`` at T, made without their leader."""
    listed = await store.list(table=d.table_id)
    recs = {r.segid: r for r in listed}
    out = []
    kept = kept_terms(d, T)  # the retention's term: a plan's bitmaps are exact
    for pid in pids:
        ids, got = await visible_offloaded(store, d, schemas, pid, T, listed,
                                           (lambda b: batch_mask(b, kept, None)) if kept else None)
        if kept:
            ids = np.intersect1d(ids, np.concatenate([rid for _, rid in got]) if got else ids[:0])
        segs, locs = split_rowids(ids)
        for segid in np.unique(segs).tolist():
            f = await fs.stat(recs[segid].inode)
            out.append(SegmentSlice(segid, f.location, f.object_size, recs[segid].rows,
                                    visible_bitmap(locs[segs == segid])))
    return out


async def query_offloaded(store: SegmentStore, d: TableDef, schemas: Callable[[int], SchemaVersion], pids: list[int],
                          T: int, terms: list[Term], box: BBox | None) -> list[pa.RecordBatch]:
    """The rows of ``pids`` visible at T matching the predicates, read from the objects."""
    listed = await store.list(table=d.table_id)
    out = []
    for pid in pids:
        ids, kept = await visible_offloaded(store, d, schemas, pid, T, listed, lambda b: batch_mask(b, terms, box))
        out += [b.filter(pa.array(_among(rid, ids))) for b, rid in kept]
    return out


def _among(rid: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of the sorted ``rid`` (a batch's, in scan order) are in the sorted ``ids``: one
    galloping pass (``np.isin`` sorted ``ids`` again for every batch, and the objects scan as
    many small batches)."""
    hit: np.ndarray = match_sorted(ids, rid) >= 0
    return hit
