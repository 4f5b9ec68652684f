"""Aggregates and histograms from the column index equal a model that decodes every visible
row (docs/rfcs/0012-aggregates.md): random tables with overwrites, deletes, nulls, schema
changes (added, renamed and dropped columns), checkpoints, seals and GC passes that move
every row to a new rowid, checked at several snapshots T."""
import asyncio
import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings

from rowstore.db.background.gc import GcConfig
from rowstore.errors import QueryError
from rowstore.reads.aggregates import finish
from rowstore.reads.grids import MAX_CELLS
from rowstore.reads.predicates import batch_mask, parse_bbox, parse_where
from tests.fixtures.aggregate_model import grouped, same
from tests.rowstore.tables_world import TablesWorld

SCHEMA = "id int64 primary key, g string, k int32, v float64, t timestamp, p point, w int64"
INDEXED = ["g", "k", "v", "t", "p"]
FNS = ["count", "sum", "min", "max", "mean", "count_distinct"]


def make_rows(rng, ids) -> pa.Table:
    n = len(ids)

    def mask(p=0.1):
        return rng.random(n) < p
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "g": pa.array([f"g{x}" for x in rng.integers(0, 5, n)], mask=mask()),
        "k": pa.array(rng.integers(-3, 4, n).astype(np.int32), mask=mask()),
        "v": pa.array(rng.integers(-40, 40, n) / 2.0, mask=mask()),  # halves: sums exact in any order
        "t": pa.array(rng.integers(0, 50, n) * 1_000_000, pa.timestamp("us", tz="UTC"), mask=mask()),
        "p": pa.StructArray.from_arrays([pa.array(rng.integers(0, 20, n).astype(float)),
                                         pa.array(rng.integers(0, 20, n).astype(float))],
                                        names=["x", "y"], mask=pa.array(mask())),
        "w": pa.array(rng.integers(0, 6, n), mask=mask()),
    })


def model(rows: pa.Table, schema, group_by, aggs, where, bbox) -> list:
    """The answer computed row by row from decoded rows."""
    if rows.num_rows:
        rows = rows.filter(pa.array(batch_mask(rows.combine_chunks().to_batches()[0], parse_where(schema, where),
                                               parse_bbox(schema, bbox))))
    return grouped(rows.to_pylist(), group_by, aggs)


def random_request(rng, schema) -> tuple:
    cols = {c.name: c.type.kind.value for c in schema.columns if c.name != "id"}
    keyable = [n for n, k in cols.items() if k in ("string", "int32", "int64", "timestamp", "float64")]
    numbers = [n for n, k in cols.items() if k in ("int32", "int64", "float64")]
    group_by = list(rng.choice(keyable, size=int(rng.integers(0, 3)), replace=False)) if keyable else []
    aggs, seen = [{"fn": "count"}], {"count"}
    for _ in range(int(rng.integers(1, 5))):
        fn = str(rng.choice(FNS))
        pool = numbers if fn in ("sum", "mean") else keyable
        if not pool:
            continue
        c = str(rng.choice(pool))
        if f"{fn}_{c}" not in seen:
            seen.add(f"{fn}_{c}")
            aggs.append({"fn": fn, "column": c})
    where = []
    if "k" in cols and rng.random() < 0.5:
        where.append(["k", str(rng.choice(["=", "<", ">=", "!="])), int(rng.integers(-3, 4))])
    if "w" in cols and rng.random() < 0.3:
        where.append(["w", ">", int(rng.integers(0, 5))])
    bbox = None
    if "p" in cols and rng.random() < 0.4:
        x, y = rng.integers(0, 15, 2)
        bbox = {"column": "p", "xmin": int(x), "ymin": int(y), "xmax": int(x + rng.integers(0, 10)),
                "ymax": int(y + rng.integers(0, 10))}
    return [str(g) for g in group_by], aggs, where, bbox


async def answer(db, group_by, aggs, where, bbox, T):
    p, got_T, stats = await db.aggregate("a", group_by, aggs, where, bbox, as_of=T)
    d = await db.describe("a", T)
    from rowstore.reads.agg_spec import parse_spec
    assert got_T == T
    return finish(p, parse_spec(d.schema, group_by, aggs)).to_pylist(), stats


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(2, 5))
def test_index_path_equals_decoded_rows_at_several_snapshots(seed, rounds):
    asyncio.run(_property(seed, rounds))


