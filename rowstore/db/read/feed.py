"""The change feed read from the segments (RFC 0006's `/changes`, RFC 0015's catch-up): every
row change committed in an interval ``(a, b]``, in commit order, from each segment whose time
range reaches it — and, for a long interval, the same in windows of about a number of rows,
so a reader of a week of changes holds one window at a time (a subscription's catch-up).

Windows are cut from the segments' time ranges and row counts alone (a segment's rows taken
as spread evenly over its range), before anything is read; a segment that reaches several
windows is read once for each, its batches streamed and only the window's rows kept."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from rowstore.db.read.context import ReadContext
from rowstore.reads.predicates import batch_mask
from rowstore.segments.records import SegmentRecord, SegState
from rowstore.segments.store import SegmentStore


def feed_segments(recs: list[SegmentRecord], after: int, T: int, partitions: list[int] | None) -> list[SegmentRecord]:
    """The segments a feed of ``(after, T]`` reads."""
    return [r for r in recs
            if (partitions is None or r.partition in partitions)
            and r.state != SegState.RETIRED  # its live rows are in the copies that replaced it (RFC 0009)
            and r.max_ts > after and r.min_ts <= T]  # not empty, something in (after, T]


def windows(recs: list[SegmentRecord], after: int, T: int, rows: int) -> list[tuple[int, int]]:
    """``(after, T]`` cut into consecutive windows ``(a, b]`` of about ``rows`` changes each
    by the segments' estimates (one window when they hold fewer). A sweep over the segments'
    edges: between two edges the segments covering the interval do not change."""
    spans = [(max(r.min_ts, after + 1), min(r.max_ts, T), r.rows) for r in recs if r.rows]
    if sum(n for _, _, n in spans) <= rows:
        return [(after, T)]
    delta: dict[int, float] = {after: 0.0, T: 0.0}
    for s, h, n in spans:  # the span covers (s - 1, h], n rows spread evenly over it
        d = n / (h - s + 1)
        delta[s - 1] = delta.get(s - 1, 0.0) + d
        delta[h] = delta.get(h, 0.0) - d
    points = sorted(delta)
    out, a, acc, density = [], after, 0.0, 0.0
    for lo, hi in zip(points, points[1:]):  # the interval (lo, hi]
        density += delta[lo]
        est = density * (hi - lo)
        if acc + est <= rows:
            acc += est
            continue
        if acc:  # close the window before this interval
            out.append((a, lo))
            a, acc = lo, 0.0
        pieces = int(np.ceil(est / rows))
        for k in range(1, pieces):
            cut = lo + (hi - lo) * k // pieces
            if cut > a:
                out.append((a, cut))
                a = cut
        acc = est / pieces
    if a < T:
        out.append((a, T))
    return out


async def read_window(store: SegmentStore, c: ReadContext, recs: list[SegmentRecord], a: int, b: int) -> pa.Table:
    """Every change of ``recs`` committed in ``(a, b]``: the columns of the schema at ``c.T``,
    plus ``commit_ts`` and ``op``, in commit order (then key); an upsert the retention hides at
    ``c.T`` left out (a delete is shown)."""
    assert c.d.schema is not None  # describe() refuses a dropped table
    parts = []
    for rec in recs:
        if rec.max_ts <= a or rec.min_ts > b:
            continue
        async for dec in store.scan(rec.segid, c.d.schema, c.schemas):
            m = (dec.commit_ts > np.uint64(a)) & (dec.commit_ts <= np.uint64(b))
            if c.kept:
                m &= dec.deleted | batch_mask(dec.batch, list(c.kept), None)
            if m.any():
                idx = np.flatnonzero(m)
                part = dec.batch.take(pa.array(idx))
                ops = np.where(dec.deleted[idx], "delete", "upsert")
                parts.append(part.append_column("commit_ts", pa.array(dec.commit_ts[idx].astype(np.int64)))
                             .append_column("op", pa.array(ops)))
    if not parts:
        schema = c.d.schema.arrow().append(pa.field("commit_ts", pa.int64())).append(pa.field("op", pa.string()))
        return schema.empty_table()
    t = pa.Table.from_batches(parts)
    return t.sort_by([("commit_ts", "ascending"), *((k, "ascending") for k in c.d.schema.pk.names)])
