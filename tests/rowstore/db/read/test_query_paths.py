"""The column-index path and the scan path give identical answers (RFC 0002's requirement).

Two tables receive the same random rows (nulls included) and the same deletes; one
indexes every indexable column, the other none. Random checkpoints put part of the
data into runs (bitmaps, buckets, grid) and leave part in memtables. Every random
predicate, and every random bounding box, must select the same rows from both.
"""
import asyncio
import uuid

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings

from rowstore.reads.predicates import batch_mask, parse_bbox, parse_where
from tests.rowstore.tables_world import TablesWorld

SCHEMA = ("id int64 primary key, i int32, f float64, t timestamp, d date, s string, b bool, u uuid, "
          "r range<int64>, rf range<float64>, bx box, p point")
INDEXED = ["i", "f", "t", "d", "s", "b", "u", "r", "rf", "bx", "p"]
UUIDS = [uuid.UUID(int=i * 7919) for i in range(6)]


def make_rows(rng: np.random.Generator, ids: np.ndarray) -> pa.Table:
    n = len(ids)

    def nulls(arr, p=0.15):
        return pa.array(arr, mask=rng.random(n) < p) if not isinstance(arr, pa.Array) else arr

    def rng_range(_lo_hi, typ):
        lo = rng.integers(-20, 20, n) if typ == "int" else rng.uniform(-20, 20, n).round(1)
        hi = lo + (rng.integers(0, 10, n) if typ == "int" else rng.uniform(0, 10, n).round(1))
        base = pa.int64() if typ == "int" else pa.float64()
        kids = [pa.array(lo, base, mask=rng.random(n) < 0.1), pa.array(hi, base, mask=rng.random(n) < 0.1),
                pa.array(rng.random(n) < 0.5), pa.array(rng.random(n) < 0.5)]
        return pa.StructArray.from_arrays(kids, names=["lower", "upper", "lower_inclusive", "upper_inclusive"],
                                          mask=pa.array(rng.random(n) < 0.1))

    x0, y0 = rng.integers(0, 20, n).astype(float), rng.integers(0, 20, n).astype(float)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "i": nulls(rng.integers(-50, 50, n).astype(np.int32)),
        "f": nulls(np.where(rng.random(n) < 0.05, np.nan, rng.integers(-30, 30, n) / 2.0)),
        "t": pa.array(rng.integers(0, 100, n) * 1_000_000, pa.timestamp("us", tz="UTC"), mask=rng.random(n) < 0.1),
        "d": pa.array(rng.integers(0, 40, n).astype(np.int32), pa.date32(), mask=rng.random(n) < 0.1),
        "s": pa.array([f"v{k}" for k in rng.integers(0, 8, n)], mask=rng.random(n) < 0.1),
        "b": pa.array(rng.random(n) < 0.5, mask=rng.random(n) < 0.1),
        "u": pa.array([UUIDS[k].bytes for k in rng.integers(0, 6, n)], pa.binary(16), mask=rng.random(n) < 0.1),
        "r": rng_range(None, "int"),
        "rf": rng_range(None, "float"),
        "bx": pa.StructArray.from_arrays([pa.array(x0), pa.array(y0), pa.array(x0 + rng.integers(0, 6, n)),
                                          pa.array(y0 + rng.integers(0, 6, n))],
                                         names=["xmin", "ymin", "xmax", "ymax"], mask=pa.array(rng.random(n) < 0.1)),
        "p": pa.StructArray.from_arrays([pa.array(rng.integers(0, 25, n).astype(float)),
                                         pa.array(rng.integers(0, 25, n).astype(float))],
                                        names=["x", "y"], mask=pa.array(rng.random(n) < 0.1)),
    })


