"""The rowid kernels of aggregates and histograms against numpy doing the same thing the slow
way: positions from a binary search per row, set membership from sorted arrays, cells from
``cell_counts``."""
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import given, settings

from rowstore.index.rowid_kernels import Positions, RowidSet, bin_points, match_sorted
from rowstore.reads.grids import Grid, cell_counts, cell_edges
from rowstore.reads.predicates import BBox
from rowstore.schema import Column
from rowstore.types import ColumnType

SEGMENTS = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=4)


def rowids(draw_segs, locals_, rng) -> np.ndarray:
    """Sorted unique rowids over a few segments (high ones too: segment ids use all 32 bits)."""
    segs = np.array(draw_segs, np.uint64)[rng.integers(0, len(draw_segs), len(locals_))]
    ids = (segs << np.uint64(32)) | np.asarray(locals_, np.uint64)
    return np.unique(ids)


# a side table's rowids, and rowids to look for in it: about half of them, and others
HAY_AND_PROBES = {"segs": SEGMENTS, "hay": st.lists(st.integers(0, 5000), max_size=300),
                  "extra": st.lists(st.integers(0, 5000), max_size=100), "seed": st.integers(0, 2**32 - 1)}


def hay_and_probes(segs, hay, extra, seed) -> tuple:
    rng = np.random.default_rng(seed)
    h = rowids(segs, hay, rng)
    return rng, h, np.concatenate([h[rng.random(len(h)) < 0.5], rowids(segs, extra, rng)])


@settings(max_examples=200, deadline=None)
@given(**HAY_AND_PROBES)
def test_match_sorted_is_a_binary_search_per_row(segs, hay, extra, seed):
    _, h, pool = hay_and_probes(segs, hay, extra, seed)
    wanted = np.unique(pool)
    got = match_sorted(h, wanted)
    pos = np.searchsorted(h, wanted)
    found = np.zeros(len(wanted), bool)
    if len(h):
        found = (pos < len(h)) & (h[np.minimum(pos, len(h) - 1)] == wanted)
    assert got.tolist() == np.where(found, pos, -1).tolist()


@settings(max_examples=150, deadline=None)
@given(segs=SEGMENTS, members=st.lists(st.integers(0, 3000), max_size=200),
       points=st.lists(st.integers(0, 3000), max_size=200),
       nx=st.integers(1, 7), ny=st.integers(1, 7), box=st.tuples(st.integers(-2, 6), st.integers(-2, 6),
       st.integers(0, 8), st.integers(0, 8)), seed=st.integers(0, 2**32 - 1))
def test_bin_points_counts_each_member_once_in_its_cell(segs, members, points, nx, ny, box, seed):
    """Points of two sources (a memtable piece and the run built from it hold the same rows)
    count once each, only when in the set and the box, in the cell ``cell_counts`` gives."""
    rng = np.random.default_rng(seed)
    inset = rowids(segs, members, rng)
    ids = np.unique(np.concatenate([inset[rng.random(len(inset)) < 0.6], rowids(segs, points, rng)]))
    xy = {int(r): (float(rng.integers(-3, 12)), float(rng.integers(-3, 12))) for r in ids}
    x = np.array([xy[int(r)][0] for r in ids])
    y = np.array([xy[int(r)][1] for r in ids])
    b = BBox(Column(9, "p", ColumnType.parse("point")), box[0], box[1], box[0] + box[2], box[1] + box[3])
    counts = np.zeros((ny, nx), np.int64)
    s = RowidSet(inset)
    cut = len(ids) // 2
    spans = np.array([[0, max(cut, 1) if len(ids) else 0], [cut // 2, len(ids)]], np.int64)  # overlapping spans
    corners = np.array([b.xmin, b.ymin, b.xmax, b.ymax])
    bin_points(ids, x, y, spans, s.segs, s.base, s.bits, corners, cell_edges(b.xmin, b.xmax, nx),
               cell_edges(b.ymin, b.ymax, ny), counts)
    keep = np.isin(ids, inset)
    pts = pa.StructArray.from_arrays([pa.array(x[keep]), pa.array(y[keep])], names=["x", "y"])
    assert counts.tolist() == cell_counts(pts, Grid(b, nx, ny)).tolist()
    assert s.bits.sum() == len(inset) - int(counts.sum())  # what counted was taken out of the set


def test_a_copy_of_a_set_is_taken_from_alone():
    s = RowidSet(np.array([(7 << 32) | 1, (7 << 32) | 5, (9 << 32) | 0], np.uint64))
    c = s.copy()
    counts = np.zeros((1, 1), np.int64)
    ids = np.array([(7 << 32) | 5, (9 << 32) | 0, (8 << 32) | 0, (7 << 32) | 6], np.uint64)
    bin_points(ids, np.zeros(4), np.zeros(4), np.array([[0, 4]], np.int64), c.segs, c.base, c.bits,
               np.array([-1.0, -1.0, 1.0, 1.0]), cell_edges(-1, 1, 1), cell_edges(-1, 1, 1), counts)
    assert counts.tolist() == [[2]]  # (8, 0) has no segment in the set, (7, 6) is past its last local id
    assert int(s.bits.sum()) == 3 and int(c.bits.sum()) == 1


@settings(max_examples=200, deadline=None)
@given(**HAY_AND_PROBES)
def test_positions_and_membership_are_a_search_per_row(segs, hay, extra, seed):
    rng, h, pool = hay_and_probes(segs, hay, extra, seed)
    probe = np.concatenate([pool, np.array([(2**32 - 1) << 32, 0], np.uint64)])  # a segment of none, and rowid 0
    rng.shuffle(probe)  # any order
    where = {int(r): i for i, r in enumerate(h)}
    assert Positions(h).of(probe).tolist() == [where.get(int(r), -1) for r in probe]
    assert RowidSet(h).contains(probe).tolist() == [int(r) in where for r in probe]
