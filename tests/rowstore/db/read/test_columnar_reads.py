"""A node's reads equal on row-wise and columnar segments of the same rows (RFC 0014).

Two tables' worth of worlds take the same rows, updates and deletes in rounds, each round
sealed and offloaded — one writing version 1 (row-wise), one version 2 (columnar, in groups
of a few rows so that statistics skip groups) — and every read path is compared at every
round's snapshot: point gets, ordered scans, queries with `where` terms on any column and
bboxes, aggregates and histograms; then after garbage collection, and on a world whose
row-wise segments the collector rewrites columnar.
"""
import asyncio
import contextlib
from unittest import mock

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rowstore.segments.columnar_write as columnar_write
from rowstore.db.background.gc import GcConfig
from rowstore.segments.store import SegState
from tests.rowstore.db.read.test_query_paths import BOXES, SCHEMA, TERMS, _norm, make_rows
from terrafs.backends.memory import MemoryObjectStore
from tests.rowstore.tables_world import TablesWorld

AGGS = [{"fn": "count"}, {"fn": "sum", "column": "i"}, {"fn": "min", "column": "f"}, {"fn": "max", "column": "t"},
        {"fn": "count", "column": "s"}]


@contextlib.contextmanager
def small_groups():
    """Groups of 40 rows and pages of a few hundred bytes: many groups and pages per segment
    (readers take both from the segment's own metadata)."""
    with mock.patch.object(columnar_write, "GROUP_ROWS", 40), mock.patch.object(columnar_write, "PAGE_BYTES", 256):
        yield


async def _formats(db) -> set[int]:
    return {r.format for r in await db.store.list() if r.state == SegState.OFFLOADED}


def _same_row(x, y) -> bool:
    """Equal rows (NaN equal to NaN), or both absent."""
    if x is None or y is None:
        return x is None and y is None
    return _norm(pa.Table.from_pylist([x])) == _norm(pa.Table.from_pylist([y]))


async def _same(a, b, T, queries, keys):
    many = []
    for db in (a, b):  # a multi-get, cold then hot (rows from blocks or from decoded pages)
        for _ in range(2):
            many.append((await db.reader.get_dicts("t", keys, as_of=T))[1])
    for k, *rows in zip(keys, *many):
        ga, gb = await a.get("t", k, as_of=T), await b.get("t", k, as_of=T)
        assert _same_row(ga, gb), k
        assert all(_same_row(r, ga) for r in rows[:2]) and all(_same_row(r, gb) for r in rows[2:]), (k, ga, gb, rows)
    _, some = await b.reader.get_dicts("t", keys, as_of=T, columns=["f", "id"])
    assert [r if r is None else list(r) for r in some] == [None if g is None else ["f", "id"] for g in many[2]]
    ra, _ = await a.read_all("t", as_of=T)
    rb, _ = await b.read_all("t", as_of=T)
    assert _norm(ra) == _norm(rb)
    for where, bbox in queries:
        qa, _ = await a.query("t", where=where, bbox=bbox, limit=None, as_of=T)
        qb, _ = await b.query("t", where=where, bbox=bbox, limit=None, as_of=T)
        assert _norm(qa) == _norm(qb), (where, bbox)
        qa, _ = await a.query("t", where=where, bbox=bbox, columns=["id", "f"], limit=None, as_of=T)
        qb, _ = await b.query("t", where=where, bbox=bbox, columns=["id", "f"], limit=None, as_of=T)
        assert _norm(qa) == _norm(qb) and qb.column_names == ["id", "f"]
        aa, _, _ = await a.aggregate("t", ["s"], AGGS, where=where, bbox=bbox, as_of=T)
        ab, _, _ = await b.aggregate("t", ["s"], AGGS, where=where, bbox=bbox, as_of=T)
        assert _norm(aa.sort_by("g0")) == _norm(ab.sort_by("g0")), (where, bbox)
        box = {"xmin": 0, "ymin": 0, "xmax": 25, "ymax": 25}
        ha, _, _ = await a.histogram("t", "p", box, [5, 5], where=where, as_of=T)
        hb, _, _ = await b.histogram("t", "p", box, [5, 5], where=where, as_of=T)
        assert np.array_equal(ha, hb)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), rounds=st.integers(2, 4), indexed=st.booleans(),
       queries=st.lists(st.tuples(st.lists(TERMS, max_size=2), st.one_of(st.none(), BOXES)), min_size=2, max_size=4))
def test_reads_equal_on_row_wise_and_columnar_segments(seed, rounds, indexed, queries):
    with small_groups():
        asyncio.run(_property(seed, rounds, indexed, queries))


