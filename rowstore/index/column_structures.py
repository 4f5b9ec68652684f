"""Column index building blocks (docs/rfcs/0002-column-index.md): value -> roaring bitmap of
rowids for equality, and per-axis range breakdown for ranges and bounding boxes.

An :class:`AxisIndex` indexes intervals ``[lo, hi]`` on one numeric axis (a
point or scalar is the interval ``[v, v]``; a box contributes one axis each).
Values are split into at most ``buckets`` equi-depth buckets; an interval is
added to every bucket it overlaps (the breakdown). A query interval is the
union of the buckets it overlaps; buckets it covers completely need no check,
and the candidates of the (at most two) edge buckets are refined exactly from
a side table — no row is fetched. Everything is vectorized; Python loops run
over buckets, never over rows.
"""
from __future__ import annotations

import array

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyroaring import BitMap64

from rowstore.index.rowid_kernels import match_sorted
from rowstore.reads.predicates import Interval

MAX_BUCKETS = 256


def bitmap(ids: np.ndarray) -> BitMap64:
    """A roaring bitmap from uint64 rowids (the array.array path is ~6x faster than numpy's)."""
    return BitMap64(array.array("Q", np.ascontiguousarray(ids, np.uint64).tobytes()))


def ids_of(bm: BitMap64) -> np.ndarray:
    return np.frombuffer(bm.to_array(), np.uint64) if len(bm) else np.zeros(0, np.uint64)


class AxisIndex:
    def __init__(self, lo: np.ndarray, hi: np.ndarray, rowids: np.ndarray, buckets: int = MAX_BUCKETS):
        valid = ~(np.isnan(lo) | np.isnan(hi)) if lo.dtype.kind == "f" else np.ones(len(lo), bool)
        self.nan_rowids = np.sort(np.asarray(rowids, np.uint64)[~valid])  # kept for aggregates: NaN is a value
        lo, hi, rowids = lo[valid], hi[valid], np.asarray(rowids, np.uint64)[valid]
        order = np.argsort(rowids, kind="stable")
        self.rowids, self.lo, self.hi = rowids[order], lo[order], hi[order]  # side table, by rowid
        self.bounds = _equi_depth(np.concatenate([lo, hi]), buckets)
        self.bitmaps = self._breakdown()

    def _breakdown(self) -> list[BitMap64]:
        nb = len(self.bounds)
        if nb == 0:
            return []
        first = np.clip(np.searchsorted(self.bounds, self.lo, "right") - 1, 0, nb - 1)
        last = np.clip(np.searchsorted(self.bounds, self.hi, "right") - 1, 0, nb - 1)
        span = last - first + 1  # an interval goes into every bucket it overlaps
        rows = np.repeat(np.arange(len(self.rowids)), span)
        bucket = np.repeat(first, span) + (np.arange(len(rows)) - np.repeat(np.cumsum(span) - span, span))
        order = np.argsort(bucket, kind="stable")
        bucket, rows = bucket[order], rows[order]
        cuts = np.searchsorted(bucket, np.arange(nb + 1))
        return [bitmap(self.rowids[rows[cuts[j] : cuts[j + 1]]]) for j in range(nb)]

    def share(self, q: Interval) -> float:
        """About which share of the rows ``query(q)`` selects, from the buckets it spans
        (equi-depth: each holds about as many) — nothing is read."""
        nb = len(self.bounds)
        if nb == 0:
            return 0.0
        a = 0 if q.lo is None else max(int(np.searchsorted(self.bounds, q.lo, "right")) - 1, 0)
        b = nb - 1 if q.hi is None else int(np.searchsorted(self.bounds, q.hi, "right")) - 1
        return max(b - a + 1, 0) / nb

    def query(self, q: Interval) -> BitMap64:
        """Exactly the rowids whose interval overlaps ``q``."""
        nb = len(self.bounds)
        if nb == 0:
            return BitMap64()
        a = 0 if q.lo is None else max(int(np.searchsorted(self.bounds, q.lo, "right")) - 1, 0)
        b = nb - 1 if q.hi is None else int(np.searchsorted(self.bounds, q.hi, "right")) - 1
        if b < 0 or a > b:
            return BitMap64()
        covered = [self.bitmaps[j] for j in range(a, b + 1) if self._covered(j, q)]
        out = BitMap64.union(*covered) if covered else BitMap64()  # one multiway union
        edges = BitMap64.union(*[self.bitmaps[j] for j in {a, b} if not self._covered(j, q)]) \
            if any(not self._covered(j, q) for j in {a, b}) else BitMap64()
        edges -= out
        if len(edges):
            cand = ids_of(edges)
            pos = match_sorted(self.rowids, cand)  # every candidate is in the side table
            out |= bitmap(cand[q.overlaps(self.lo[pos], self.hi[pos])])
        return out

    def _covered(self, j: int, q: Interval) -> bool:
        """Whether every interval in bucket j surely overlaps q: bucket j lies inside q."""
        lo_b = self.bounds[j]
        hi_b = self.bounds[j + 1] if j + 1 < len(self.bounds) else None
        if hi_b is None:
            return False  # the last bucket is open-ended: always refine
        left_ok = q.lo is None or (lo_b > q.lo or (q.lo_inc and lo_b >= q.lo))
        right_ok = q.hi is None or hi_b <= q.hi  # bucket is [lo_b, hi_b): values < hi_b <= q.hi
        return bool(left_ok and right_ok)