async def _property(seed, rounds):
    rng = np.random.default_rng(seed)
    w = TablesWorld(partitions=3, seal_bytes=8192, gc=GcConfig(min_garbage=0.0, grace_s=0.0))
    db = await w.start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    stamps = []
    for r in range(rounds):
        fresh = make_rows(rng, rng.choice(200, size=int(rng.integers(10, 80)), replace=False))
        res = await db.upsert("a", _conformed(fresh, (await db.describe("a")).schema))
        stamps.append(res.commit_ts)
        stamps.append((await db.delete("a", rng.choice(200, size=6, replace=False).tolist())).commit_ts)
        step = rng.random()
        if step < 0.25:
            await db.checkpoint()
        elif step < 0.5:
            await db.seal()
            await db.collect_garbage()  # min_garbage 0: every sealed segment's rows move
        if r == 1:
            change = [lambda s: s.add_column("x", "int64"), lambda s: s.rename_column("g", "grp"),
                      lambda s: s.drop_column("w")][int(rng.integers(0, 3))]
            await db.alter_table("a", change)
            stamps.append((await db.upsert("a", _conformed(make_rows(rng, rng.choice(200, 20, replace=False)),
                                                          (await db.describe("a")).schema))).commit_ts)
    for T in [stamps[0], stamps[len(stamps) // 2], stamps[-1]]:
        d = await db.describe("a", T)
        rows, _ = await db.read_all("a", as_of=T)
        for _ in range(4):
            req = random_request(rng, d.schema)
            got, stats = await answer(db, *req, T)
            assert same(got, model(rows, d.schema, *req)), (req, got, model(rows, d.schema, *req))
            used = set(req[0]) | {a.get("column") for a in req[1]} | {t[0] for t in req[2]}
            assert (stats["path"] == "index") == (not used & {"w", "x"}), (req, stats)


def _conformed(t: pa.Table, schema) -> pa.Table:
    """Rows for the schema after a change: renamed, dropped and added columns."""
    names = {c.name for c in schema.columns}
    if "grp" in names:
        t = t.rename_columns(["grp" if n == "g" else n for n in t.column_names])
    t = t.select([n for n in t.column_names if n in names])
    if "x" in names:
        t = t.append_column("x", pa.array(np.arange(t.num_rows) % 3, pa.int64()))
    return t


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nx=st.integers(1, 9), ny=st.integers(1, 9),
       box=st.tuples(st.integers(-2, 15), st.integers(-2, 15), st.integers(0, 12), st.integers(0, 12)),
       filtered=st.booleans())
def test_histogram_equals_decoded_points(seed, nx, ny, box, filtered):
    asyncio.run(_histogram(seed, nx, ny, box, filtered))


async def _histogram(seed, nx, ny, box, filtered):
    """Counted from the grid runs and memtables (overwrites, deletes, checkpoints, seals and GC
    passes that move rows to new rowids) at several T, with and without a ``where``."""
    rng = np.random.default_rng(seed)
    db = await TablesWorld(partitions=2, seal_bytes=8192, gc=GcConfig(min_garbage=0.0, grace_s=0.0)).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    stamps = []
    for _ in range(4):
        stamps.append((await db.upsert("a", make_rows(rng, rng.choice(300, size=100, replace=False)))).commit_ts)
        stamps.append((await db.delete("a", rng.choice(300, size=10, replace=False).tolist())).commit_ts)
        step = rng.random()
        if step < 0.4:
            await db.checkpoint()
        elif step < 0.6:
            await db.seal()
            await db.collect_garbage()
    bb = {"xmin": box[0], "ymin": box[1], "xmax": box[0] + box[2], "ymax": box[1] + box[3]}
    where = [["k", ">=", 0]] if filtered else None
    for T in (stamps[len(stamps) // 2], stamps[-1]):
        counts, got_T, stats = await db.histogram("a", "p", bb, [nx, ny], where, as_of=T)
        rows, _ = await db.read_all("a", as_of=T)
        want = np.zeros((ny, nx), np.int64)
        for r in rows.to_pylist():
            p = r["p"]
            if p is None or (filtered and (r["k"] is None or r["k"] < 0)):
                continue
            if not (bb["xmin"] <= p["x"] <= bb["xmax"] and bb["ymin"] <= p["y"] <= bb["ymax"]):
                continue
            want[_cell(p["y"], bb["ymin"], bb["ymax"], ny), _cell(p["x"], bb["xmin"], bb["xmax"], nx)] += 1
        assert got_T == T
        assert counts.tolist() == want.tolist()
        assert stats["path"] == "index" and stats["rows"] == int(want.sum())


def _cell(v, lo, hi, n) -> int:
    """The model's cell: the last edge at or below v (edges lo + (hi-lo)*i/n), the last cell at hi."""
    i = 0
    while i + 1 < n and v >= lo + (hi - lo) * ((i + 1) / n):
        i += 1
    return i


@pytest.mark.parametrize("req", [
    (["nope"], [{"fn": "count"}]),
    ([], [{"fn": "sum", "column": "g"}]),
    ([], [{"fn": "mean", "column": "t"}]),
    ([], [{"fn": "median", "column": "g"}]),
    ([], [{"fn": "sum"}]),
    ([], []),
    (["p"], [{"fn": "count"}]),
    (["g", "g"], [{"fn": "count"}]),
    (["count"], [{"fn": "count"}]),
])
async def test_bad_aggregates_are_query_errors(req):
    db = await TablesWorld(partitions=1).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    with pytest.raises(QueryError):
        await db.aggregate("a", *req)


@pytest.mark.parametrize("bbox,cells", [
    ({"xmin": 0, "ymin": 0, "xmax": float("nan"), "ymax": 1}, [4, 4]),
    ({"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, [MAX_CELLS + 1, 4]),
    ({"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, [0, 4]),
    ({"xmin": 2, "ymin": 0, "xmax": 1, "ymax": 1}, [4, 4]),
    ({"xmin": 0, "ymin": 0, "xmax": 1}, [4, 4]),
])
async def test_bad_histograms_are_query_errors(bbox, cells):
    db = await TablesWorld(partitions=1).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    with pytest.raises(QueryError):
        await db.histogram("a", "p", bbox, cells)
    with pytest.raises(QueryError):
        await db.histogram("a", "v", {"xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}, [2, 2])


async def test_a_later_snapshot_sees_writes_an_earlier_answer_did_not():
    """The visible rowids kept from one aggregate are never an answer at another T that has
    more rows: writes after it, or writes already in the index beyond its T."""
    rng = np.random.default_rng(5)
    db = await TablesWorld(partitions=1).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    t1 = (await db.upsert("a", make_rows(rng, np.arange(0, 50)))).commit_ts
    t2 = (await db.upsert("a", make_rows(rng, np.arange(50, 80)))).commit_ts

    async def count(T=None):
        p, _, _ = await db.aggregate("a", [], [{"fn": "count"}], as_of=T)
        return p.column("p0").to_pylist()
    assert await count(t1) == [50]
    assert await count(t2) == [80]  # t2's rows were in the index when t1's answer was kept
    assert await count() == [80]
    await db.delete("a", [0, 1])
    assert await count() == [78]
    await db.checkpoint()
    assert await count() == [78] and await count(t1) == [50]


async def test_large_grids_count_their_partitions_one_after_another_with_the_same_answer(monkeypatch):
    import rowstore.db.read.aggregate as agg
    rng = np.random.default_rng(3)
    db = await TablesWorld(partitions=3).start()
    await db.create_table("a", SCHEMA, indexes=INDEXED)
    await db.upsert("a", make_rows(rng, np.arange(300)))
    await db.checkpoint()
    await db.upsert("a", make_rows(rng, np.arange(150, 400)))
    bb = {"xmin": 0, "ymin": 0, "xmax": 19, "ymax": 19}
    parallel, T, _ = await db.histogram("a", "p", bb, [7, 5])
    monkeypatch.setattr(agg, "_PARALLEL_CELLS", 0)
    one_by_one, _, _ = await db.histogram("a", "p", bb, [7, 5], as_of=T)
    assert one_by_one.tolist() == parallel.tolist() and int(parallel.sum()) > 0


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_predicates_left_to_the_value_check_give_the_same_answers(monkeypatch, share):
    """Whether a predicate is answered by a bitmap or only by the exact check of its values
    (``BITMAP_SHARE``: 0 keeps only the most selective bitmap, 1 builds all) changes nothing."""
    import rowstore.db.read.aggregate as agg
    monkeypatch.setattr(agg, "BITMAP_SHARE", share)
    for seed in (11, 12, 13):
        asyncio.run(_property(seed, 4))
