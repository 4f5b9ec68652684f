"""Column-index runs built on demand, within the node's budget (rowstore/index/column_cache.py,
RFC 0014, "What is left"): a partition opens without reading its column runs; reads build the runs they
need; with a budget smaller than one run every answer is the same, the least recently used run
dropped and built again."""
import gc

import numpy as np
import pytest

from rowstore.db.read.aggregate import PositionsOf
from rowstore.index.column_cache import RunCache
from rowstore.index.column_index import PartitionColumns
from rowstore.index.column_pages import PagedRun
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows

N = 3_000


async def _loaded(w: TablesWorld):
    db = await w.start()
    await db.create_table("m", SCHEMA, indexes=["name", "v", "loc"])
    for a in range(0, N, 500):  # several checkpoints: several runs a column
        await db.upsert("m", rows(range(a, a + 500), seed=a))
        await db.checkpoint()
    return db


async def _answers(db) -> tuple:
    eq, _ = await db.query("m", where=[["name", "=", "name-3"]], columns=["id"], limit=None)
    rng, _ = await db.query("m", where=[["v", ">", 40.0]], columns=["id"], limit=None)
    box, _ = await db.query("m", bbox={"column": "loc", "xmin": 10, "ymin": 10, "xmax": 30, "ymax": 40},
                            columns=["id"], limit=None)
    agg, _, _ = await db.aggregate("m", None, [{"fn": "count"}, {"fn": "mean", "column": "v"}],
                                where=[["name", "=", "name-5"]])
    return (sorted(eq.column("id").to_pylist()), sorted(rng.column("id").to_pylist()),
            sorted(box.column("id").to_pylist()), agg.to_pylist())


async def test_a_partition_opens_without_reading_its_column_runs(monkeypatch):
    w = TablesWorld(2, column_cache_bytes=64 << 20)
    db = await _loaded(w)
    want = await _answers(db)
    reads, opens = [], []
    real, real_open = PartitionColumns.run_data, PagedRun.open.__func__

    async def counted(self, inode):
        reads.append(inode)
        return await real(self, inode)

    async def opened(cls, col, read, size, where):
        opens.append(where)
        return await real_open(cls, col, read, size, where)
    monkeypatch.setattr(PartitionColumns, "run_data", counted)
    monkeypatch.setattr(PagedRun, "open", classmethod(opened))
    w.crash()
    db = await w.start()  # a restart: the runs are named, not read
    assert reads == [] and opens == []
    assert db.column_runs.bytes == 0
    assert await _answers(db) == want
    assert opens and reads == []  # each run's fence read once a read needed it; no run read whole
    built = len(opens)
    assert await _answers(db) == want
    assert len(opens) == built  # and kept


@pytest.mark.parametrize("budget", [1, 64 << 10])
async def test_answers_are_the_same_within_any_budget(budget):
    w = TablesWorld(2)
    db = await _loaded(w)
    want = await _answers(db)
    w.crash()
    w.cfg = type(w.cfg)(**{**w.cfg.__dict__, "column_cache_bytes": budget})
    db = await w.start()
    for _ in range(2):
        assert await _answers(db) == want
        assert len(db.column_runs) == 1 if budget == 1 else db.column_runs.bytes <= budget
    assert db.column_runs.stats["evicted"] > 0
    gc.collect()  # nor do the aggregates' positions of a run's rowids outlive its eviction
    assert len(db.aggregator._maps) <= (1 if budget == 1 else len(db.column_runs))
    await db.upsert("m", rows(range(N, N + 400), seed=9))  # and through a checkpoint and a merge
    await db.checkpoint()
    await db.checkpoint()
    want2, _ = await db.query("m", where=[["name", "=", "name-3"]], columns=["id"], limit=None)
    assert sorted(want2.column("id").to_pylist()) == sorted(
        [i for i in range(N + 400) if f"name-{i % 13}" == "name-3"])


async def test_concurrent_misses_of_one_run_build_it_once():
    cache, calls = RunCache(1 << 20), []

    async def build():
        calls.append(1)
        return np.zeros(10), 80
    import asyncio
    got = await asyncio.gather(*[cache.get("k", build) for _ in range(5)])
    assert len(calls) == 1 and all(g is got[0] for g in got) and cache.bytes == 80


def test_positions_are_kept_while_their_rowids_live_and_no_longer():
    maps = PositionsOf()
    ids = np.array([3, 5, 9, 40], np.uint64)
    p = maps(ids)
    assert maps(ids) is p and p.of(np.array([5, 6, 40], np.uint64)).tolist() == [1, -1, 3]
    other = np.array([1, 2], np.uint64)
    assert maps(other) is not p and len(maps) == 2
    del ids
    gc.collect()
    assert len(maps) == 1


async def test_runs_of_version_1_still_answer_beside_version_2(monkeypatch):
    """A partition whose runs were written as version 1 (by the code before version 2) opens
    and answers as before; the runs written since are version 2; both answer together."""
    import rowstore.index.column_index as ci
    from rowstore.index.column_index import ColumnRun, _ipc_bytes
    from rowstore.index.column_kinds import index_kind
    w = TablesWorld(2)
    with monkeypatch.context() as m:  # the version-1 writer
        m.setattr(ci, "encode_run", lambda col, rowids, values: _ipc_bytes(col, index_kind(col), rowids, values))
        db = await _loaded(w)
        want = await _answers(db)
    w.crash()
    db = await w.start()
    assert await _answers(db) == want
    kinds = {type(r) for r, _ in db.column_runs._runs.values()}
    assert ColumnRun in kinds and PagedRun not in kinds  # version 1 read, built whole
    await db.upsert("m", rows(range(N, N + 500), seed=11))
    await db.checkpoint()  # a version-2 run beside them
    eq, _ = await db.query("m", where=[["name", "=", "name-3"]], columns=["id"], limit=None)
    assert sorted(eq.column("id").to_pylist()) == [i for i in range(N + 500) if f"name-{i % 13}" == "name-3"]
    assert {ColumnRun, PagedRun} <= {type(r) for r, _ in db.column_runs._runs.values()}
    agg, _, _ = await db.aggregate("m", None, [{"fn": "count"}], where=[["name", "=", "name-5"]])
    assert agg.to_pylist()[0]["p0"] == sum(1 for i in range(N + 500) if i % 13 == 5)
