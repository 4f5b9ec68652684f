"""The garbage collector's row work (docs/rfcs/0009-gc.md): the mark kernel, reading a
victim's rows, cluster keys and the gather of live rows into new sealed objects.

Everything here is vectorized or compiled: no per-row Python."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rowstore.codec.rows import decode_run
from rowstore.errors import RowCorruptionError
from rowstore.rowids import TOMBSTONE
from rowstore.schema import Column, PrimaryKey, SchemaVersion
from rowstore.segments.columnar import ColumnarSegment, SealedReader
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.sealed import CLUSTER_BOX, CLUSTER_FLOAT, CLUSTER_INT, MAX_VERSIONS, ClusterRange, sealed_bytes
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.types import Kind

_INT_KINDS = {Kind.TIMESTAMP, Kind.DATE, Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8,
              Kind.UINT16, Kind.UINT32, Kind.UINT64}


# -- mark ---------------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def _mark(rowids: npt.NDArray[np.uint64], segids: npt.NDArray[np.uint32], first: npt.NDArray[np.int64],
          bits: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """Set ``bits[first[i] + localid]`` for every rowid of segment ``segids[i]`` (segids
    sorted); returns the live count per segment. One pass, no allocation per row."""
    counts = np.zeros(segids.shape[0], np.int64)
    tomb = np.uint64(0xFFFFFFFFFFFFFFFF)
    for j in range(rowids.shape[0]):
        r = rowids[j]
        if r == tomb:
            continue
        seg = np.uint32(r >> np.uint64(32))
        loc = np.int64(r & np.uint64(0xFFFFFFFF))
        lo, hi = 0, segids.shape[0]
        while lo < hi:
            mid = (lo + hi) >> 1
            if segids[mid] < seg:
                lo = mid + 1
            else:
                hi = mid
        if lo < segids.shape[0] and segids[lo] == seg:
            at = first[lo] + loc
            if at < first[lo + 1] and not bits[at]:
                bits[at] = True
                counts[lo] += 1
    return counts


def mark_live(rowids: np.ndarray, rows_of: dict[int, int]) -> dict[int, tuple[int, np.ndarray]]:
    """Per segment of ``rows_of`` (segid -> row count): (live rows, live bitmap as bools), from
    the rowids the key index still references (tombstones ignored)."""
    segids = np.array(sorted(rows_of), np.uint32)
    first = np.zeros(len(segids) + 1, np.int64)
    first[1:] = np.cumsum([rows_of[int(s)] for s in segids])
    bits = np.zeros(int(first[-1]), np.bool_)
    counts = _mark(np.asarray(rowids, np.uint64), segids, first, bits)
    return {int(s): (int(counts[i]), bits[first[i]:first[i + 1]]) for i, s in enumerate(segids)}


# -- cluster keys ---------------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def hilbert(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], xmin: float, ymin: float, xmax: float,
            ymax: float) -> npt.NDArray[np.uint64]:
    """The Hilbert index (16 bits per axis) of each (x, y) over the box; NaN sorts last."""
    n = x.shape[0]
    out = np.empty(n, np.uint64)
    side = 65535.0
    sx = side / (xmax - xmin) if xmax > xmin else 0.0
    sy = side / (ymax - ymin) if ymax > ymin else 0.0
    for i in range(n):
        if np.isnan(x[i]) or np.isnan(y[i]):
            out[i] = np.uint64(0xFFFFFFFFFFFFFFFF)
            continue
        xi = np.int64(min(max((x[i] - xmin) * sx, 0.0), side))
        yi = np.int64(min(max((y[i] - ymin) * sy, 0.0), side))
        d = np.int64(0)
        s = np.int64(1 << 15)
        while s > 0:
            rx = 1 if (xi & s) > 0 else 0
            ry = 1 if (yi & s) > 0 else 0
            d += s * s * ((3 * rx) ^ ry)
            if ry == 0:  # rotate the quadrant
                if rx == 1:
                    xi = s - 1 - xi
                    yi = s - 1 - yi
                xi, yi = yi, xi
            s >>= 1
        out[i] = np.uint64(d)
    return out


@dataclass(frozen=True)
class ClusterSpec:
    """How a table's rows are ordered when copied: by ``column`` (None: the primary key)."""

    column: Column | None
    key: PrimaryKey


