"""Paged column runs (docs/format/column-run.md, version 2): every kind's candidates equal the
in-memory structures' (``ColumnRun``, version 1) on random data, predicates and page sizes;
values by rowid equal the entries; a predicate reads only the pages its fence selects; the
trailer's constants and the Morton order are fixed; damage is a corruption error, never a
wrong answer."""
import asyncio
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rowstore.errors import RowCorruptionError
from rowstore.index.column_index import ColumnRun
from rowstore.index.column_pages import MAGIC, TRAILER, PagedRun, encode_run, is_paged, morton
from rowstore.reads.predicates import BBox, Term
from rowstore.schema import Column
from rowstore.types import ColumnType

OPS = ["=", "<", "<=", ">", ">=", "!="]


def col(t: str) -> Column:
    return Column(3, "c", ColumnType.parse(t))


def opened(c: Column, raw: bytes) -> PagedRun:
    async def read(off: int, n: int) -> bytes:
        return raw[off : off + n]
    return asyncio.run(PagedRun.open(c, read, len(raw), "run 9"))


def cands(run: PagedRun, p) -> np.ndarray | None:
    return asyncio.run(run.candidates(p))


def ids(n: int) -> np.ndarray:
    return (np.uint64(5) << np.uint64(32)) | (np.arange(n, dtype=np.uint64) * np.uint64(3))


def same(c: Column, values: pa.Array, preds: list, page: int) -> PagedRun:
    r = ids(len(values))
    run = opened(c, encode_run(c, r, values, page))
    v1 = ColumnRun(c, r, values)
    for p in preds:
        want, got = v1.candidates(p), cands(run, p)
        assert (want is None) == (got is None), p
        if want is not None:
            assert got.tolist() == want.tolist(), p
    # values of any rowids (some not in the run) are the entries'
    probe = np.sort(np.concatenate([r[::2], r[:3] + np.uint64(1)])) if len(r) else r
    at, vals = asyncio.run(run.values_of(probe))
    hit = np.isin(probe, r)
    assert at.tolist() == np.flatnonzero(hit).tolist()
    assert repr(vals.to_pylist()) == repr(values.take(pa.array(np.searchsorted(r, probe[hit]))).to_pylist())  # NaN too
    return run


PAGES = st.sampled_from([1, 3, 16, 4096])


@settings(max_examples=60, deadline=None)
@given(data=st.lists(st.integers(-50, 50), max_size=300), qs=st.lists(st.tuples(st.sampled_from(OPS),
       st.integers(-60, 60)), min_size=1, max_size=6), t=st.sampled_from(["int64", "int32", "float64", "timestamp",
                                                                          "uint16"]), page=PAGES)
def test_numbers_answer_as_the_axis_index(data, qs, t, page):
    c = col(t)
    if t == "uint16":
        data, qs = [abs(d) for d in data], [(op, abs(v)) for op, v in qs]
    values = pa.array(data, pa.int64()).cast(c.type.arrow()) if t != "float64" else pa.array(
        [float(d) if d % 7 else float("nan") for d in data])  # NaN: indexed, matching nothing
    same(c, values, [Term(c, op, v) for op, v in qs], page)


@settings(max_examples=50, deadline=None)
@given(data=st.lists(st.sampled_from(["", "a", "b", "ab", "zz", "é", "a\x00"]), max_size=200),
       qs=st.lists(st.tuples(st.sampled_from(["=", "!=", "<"]), st.sampled_from(["a", "ab", "q", "", "é"])),
                   min_size=1, max_size=4), page=PAGES)
def test_strings_answer_as_the_value_index(data, qs, page):
    c = col("string")
    same(c, pa.array(data, pa.string()), [Term(c, op, v) for op, v in qs], page)


@settings(max_examples=30, deadline=None)
@given(data=st.lists(st.booleans(), max_size=100), v=st.booleans(), page=PAGES)
def test_booleans_and_binary_answer_as_the_value_index(data, v, page):
    c = col("bool")
    same(c, pa.array(data, pa.bool_()), [Term(c, "=", v), Term(c, "!=", v)], page)
    b = col("binary")
    vals = pa.array([bytes([x]) * (x % 3) for x in range(len(data))], pa.binary())
    same(b, vals, [Term(b, "=", b"\x01"), Term(b, "=", b""), Term(b, "!=", b"\x04\x04")], page)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 400), seed=st.integers(0, 10**6), page=PAGES,
       qs=st.lists(st.tuples(*[st.floats(-200, 200)] * 4), min_size=1, max_size=4))
def test_points_and_boxes_answer_as_the_grid_and_axis_indexes(n, seed, page, qs):
    rng = np.random.default_rng(seed)
    x, y = np.round(rng.normal(0, 60, n)), rng.normal(0, 60, n)
    x[rng.random(n) < 0.05] = np.nan  # a NaN point: in no box
    w, h = rng.exponential(20, n), rng.exponential(20, n)
    p, b = col("point"), col("box")
    boxes = [lambda c, q=q: BBox(c, min(q[0], q[2]), min(q[1], q[3]), max(q[0], q[2]), max(q[1], q[3])) for q in qs]
    same(p, pa.StructArray.from_arrays([pa.array(x), pa.array(y)], ["x", "y"]),
         [f(p) for f in boxes] + [Term(p, "=", 1.0)], page)
    same(b, pa.StructArray.from_arrays([pa.array(x), pa.array(y), pa.array(x + w), pa.array(y + h)],
                                       ["xmin", "ymin", "xmax", "ymax"]), [f(b) for f in boxes], page)