TERMS = st.one_of(
    st.tuples(st.just("i"), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.integers(-55, 55)),
    st.tuples(st.just("f"), st.sampled_from(["=", "!=", "<", "<=", ">", ">="]),
              st.integers(-32, 32).map(lambda v: v / 2)),
    st.tuples(st.just("t"), st.sampled_from(["=", "<", ">="]), st.integers(0, 100).map(lambda v: v * 1_000_000)),
    st.tuples(st.just("t"), st.just(">"), st.just("1970-01-01T00:00:50Z")),
    st.tuples(st.just("d"), st.sampled_from(["=", "<=", ">"]), st.integers(0, 40).map(
        lambda v: str(np.datetime64("1970-01-01") + v))),
    st.tuples(st.just("s"), st.sampled_from(["=", "!=", "<", ">="]), st.sampled_from([f"v{k}" for k in range(9)])),
    st.tuples(st.just("b"), st.sampled_from(["=", "!="]), st.booleans()),
    st.tuples(st.just("u"), st.sampled_from(["=", "!="]), st.sampled_from([str(u) for u in UUIDS])),
    st.tuples(st.just("r"), st.sampled_from(["=", "<", "<=", ">", ">="]), st.integers(-25, 35)),
    st.tuples(st.just("rf"), st.sampled_from(["=", "<", ">="]), st.integers(-50, 70).map(lambda v: v / 2)),
).map(list)
BOXES = st.tuples(st.sampled_from(["p", "bx"]), st.integers(0, 25), st.integers(0, 25), st.integers(0, 12),
                  st.integers(0, 12)).map(lambda b: {"column": b[0], "xmin": b[1], "ymin": b[2],
                                                      "xmax": b[1] + b[3], "ymax": b[2] + b[4]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(1, 4), queries=st.lists(
    st.tuples(st.lists(TERMS, max_size=2), st.one_of(st.none(), BOXES)), min_size=1, max_size=6))
def test_index_and_scan_paths_agree(seed, rounds, queries):
    asyncio.run(_agree(seed, rounds, queries))


async def _agree(seed, rounds, queries):
    rng = np.random.default_rng(seed)
    db = await TablesWorld(partitions=2).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    await db.create_table("b", SCHEMA)
    for _ in range(rounds):
        rows = make_rows(rng, rng.choice(300, size=int(rng.integers(20, 120)), replace=False))
        dels = rng.choice(300, size=5, replace=False).tolist()
        for name in ("a", "b"):
            await db.upsert(name, rows)
            await db.delete(name, dels)
        if rng.random() < 0.6:
            await db.checkpoint()
    everything, _ = await db.read_all("b")
    d = await db.describe("b")
    for where, bbox in queries:
        ta, _ = await db.query("a", where=where, bbox=bbox, limit=None)
        tb, _ = await db.query("b", where=where, bbox=bbox, limit=None)
        assert _norm(ta) == _norm(tb), (where, bbox)
        # and both equal a filter of all visible rows with the exact predicates
        m = batch_mask(everything.combine_chunks().to_batches()[0], parse_where(d.schema, where),
                       parse_bbox(d.schema, bbox)) if everything.num_rows else np.zeros(0, bool)
        assert ta.column("id").to_pylist() == everything.column("id").filter(pa.array(m)).to_pylist()
        lim = int(rng.integers(1, 12))  # a limit: the first rows by key (the index path reads keys first)
        assert _norm((await db.query("a", where=where, bbox=bbox, limit=lim))[0]) == _norm(ta)[:lim]


def _norm(t: pa.Table) -> list:
    """Rows with NaN made comparable (NaN != NaN)."""
    return [{k: ("NaN" if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in t.to_pylist()]


def test_a_limited_query_reads_other_columns_only_of_its_answer():
    """Many indexed matches and a small limit: the key and the terms' columns are read for
    every candidate, the other columns only for the ``limit`` rows answered (in key order);
    the answer is the unlimited one's first rows."""
    asyncio.run(_limited())


async def _limited():
    from unittest import mock

    import rowstore.db.read.reader as reader

    rng = np.random.default_rng(7)
    db = await TablesWorld(partitions=2).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    await db.upsert("a", make_rows(rng, rng.permutation(600)))
    await db.checkpoint()
    await db.upsert("a", make_rows(rng, rng.choice(600, 100, replace=False)))  # newer versions: superseded ones
    everything, _ = await db.query("a", where=[["s", "!=", "v3"]], limit=None)
    calls = []
    real = reader.fetch

    async def spy(store, rowids, schemas, target, where=""):
        calls.append((len(rowids), len(target.columns)))
        return await real(store, rowids, schemas, target, where)
    with mock.patch.object(reader, "fetch", spy):
        got, _ = await db.query("a", where=[["s", "!=", "v3"]], limit=7)
    assert _norm(got) == _norm(everything)[:7]
    assert calls and all(n <= 7 for n, cols in calls if cols == 12)  # every column: the answer's rows only
    assert any(n > 7 and cols == 2 for n, cols in calls)  # the key and s: every candidate