def _xy(arr: pa.Array, kind: Kind) -> tuple[np.ndarray, np.ndarray]:
    """Points as (x, y); boxes by their centre; nulls as NaN."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    f: Callable[[str], npt.NDArray[np.float64]] = \
        lambda n: np.asarray(arr.field(n).to_numpy(zero_copy_only=False), np.float64)  # noqa: E731
    if kind == Kind.POINT:
        x, y = f("x").copy(), f("y").copy()
    else:
        x, y = (f("xmin") + f("xmax")) / 2, (f("ymin") + f("ymax")) / 2
    if arr.null_count:
        nulls = np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)
        x[nulls] = np.nan
        y[nulls] = np.nan
    return x, y


def _numbers(arr: pa.Array, kind: Kind) -> np.ndarray:
    """Float64 values of a number column, NaN for nulls (uint64 straight to float64: no int64)."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if kind in _INT_KINDS and kind != Kind.UINT64:
        arr = _ints(arr, kind)
    return np.asarray(arr.cast(pa.float64(), safe=False).fill_null(np.nan).to_numpy(zero_copy_only=False), np.float64)


def _ints(arr: pa.Array, kind: Kind) -> pa.Array:
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if kind == Kind.DATE:
        arr = arr.cast(pa.int32())
    return arr.cast(pa.int64())


def cluster_order(spec: ClusterSpec, batch: pa.RecordBatch) -> np.ndarray:
    """Row positions of ``batch`` in cluster order (stable)."""
    if spec.column is None or spec.column.name not in batch.schema.names:
        return np.argsort(encode_columns(spec.key, key_arrays(spec.key, batch)), kind="stable")
    col, kind = batch.column(spec.column.name), spec.column.type.kind
    if kind in (Kind.POINT, Kind.BOX):
        x, y = _xy(col, kind)
        ok = ~np.isnan(x)
        if not ok.any():
            return np.arange(len(x))
        keys = hilbert(x, y, float(x[ok].min()), float(y[ok].min()), float(x[ok].max()), float(y[ok].max()))
        return np.argsort(keys, kind="stable")
    if kind in _INT_KINDS and kind != Kind.UINT64:
        v = np.asarray(_ints(col, kind).fill_null(np.iinfo(np.int64).max).to_numpy(zero_copy_only=False), np.int64)
        return np.argsort(v, kind="stable")
    v = _numbers(col, kind)
    return np.argsort(np.where(np.isnan(v), np.inf, v), kind="stable")


def cluster_range(spec: ClusterSpec, batch: pa.RecordBatch) -> ClusterRange | None:
    """The footer's cluster range of ``batch``'s rows: (kind, column id, lo..., hi...), or None
    (default clustering, or no non-null value). Float32 boxes are rounded outward."""
    if spec.column is None or spec.column.name not in batch.schema.names:
        return None
    col, kind = batch.column(spec.column.name), spec.column.type.kind
    if kind in (Kind.POINT, Kind.BOX):
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        f: Callable[[str], npt.NDArray[np.float64]] = \
            lambda n: np.asarray(arr.field(n).to_numpy(zero_copy_only=False), np.float64)  # noqa: E731
        ok = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool) if arr.null_count else None
        lo_x, lo_y, hi_x, hi_y = (f("x"), f("y"), f("x"), f("y")) if kind == Kind.POINT else \
            (f("xmin"), f("ymin"), f("xmax"), f("ymax"))
        if ok is not None:
            lo_x, lo_y, hi_x, hi_y = lo_x[ok], lo_y[ok], hi_x[ok], hi_y[ok]
        if len(lo_x) == 0:
            return None
        down: Callable[[float], float] = \
            lambda v: float(np.nextafter(np.float32(v), np.float32(-np.inf)))  # noqa: E731
        up: Callable[[float], float] = lambda v: float(np.nextafter(np.float32(v), np.float32(np.inf)))  # noqa: E731
        return (CLUSTER_BOX, spec.column.id, down(np.nanmin(lo_x)), down(np.nanmin(lo_y)),
                up(np.nanmax(hi_x)), up(np.nanmax(hi_y)))
    v = _numbers(col, kind)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        return None
    if kind in _INT_KINDS and kind != Kind.UINT64:
        iv = np.asarray(_ints(col, kind).drop_null().to_numpy(zero_copy_only=False), np.int64)
        return (CLUSTER_INT, spec.column.id, int(iv.min()), int(iv.max()))
    return (CLUSTER_FLOAT, spec.column.id, float(np.nextafter(v.min(), -np.inf)), float(np.nextafter(v.max(), np.inf)))


