"""Grid histograms (docs/rfcs/0012-aggregates.md): the grid's column, bounding box and cell
counts checked, and the points (a box: its centre) counted per cell, edges inclusive."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from rowstore.errors import QueryError
from rowstore.reads.predicates import BBox, parse_bbox
from rowstore.schema import SchemaVersion
from rowstore.types import Kind

MAX_CELLS = 4096  # per axis


@dataclass(frozen=True)
class Grid:
    box: BBox
    nx: int
    ny: int


def parse_grid(schema: SchemaVersion, column: object, bbox: object, cells: object) -> Grid:
    """The histogram's column, bounding box and cell counts, checked."""
    if not isinstance(bbox, dict) or set(bbox) != {"xmin", "ymin", "xmax", "ymax"}:
        raise QueryError('"bbox" must be an object {xmin, ymin, xmax, ymax}')
    if not isinstance(column, str):
        raise QueryError('"column" must name a point or box column')
    box = parse_bbox(schema, {"column": column, **bbox})
    assert box is not None  # a bbox object was given
    if not isinstance(cells, list) or len(cells) != 2 or not all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_CELLS for n in cells):
        raise QueryError(f'"cells" must be [nx, ny], each 1..{MAX_CELLS}, not {str(cells)[:60]}')
    return Grid(box, cells[0], cells[1])


def cell_counts(values: pa.Array, g: Grid) -> np.ndarray:
    """Counts per cell (``ny`` rows of ``nx``; row 0 at ``ymin``) of the points (a box: its
    centre) inside the box, edges inclusive; a point on an inner edge goes to the higher
    cell, one on ``xmax``/``ymax`` to the last."""
    b = g.box
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    ok = values.is_valid().to_numpy(zero_copy_only=False)
    names = [values.type.field(i).name for i in range(values.type.num_fields)]
    f = {n: values.field(n).to_numpy(zero_copy_only=False) for n in names}
    if b.column.type.kind == Kind.POINT:
        x, y = f["x"], f["y"]
    else:
        x, y = (f["xmin"] + f["xmax"]) / 2, (f["ymin"] + f["ymax"]) / 2
    with np.errstate(invalid="ignore"):
        ok &= (x >= b.xmin) & (x <= b.xmax) & (y >= b.ymin) & (y <= b.ymax)
    ix, iy = _cells_of(x[ok], b.xmin, b.xmax, g.nx), _cells_of(y[ok], b.ymin, b.ymax, g.ny)
    return np.bincount(iy * g.nx + ix, minlength=g.nx * g.ny).astype(np.int64).reshape(g.ny, g.nx)


def cell_edges(lo: float, hi: float, n: int) -> np.ndarray:
    """The ``n + 1`` edges of one axis's cells; the first and last cells are closed by the
    bbox, so their outer edges are -inf and inf."""
    edges = lo + (hi - lo) * (np.arange(0, n + 1, dtype=np.float64) / n)
    edges[0], edges[-1] = -np.inf, np.inf
    return edges


def _cells_of(v: np.ndarray, lo: float, hi: float, n: int) -> np.ndarray:
    """The cell of each value: the number of inner edges ``lo + (hi-lo)·i/n`` at or below it
    (a guess by division, corrected by one where rounding put it across its edge)."""
    edges = cell_edges(lo, hi, n)
    guess = np.floor((v - lo) * (n / (hi - lo))) if hi > lo else np.full(len(v), n - 1.0)
    c: npt.NDArray[np.int64] = np.clip(np.nan_to_num(guess, nan=0.0), 0, n - 1).astype(np.int64)
    c -= v < edges[c]
    c += v >= edges[c + 1]
    return c
