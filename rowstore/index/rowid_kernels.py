"""numba kernels for the rowid loops of aggregates and histograms (docs/rfcs/0012-aggregates.md)
that numpy answers only with a binary search per element.

- :func:`match_sorted` finds sorted wanted rowids in a run's rowid-sorted side table by
  galloping from the last match: work grows with the wanted rows and the log of the gap
  between them, not with a full binary search per row.
- :class:`RowidSet` holds a set of rowids as one byte per local id of each segment (rowid =
  segment << 32 | local id), so a point met in a grid cell is checked in O(1) instead of being
  sorted and searched. Counting *takes* the rowid out of the set, so a row held by two sources
  (a memtable and the run being built from it) counts once.
- :func:`bin_points` counts the points of given spans of a grid run (or a memtable piece) that
  are inside the box and in the set, into the histogram's cells, in one pass.

Compiled once and cached on disk (``cache=True``); ``nogil`` so requests run in threads.
"""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

_LOCAL = np.uint64(0xFFFFFFFF)
_U64 = npt.NDArray[np.uint64]
_I64 = npt.NDArray[np.int64]


@numba.njit(cache=True, nogil=True)
def match_sorted(hay: _U64, wanted: _U64) -> _I64:
    """For each of the sorted ``wanted``, its position in the sorted ``hay``, or -1."""
    out = np.full(wanted.shape[0], -1, np.int64)
    n = hay.shape[0]
    j = 0
    for i in range(wanted.shape[0]):
        w = wanted[i]
        if j >= n:
            break
        if hay[j] < w:  # gallop: the first step past w, then a binary search behind it
            step = 1
            while j + step < n and hay[j + step] < w:
                step *= 2
            lo, hi = j + step // 2 + 1, min(j + step, n - 1)
            if hay[hi] < w:
                j = n
                break
            while lo < hi:
                mid = (lo + hi) // 2
                if hay[mid] < w:
                    lo = mid + 1
                else:
                    hi = mid
            j = lo
        if hay[j] == w:
            out[i] = j
    return out


@numba.njit(cache=True, nogil=True)
def _layout(ids: _U64) -> tuple[_U64, _I64]:
    """(segments, each one's first slot with one past the last) of sorted rowids: a slot per local id
    up to the largest one present."""
    nseg = 0
    last = np.uint64(0)
    for i in range(ids.shape[0]):
        s = ids[i] >> np.uint64(32)
        if i == 0 or s != last:
            nseg += 1
            last = s
    segs = np.empty(nseg, np.uint64)
    sizes = np.zeros(nseg, np.int64)
    k = -1
    for i in range(ids.shape[0]):
        s = ids[i] >> np.uint64(32)
        if k < 0 or s != segs[k]:
            k += 1
            segs[k] = s
        sizes[k] = np.int64(ids[i] & np.uint64(0xFFFFFFFF)) + 1  # sorted: the last is the largest
    base = np.zeros(nseg + 1, np.int64)
    for k in range(nseg):
        base[k + 1] = base[k] + sizes[k]
    return segs, base


@numba.njit(cache=True, nogil=True)
def _scatter(ids: _U64, segs: _U64, base: _I64, table: np.ndarray, values: np.ndarray) -> None:
    """``table[slot of ids[i]] = values[i]`` for sorted ``ids`` (segments walked in order)."""
    k = 0
    for i in range(ids.shape[0]):
        s = ids[i] >> np.uint64(32)
        while segs[k] != s:
            k += 1
        table[base[k] + np.int64(ids[i] & np.uint64(0xFFFFFFFF))] = values[i]


@numba.njit(cache=True, nogil=True)
def _lookup(segs: _U64, base: _I64, table: np.ndarray, ids: _U64, missing: np.generic) -> np.ndarray:
    """``table`` at the slot of each of ``ids`` (any order), ``missing`` where it has none."""
    out = np.full(ids.shape[0], missing, table.dtype)
    for i in range(ids.shape[0]):
        j = _slot(segs, base, ids[i])
        if j >= 0:
            out[i] = table[j]
    return out