# -- reading a victim and writing copies ----------------------------------------------------------


@dataclass
class VictimRows:
    """One victim's live rows: their bytes back to back, starts, decoded batch and rowids."""

    segid: int
    buf: np.ndarray  # uint8
    starts: np.ndarray  # int64, of the live rows in ``buf``
    lens: np.ndarray  # int64
    batch: pa.RecordBatch  # the live rows decoded (cluster keys, key ranges)
    commit_ts: np.ndarray
    rowids: np.ndarray  # uint64, their old rowids
    live_bytes: int
    deleted: np.ndarray  # bool: deletion rows
    versions: np.ndarray  # uint32: each row's schema version


async def read_live(seg: SealedReader, live: np.ndarray, horizon: int, schemas: Callable[[int], SchemaVersion],
                    target: SchemaVersion) -> VictimRows:
    """The rows of ``seg`` that are live: in the mark bitmap, or committed after ``horizon``
    (deletion rows above the horizon stay for the change feed; the index has no rowid for them).
    A columnar segment's rows are re-encoded as row bytes, each in its own schema version."""
    if isinstance(seg, ColumnarSegment):
        buf, offsets = await seg.as_rows()
        rows_len = len(buf)
    else:
        offsets = await seg.row_offsets()
        rows_len = seg.footer.rows_len
        buf = np.frombuffer(await seg.sf.read_sequential(0, rows_len), np.uint8)
    n = len(offsets)
    if len(live) != n:  # the mark pass counted another segment's rows under this segid
        raise RowCorruptionError(seg.where, None, f"segment {seg.segid} holds {n} rows; its catalog row says "
                                                  f"{len(live)}")
    dec = await asyncio.to_thread(decode_run, buf, offsets, schemas, target, seg.where, 0)
    keep = np.asarray(live[:n], bool) | (dec.commit_ts > np.uint64(horizon))
    idx = np.flatnonzero(keep)
    lens = np.diff(np.append(offsets, rows_len))
    ids = (np.uint64(seg.segid) << np.uint64(32)) | idx.astype(np.uint64)
    return VictimRows(seg.segid, buf, offsets[idx], lens[idx], dec.batch.take(pa.array(idx)),
                      dec.commit_ts[idx], ids, int(lens[idx].sum()), np.asarray(dec.deleted[idx], bool),
                      np.asarray(dec.schema_ver[idx], np.uint32))


@numba.njit(cache=True, nogil=True)
def _gather(bufs_flat: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lens: npt.NDArray[np.int64],
            out: npt.NDArray[np.uint8], out_starts: npt.NDArray[np.int64]) -> None:
    pos = 0
    for i in range(starts.shape[0]):
        s, n = starts[i], lens[i]
        out_starts[i] = pos
        out[pos:pos + n] = bufs_flat[s:s + n]
        pos += n


@dataclass
class _Chunk:
    """Rows for :func:`sealed_bytes` from many commits."""

    rows: np.ndarray
    starts: np.ndarray
    min_ts: int
    max_ts: int

    @property
    def commit_ts(self) -> int:
        return self.max_ts


@dataclass
class Copy:
    """Live rows of a partition's victims in cluster order, cut into segment-sized pieces."""

    buf: np.ndarray  # all live rows, back to back, in cluster order
    starts: np.ndarray
    lens: np.ndarray
    old_rowids: np.ndarray  # per row in this order
    commit_ts: np.ndarray
    batch: pa.RecordBatch  # decoded, same order
    deleted: np.ndarray
    cuts: list[tuple[int, int]]  # [a, b) row ranges, one per new segment