def _equi_depth(values: np.ndarray, buckets: int) -> np.ndarray:
    """Sorted distinct bucket lower bounds (the first is the minimum value)."""
    if len(values) == 0:
        return np.zeros(0, values.dtype)
    qs = np.quantile(values, np.linspace(0, 1, buckets + 1)[:-1], method="lower")
    return np.unique(qs)


class ValueIndex:
    """Exact value -> bitmap, for equality on strings, booleans and low-cardinality numbers."""

    def __init__(self, values: np.ndarray | pa.Array | pa.ChunkedArray, rowids: np.ndarray) -> None:
        """``values``: a numpy array, or an Arrow array (dictionary-encoded: Python touches
        each distinct value once, never each row)."""
        rowids = np.asarray(rowids, np.uint64)
        if isinstance(values, (pa.Array, pa.ChunkedArray)):
            enc = values.dictionary_encode()
            if isinstance(enc, pa.ChunkedArray):
                enc = enc.combine_chunks()
            keys, inv = enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False)
            self.dictionary = enc.dictionary
        else:
            keys, inv = np.unique(values, return_inverse=True)
            self.dictionary = pa.array(keys)
        by_rowid = np.argsort(rowids, kind="stable")  # the side table aggregates gather values from
        self.rowids, self.codes = rowids[by_rowid], np.asarray(inv, np.int32)[by_rowid]
        order = np.argsort(inv, kind="stable")
        cuts = np.searchsorted(inv[order], np.arange(len(keys) + 1))
        self.bitmaps = {k.item() if hasattr(k, "item") else k: bitmap(rowids[order[cuts[i] : cuts[i + 1]]])
                        for i, k in enumerate(keys)}
        self.all = bitmap(rowids)

    def eq(self, v: object) -> BitMap64:
        return self.bitmaps.get(v, BitMap64())

    def ne(self, v: object) -> BitMap64:
        return self.all - self.eq(v)