@settings(max_examples=40, deadline=None)
@given(data=st.lists(st.tuples(st.one_of(st.none(), st.integers(-40, 40)), st.one_of(st.none(), st.integers(-40, 40)),
                               st.booleans(), st.booleans()), max_size=200),
       qs=st.lists(st.tuples(st.sampled_from(["=", "<", ">="]), st.integers(-50, 50)), min_size=1, max_size=4),
       t=st.sampled_from(["range<int64>", "range<float64>"]), page=PAGES)
def test_ranges_answer_as_the_axis_index(data, qs, t, page):
    c = col(t)
    e = c.type.arrow().field("lower").type
    arrays = [pa.array([d[i] for d in data], e) if i < 2 else pa.array([d[i] for d in data], pa.bool_())
              for i in range(4)]
    values = pa.StructArray.from_arrays(arrays, ["lower", "upper", "lower_inclusive", "upper_inclusive"])
    same(c, values, [Term(c, op, v) for op, v in qs], page)


def test_a_selective_predicate_reads_only_its_pages():
    c, n = col("float64"), 100_000
    v = np.random.default_rng(1).random(n) * 1000
    run = same(c, pa.array(v), [], 4096)
    run.pages_read = 0
    got = cands(run, Term(c, "<", 10.0))  # 1% of the values: one or two of 25 by-key pages
    assert len(got) == (v < 10).sum() and run.pages_read <= 2
    p = col("point")
    x, y = np.random.default_rng(2).random((2, n)) * 1000
    pts = opened(p, encode_run(p, ids(n), pa.StructArray.from_arrays([pa.array(x), pa.array(y)], ["x", "y"])))
    got = cands(pts, BBox(p, 100, 100, 200, 200))  # 1% of the points, Morton pages around it
    assert len(got) == ((x >= 100) & (x <= 200) & (y >= 100) & (y <= 200)).sum()
    assert pts.pages_read <= 8


def test_known_answers_trailer_and_morton():
    c = col("int64")
    raw = encode_run(c, ids(3), pa.array([7, 5, 9]))
    assert TRAILER.size == 24 and MAGIC == b"TSCRUN" and is_paged(raw[-8:]) and not is_paged(b"ARROW1")
    off, n, _, version, magic = struct.unpack("<QIIH6s", raw[-24:])
    assert (version, magic, off + n) == (2, b"TSCRUN", len(raw) - 24)
    # x's bits at even positions, y's at odd; the extent's corners are 0 and 0xFFFF an axis
    m = morton(np.array([0.0, 1.0, 0.0, 1.0, np.nan]), np.array([0.0, 0.0, 1.0, 1.0, 0.5]), (0.0, 1.0, 0.0, 1.0))
    assert m.tolist() == [0, 0x55555555, 0xAAAAAAAA, 0xFFFFFFFF, 1 << 32]
    assert morton(np.array([0.5]), np.array([0.0]), (0.0, 1.0, 0.0, 1.0)).tolist() == [0x15555555]  # 0x7FFF, truncated


def test_empty_run():
    c = col("string")
    run = opened(c, encode_run(c, np.zeros(0, np.uint64), pa.array([], pa.string())))
    assert run.rows == 0 and cands(run, Term(c, "=", "a")).tolist() == []
    assert asyncio.run(run.values_of(ids(3)))[0].tolist() == [] and asyncio.run(run.whole())[0].tolist() == []


def test_damage_is_a_corruption_error_never_a_wrong_answer():
    c = col("int64")
    raw = encode_run(c, ids(2000), pa.array(np.arange(2000) % 97), 256)
    want = cands(opened(c, raw), Term(c, "=", 5)).tolist()
    rng = np.random.default_rng(0)
    caught = 0
    for at in rng.choice(len(raw), 300, replace=False):
        bad = bytearray(raw)
        bad[at] ^= 1 << int(rng.integers(8))
        try:
            run = opened(c, bytes(bad))
            got = cands(run, Term(c, "=", 5)).tolist()
            whole = asyncio.run(run.whole())
        except RowCorruptionError as e:
            assert "run 9" in str(e)
            caught += 1
            continue
        # a flip inside a page's values the sealed file's block checksum catches (every byte
        # of a run is in a checksummed block); here, below it, a flip may only change a value
        assert got == want or at < opened(c, raw).f.fence_off
        assert len(whole[0]) == 2000
    assert caught > 0
    with pytest.raises(RowCorruptionError, match="version"):
        opened(c, raw[:-8] + struct.pack("<H6s", 3, MAGIC))
    with pytest.raises(RowCorruptionError, match="shorter"):
        opened(c, raw[:10])



@pytest.mark.parametrize("distinct", [7, 1000, 200_000])
def test_the_by_key_order_is_by_key_then_rowid_however_it_is_sorted(distinct):
    """Many string entries, few or many distinct values (the few are sorted through their
    dictionary): the order is the (key, rowid) sort's; entries not in rowid order too."""
    from rowstore.index.column_pages import Keys, key_order
    import pyarrow.compute as pc

    rng = np.random.default_rng(distinct)
    n = 200_000
    vals = pa.array([f"v{x:06d}" for x in rng.integers(0, distinct, n)])
    for rowids in (np.arange(n, dtype=np.uint64) * 5, rng.permutation(n).astype(np.uint64)):
        want = pc.sort_indices(pa.table({"k": vals, "r": pa.array(rowids)}), [("k", "ascending"),
                                                                            ("r", "ascending")]).to_numpy()
        assert np.array_equal(key_order(col("string"), rowids, Keys(vals, vals)), want)