def plan_copy(victims: list[VictimRows], spec: ClusterSpec, seal_bytes: int) -> Copy:
    """Concatenate the victims' live rows, order them by the cluster key, gather the bytes."""
    victims = [v for v in victims if len(v.starts)]
    if not victims:
        e = np.zeros(0, np.int64)
        return Copy(np.zeros(0, np.uint8), e, e, np.zeros(0, np.uint64), np.zeros(0, np.uint64), None,
                    np.zeros(0, bool), [])
    base, flat, starts = 0, [], []
    for v in victims:
        flat.append(v.buf)
        starts.append(v.starts + base)
        base += len(v.buf)
    buf_all = np.concatenate(flat) if flat else np.zeros(0, np.uint8)
    starts_all = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    lens = np.concatenate([v.lens for v in victims]) if victims else np.zeros(0, np.int64)
    batch = pa.Table.from_batches([v.batch for v in victims]).combine_chunks().to_batches()
    batch = batch[0] if batch else None
    order = cluster_order(spec, batch) if batch is not None else np.zeros(0, np.int64)
    # a segment names at most MAX_VERSIONS schema versions: rows of more are grouped by version
    # (cluster order within a group) and no copy spans two groups
    vers = np.concatenate([v.versions for v in victims])
    uniq = np.unique(vers)
    breaks = np.zeros(0, np.int64)
    if len(uniq) > MAX_VERSIONS:
        group = np.searchsorted(uniq, vers) // MAX_VERSIONS
        order = order[np.argsort(group[order], kind="stable")]
        breaks = np.flatnonzero(np.diff(group[order])) + 1
    lens = lens[order]
    out = np.empty(int(lens.sum()), np.uint8)
    out_starts = np.empty(len(order), np.int64)
    _gather(buf_all, starts_all[order].astype(np.int64), lens.astype(np.int64), out, out_starts)
    ends = np.cumsum(lens)
    cuts, a = [], 0
    while a < len(order):
        b = int(np.searchsorted(ends, (ends[a - 1] if a else 0) + seal_bytes, "left")) + 1
        b = min(max(b, a + 1), len(order))
        nxt = breaks[breaks > a]
        if len(nxt):
            b = min(b, int(nxt[0]))
        cuts.append((a, b))
        a = b
    old = np.concatenate([v.rowids for v in victims])[order]
    ts = np.concatenate([v.commit_ts for v in victims])[order]
    dels = np.concatenate([v.deleted for v in victims])[order]
    assert batch is not None  # the victims hold rows
    return Copy(out, out_starts, lens, old, ts, batch.take(pa.array(order)), dels, cuts)


def piece_stream(copy: Copy, a: int, b: int, segid: int, schemas: Callable[[int], SchemaVersion],
                 key_schema: SchemaVersion, spec: ClusterSpec, stats: dict[str, Any],
                 columnar: bool = False) -> AsyncIterator[bytes]:
    """The sealed object bytes of rows ``[a, b)`` of ``copy`` as segment ``segid`` (version 2,
    columnar, when ``columnar``)."""
    lo = int(copy.starts[a])
    hi = int(copy.starts[b - 1] + copy.lens[b - 1])
    chunk = _Chunk(copy.buf[lo:hi], copy.starts[a:b] - lo, int(copy.commit_ts[a:b].min()),
                   int(copy.commit_ts[a:b].max()))
    rng = cluster_range(spec, copy.batch.slice(a, b - a))

    async def one() -> AsyncIterator[_Chunk]:
        yield chunk

    stats["cluster"] = rng
    write = columnar_bytes if columnar else sealed_bytes
    return write(segid, one(), schemas, key_schema, stats, cluster=rng)


def remap(rowids: np.ndarray, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``rowids`` with every one found in ``old`` replaced by its ``new`` (``old`` sorted)."""
    out = np.array(rowids, np.uint64, copy=True)
    if len(old) == 0 or len(out) == 0:
        return out
    pos = np.minimum(np.searchsorted(old, out), len(old) - 1)
    hit = (old[pos] == out) & (out != TOMBSTONE)
    out[hit] = new[pos[hit]]
    return out