async def _property(seed, rounds, indexed, queries):
    rng = np.random.default_rng(seed)
    a = await TablesWorld(partitions=2).start()
    b = await TablesWorld(partitions=2, columnar=True).start()
    indexes = ["i", "s", "p"] if indexed else []
    for db in (a, b):
        await db.create_table("t", SCHEMA, indexes=indexes)
    snapshots = []
    for _ in range(rounds):
        rows = make_rows(rng, rng.choice(400, size=int(rng.integers(60, 200)), replace=False))
        dels = rng.choice(400, size=10, replace=False).tolist()
        for db in (a, b):
            await db.upsert("t", rows)
            await db.delete("t", dels)
            await db.checkpoint()
            await db.seal()
            await db.offload()
        snapshots.append(await a.reader.snapshot())
    assert await _formats(a) == {1} and await _formats(b) == {2}
    keys = rng.choice(400, size=25, replace=False).tolist()
    for T in snapshots:
        await _same(a, b, T, queries, keys)
    for db in (a, b):
        db.gc.cfg = GcConfig(min_garbage=0.01, grace_s=0.0)
        await db.collect_garbage()
    assert await _formats(b) == {2}
    await _same(a, b, snapshots[-1], queries, keys)


async def test_the_collector_rewrites_row_wise_segments_columnar():
    """A node that wrote row-wise segments restarts with `segments.columnar` on: a collector
    pass rewrites every row-wise offloaded segment columnar, garbage or not, and every read
    answers the same before and after; a table holds both formats in between."""
    with small_groups():
        await _rewrite()


async def _rewrite():
    rng = np.random.default_rng(5)
    w = TablesWorld(partitions=2)
    db = await w.start()
    await db.create_table("t", SCHEMA, indexes=["i"])
    for r in range(3):
        await db.upsert("t", make_rows(rng, np.arange(r * 100, r * 100 + 150)))
        await db.checkpoint()
        await db.seal()
        await db.offload()
    T = await db.reader.snapshot()
    before, _ = await db.read_all("t", as_of=T)
    q_before, _ = await db.query("t", where=[["i", ">", 10], ["s", "=", "v3"]], limit=None, as_of=T)
    assert await _formats(db) == {1}
    await db.close()
    w.cfg = type(w.cfg)(**{**w.cfg.__dict__, "columnar": True})
    db = await w.start()
    await db.upsert("t", make_rows(rng, np.arange(1000, 1100)))
    await db.checkpoint()
    await db.seal()
    await db.offload()
    assert await _formats(db) == {1, 2}  # both formats in one table
    db.gc.cfg = GcConfig(min_garbage=0.99, grace_s=0.0)  # no segment has that much garbage
    await db.collect_garbage()
    assert await _formats(db) == {2}
    after, _ = await db.read_all("t", as_of=T)
    q_after, _ = await db.query("t", where=[["i", ">", 10], ["s", "=", "v3"]], limit=None, as_of=T)
    assert _norm(after) == _norm(before) and _norm(q_after) == _norm(q_before)
    got = await db.get("t", 120)
    assert got is not None and got["id"] == 120
    await db.close()


class CountingObjects(MemoryObjectStore):
    """The in-memory object store, counting the bytes ranged reads fetch."""

    fetched = 0

    async def get_range(self, key, offset, length):
        got = await super().get_range(key, offset, length)
        self.fetched += len(got)
        return got


async def test_a_where_term_on_an_unindexed_column_skips_groups():
    """Rows of groups whose statistics the term misses are not fetched: a term matching the
    last group's rows fetches a tenth of the bytes a term matching every row does."""
    with small_groups():
        await _skips()


async def _skips():
    objects = CountingObjects()
    w = TablesWorld(partitions=1, columnar=True, objects=objects)
    db = await w.start()
    await db.create_table("t", "id int64 primary key, v int64, pad string")
    n = 400
    await db.upsert("t", pa.table({"id": np.arange(n), "v": np.arange(n) * 10,
                                   "pad": [f"{i:06d}" * 20 for i in range(n)]}))
    await db.checkpoint()
    await db.seal()
    await db.offload()
    await db.query("t", where=[["v", "<", 0]], limit=None)  # opens the segment: its metadata read once
    before = objects.fetched
    got, _ = await db.query("t", where=[["v", ">=", 3950]], limit=None)
    narrow = objects.fetched - before
    assert got.column("id").to_pylist() == [395, 396, 397, 398, 399]
    before = objects.fetched
    every, _ = await db.query("t", where=[["v", ">=", 0]], limit=None)
    wide = objects.fetched - before
    assert every.num_rows == n and 0 < narrow * 5 < wide  # 1 group of 10 read, against all of them
    await db.close()