class GridIndex:
    """2-D cells for ``point`` columns (the RFC 0002 amendment under evaluation).

    Equi-depth cuts per axis make ``g × g`` cells; rowids are stored sorted by
    cell (CSR: one array plus cell offsets), with their coordinates for the
    exact refine. A box query takes the cells it covers whole as slices and
    refines only the border cells — work proportional to the answer, not to
    the square root of the selectivity as with per-axis unions.
    """

    rowids: npt.NDArray[np.uint64]  # by cell
    x: npt.NDArray[np.float64]
    y: npt.NDArray[np.float64]

    def __init__(self, x: np.ndarray, y: np.ndarray, rowids: np.ndarray, g: int = 256):
        ok = ~(np.isnan(x) | np.isnan(y))
        x, y, rowids = x[ok], y[ok], np.asarray(rowids, np.uint64)[ok]
        self.bx, self.by = _equi_depth(x, g), _equi_depth(y, g)
        cx = np.clip(np.searchsorted(self.bx, x, "right") - 1, 0, max(len(self.bx) - 1, 0))
        cy = np.clip(np.searchsorted(self.by, y, "right") - 1, 0, max(len(self.by) - 1, 0))
        self.ny = max(len(self.by), 1)
        cell = cx.astype(np.int64) * self.ny + cy
        order = np.argsort(cell, kind="stable")
        self.rowids, self.x, self.y = rowids[order], x[order], y[order]
        self.offsets = np.searchsorted(cell[order], np.arange(max(len(self.bx), 1) * self.ny + 1))
        self._by_rowid: tuple[np.ndarray, np.ndarray] | None = None

    def by_rowid(self) -> tuple[np.ndarray, np.ndarray]:
        """(rowids sorted, the points' positions in that order): built on the first aggregate
        that needs them."""
        if self._by_rowid is None:
            o = np.argsort(self.rowids, kind="stable")
            self._by_rowid = (self.rowids[o], o)
        return self._by_rowid

    def query(self, xmin: float, ymin: float, xmax: float, ymax: float) -> np.ndarray:
        """Rowids of the points inside the box, edges inclusive (exact), as a sorted array."""
        if len(self.rowids) == 0 or xmin > xmax or ymin > ymax:
            return np.zeros(0, np.uint64)
        x0, x1 = self._span(self.bx, xmin, xmax)
        y0, y1 = self._span(self.by, ymin, ymax)
        if x0 > x1 or y0 > y1:
            return np.zeros(0, np.uint64)
        parts = []
        for cx in range(x0, x1 + 1):
            a, b = self.offsets[cx * self.ny + y0], self.offsets[cx * self.ny + y1 + 1]
            inner_x = cx not in (x0, x1) or self._inside(self.bx, cx, xmin, xmax)
            if inner_x and y1 - y0 >= 2:  # whole cells in the middle of the column: no refine
                m0, m1 = self.offsets[cx * self.ny + y0 + 1], self.offsets[cx * self.ny + y1]
                parts.append(self.rowids[m0:m1])
                for s, e in ((a, m0), (m1, b)):
                    parts.append(self._refine(s, e, xmin, ymin, xmax, ymax))
            else:
                parts.append(self._refine(a, b, xmin, ymin, xmax, ymax))
        out = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
        return np.sort(out)

    def column_spans(self, xmin: float, ymin: float, xmax: float, ymax: float) -> np.ndarray:
        """[a, b) slices of the points (in cell order) of the cells the box touches, one per
        cell column: every point inside the box is in one of them (histograms refine them)."""
        if len(self.rowids) == 0 or xmin > xmax or ymin > ymax:
            return np.zeros((0, 2), np.int64)
        x0, x1 = self._span(self.bx, xmin, xmax)
        y0, y1 = self._span(self.by, ymin, ymax)
        if x0 > x1 or y0 > y1:
            return np.zeros((0, 2), np.int64)
        cols = np.arange(x0, x1 + 1, dtype=np.int64) * self.ny
        return np.stack([self.offsets[cols + y0], self.offsets[cols + y1 + 1]], axis=1).astype(np.int64)

    def _refine(self, a: int, b: int, xmin: float, ymin: float, xmax: float, ymax: float) -> np.ndarray:
        x, y = self.x[a:b], self.y[a:b]
        return self.rowids[a:b][(x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)]

    @staticmethod
    def _span(bounds: np.ndarray, lo: float, hi: float) -> tuple[int, int]:
        a = max(int(np.searchsorted(bounds, lo, "right")) - 1, 0)
        b = int(np.searchsorted(bounds, hi, "right")) - 1
        return a, b

    @staticmethod
    def _inside(bounds: np.ndarray, c: int, lo: float, hi: float) -> bool:
        """Whether cell column/row ``c`` lies entirely within [lo, hi] on its axis."""
        if c + 1 >= len(bounds):
            return False  # the last cell is open-ended
        return bool(bounds[c] >= lo and bounds[c + 1] <= hi)
