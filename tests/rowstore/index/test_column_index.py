"""Index path == vectorized filter path, on random data and random predicates (RFC 0002)."""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings, strategies as st

from rowstore.index.column_structures import AxisIndex, ValueIndex, ids_of
from rowstore.reads.predicates import Interval

OPS = ["=", "<", "<=", ">", ">="]
PC = {"=": pc.equal, "<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}


def rowids(n, seg=7):
    return (np.uint64(seg) << np.uint64(32)) | np.arange(n, dtype=np.uint64)


@settings(max_examples=80, deadline=None)
@given(data=st.lists(st.integers(-1000, 1000), min_size=0, max_size=400), op=st.sampled_from(OPS),
       v=st.integers(-1100, 1100), buckets=st.sampled_from([1, 3, 16, 256]), as_float=st.booleans())
def test_scalar_predicates_match_pyarrow(data, op, v, buckets, as_float):
    vals = np.array(data, np.float64 if as_float else np.int64)
    ids = rowids(len(vals))
    idx = AxisIndex(vals, vals, ids, buckets)
    got = sorted(ids_of(idx.query(Interval.from_op(op, v))).tolist())
    want = ids[np.asarray(PC[op](pa.array(vals), v).to_numpy(zero_copy_only=False), bool)] if len(vals) else []
    assert got == sorted(np.asarray(want).tolist())


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 500), seed=st.integers(0, 10**6), q=st.tuples(*[st.floats(-200, 200)] * 4))
def test_bbox_on_points_and_boxes_matches_brute_force(n, seed, q):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(0, 60, n), rng.normal(0, 60, n)
    w, h = rng.exponential(20, n), rng.exponential(20, n)
    xmin, xmax = min(q[0], q[2]), max(q[0], q[2])
    ymin, ymax = min(q[1], q[3]), max(q[1], q[3])
    ids = rowids(n)
    qx, qy = Interval(xmin, xmax), Interval(ymin, ymax)
    # points: inside the box, edges inclusive
    got = AxisIndex(x, x, ids).query(qx) & AxisIndex(y, y, ids).query(qy)
    want = ids[(x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)]
    assert sorted(ids_of(got).tolist()) == sorted(want.tolist())
    # boxes [x, x+w] x [y, y+h]: those overlapping the query box (overlapping ranges are broken down)
    got = AxisIndex(x, x + w, ids, 32).query(qx) & AxisIndex(y, y + h, ids, 32).query(qy)
    want = ids[(x + w >= xmin) & (x <= xmax) & (y + h >= ymin) & (y <= ymax)]
    assert sorted(ids_of(got).tolist()) == sorted(want.tolist())


def test_value_index_eq_ne():
    vals = np.array(["a", "b", "a", "c", "b", "a"], object)
    ids = rowids(6)
    vi = ValueIndex(vals, ids)
    assert ids_of(vi.eq("a")).tolist() == ids[[0, 2, 5]].tolist()
    assert ids_of(vi.ne("a")).tolist() == ids[[1, 3, 4]].tolist()
    assert len(vi.eq("zzz")) == 0


def test_selective_bbox_touches_few_buckets():
    n = 200_000
    rng = np.random.default_rng(1)
    x, y = rng.random(n) * 1000, rng.random(n) * 1000
    ids = rowids(n)
    ax, ay = AxisIndex(x, x, ids), AxisIndex(y, y, ids)
    got = ax.query(Interval(100, 131.6)) & ay.query(Interval(500, 531.6))  # ~0.1%
    want = ids[(x >= 100) & (x <= 131.6) & (y >= 500) & (y <= 531.6)]
    assert sorted(ids_of(got).tolist()) == sorted(want.tolist()) and 50 < len(got) < 400


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 600), seed=st.integers(0, 10**6), q=st.tuples(*[st.floats(-250, 250)] * 4),
       g=st.sampled_from([1, 2, 7, 64]))
def test_grid_bbox_matches_brute_force(n, seed, q, g):
    from rowstore.index.column_structures import GridIndex

    rng = np.random.default_rng(seed)
    x, y = np.round(rng.normal(0, 80, n)), rng.normal(0, 80, n)  # rounded x: ties on cell bounds
    ids = rowids(n)
    xmin, xmax = min(q[0], q[2]), max(q[0], q[2])
    ymin, ymax = min(q[1], q[3]), max(q[1], q[3])
    got = GridIndex(x, y, ids, g).query(xmin, ymin, xmax, ymax)
    want = ids[(x >= xmin) & (x <= xmax) & (y >= ymin) & (y <= ymax)]
    assert got.tolist() == sorted(want.tolist())