def _dense(ids: np.ndarray, fill: int, values: np.ndarray) -> tuple[_U64, _I64, np.ndarray]:
    """(segments, their first slot, a table of ``values`` by slot, ``fill`` elsewhere) of sorted rowids."""
    ids = np.ascontiguousarray(ids, np.uint64)
    segs, base = _layout(ids)
    table = np.full(int(base[-1]), fill, values.dtype)
    _scatter(ids, segs, base, table, values)
    return segs, base, table


@numba.njit(inline="always")
def _slot(segs: _U64, base: _I64, rid: np.uint64) -> int:
    """The byte of ``rid`` in the set's layout, or -1 when its segment or local id is outside."""
    s = rid >> np.uint64(32)
    lo, hi = 0, segs.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if segs[mid] < s:
            lo = mid + 1
        else:
            hi = mid
    if lo == segs.shape[0] or segs[lo] != s:
        return -1
    at = base[lo] + np.int64(rid & np.uint64(0xFFFFFFFF))
    return at if at < base[lo + 1] else -1


class RowidSet:
    """Sorted rowids as bytes per local id of each segment (see the module's docstring)."""

    __slots__ = ("segs", "base", "bits")

    def __init__(self, ids: np.ndarray) -> None:
        self.segs, self.base, self.bits = _dense(ids, 0, np.ones(len(ids), np.uint8))

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` is in the set (a byte lookup each)."""
        found: npt.NDArray[np.bool_] = _lookup(self.segs, self.base, self.bits, np.ascontiguousarray(ids, np.uint64),
                                               np.uint8(0)) != 0
        return found

    def copy(self) -> RowidSet:
        """Another set of the same rowids (its own bytes; the layout is shared, never written)."""
        out = object.__new__(RowidSet)
        out.segs, out.base, out.bits = self.segs, self.base, self.bits.copy()
        return out


@numba.njit(cache=True, nogil=True)
def bin_points(rowids: _U64, x: npt.NDArray[np.float64], y: npt.NDArray[np.float64], spans: _I64, segs: _U64,
               base: _I64, bits: npt.NDArray[np.uint8], box: npt.NDArray[np.float64],
               edges_x: npt.NDArray[np.float64], edges_y: npt.NDArray[np.float64], counts: _I64) -> None:
    """Count into ``counts`` (ny × nx) each point of ``spans`` (rows [a, b) of the arrays) that
    lies in ``box`` (xmin, ymin, xmax, ymax; edges inclusive) and whose rowid is in the set,
    taking it out of the set. Cells follow ``reads.grids._cells_of`` exactly: a guess by
    division, corrected by one against the edges (``edges[0]`` = -inf, ``edges[n]`` = inf)."""
    xmin, ymin, xmax, ymax = box[0], box[1], box[2], box[3]
    nx, ny = edges_x.shape[0] - 1, edges_y.shape[0] - 1
    for k in range(spans.shape[0]):
        for i in range(spans[k, 0], spans[k, 1]):
            px, py = x[i], y[i]
            if not (px >= xmin and px <= xmax and py >= ymin and py <= ymax):
                continue
            at = _slot(segs, base, rowids[i])
            if at < 0 or bits[at] == 0:
                continue
            bits[at] = 0
            counts[_cell(py, ymin, ymax, ny, edges_y), _cell(px, xmin, xmax, nx, edges_x)] += 1


@numba.njit(inline="always")
def _cell(v: float, lo: float, hi: float, n: int, edges: npt.NDArray[np.float64]) -> int | np.int64:
    if hi > lo:
        g = np.floor((v - lo) * (n / (hi - lo)))
        c = n - 1 if g > n - 1 else (0 if g < 0 else np.int64(g))
    else:
        c = n - 1
    if v < edges[c]:
        c -= 1
    if v >= edges[c + 1]:
        c += 1
    return c


class Positions:
    """Where each rowid of a sorted side table is, by the same layout as :class:`RowidSet`: a
    run's values for wanted rowids are then found by one lookup each instead of a search."""

    __slots__ = ("segs", "base", "at")

    def __init__(self, ids: np.ndarray) -> None:
        self.segs, self.base, self.at = _dense(ids, -1, np.arange(len(ids), dtype=np.int64))

    def of(self, wanted: np.ndarray) -> np.ndarray:
        """The position of each of ``wanted`` in the side table, or -1."""
        return _lookup(self.segs, self.base, self.at, np.ascontiguousarray(wanted, np.uint64), np.int64(-1))
