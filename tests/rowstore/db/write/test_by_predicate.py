"""Deletes by predicate in the engine (docs/rfcs/0016-time-series-aggregates.md §6)
against a model: random upserts, deletes, seals, offloads, checkpoints and GC passes, with
and without column indexes, in pieces of a few rows; writers racing the delete. At its T the
rows that matched at T − 1 are gone and every other row is as it was; a read as of T − 1
still sees them; writes after T are kept; ``count`` is the rows deleted; a crash between the
prepare and the decision keeps the delete whole or drops it whole, as the catalog decided."""
from __future__ import annotations

import asyncio
import random

import pytest

from rowstore.db.read import selection
from rowstore.errors import InvalidKeyError, QueryError
from tests.rowstore.db.read.test_subscribe import Model, _matches, _write
from tests.rowstore.tables_world import SCHEMA, TablesWorld


def _predicate(rng):
    kind = rng.randrange(4)
    if kind == 0:
        return {"where": [["v", rng.choice(["<", ">="]), rng.uniform(-30, 30)]]}
    if kind == 1:
        x, y = rng.uniform(0, 60), rng.uniform(0, 60)
        return {"bbox": {"column": "loc", "xmin": x, "ymin": y, "xmax": x + 40, "ymax": y + 40}}
    if kind == 2:
        return {"where": [["n", "<", rng.randrange(1, 17)], ["v", ">", -20.0]]}
    return {"prefix": [rng.randrange(40)]}


def _holds(row, f) -> bool:
    if "prefix" in f:
        return row is not None and row["id"] == f["prefix"][0]
    return _matches(row, f)


def _state(model: Model, upto: int) -> dict[int, dict]:
    """Every key's row at ``upto`` from the model's changes (its deletes by predicate included)."""
    now: dict[int, dict] = {}
    for ts, i, op, new, _ in sorted(model.changes, key=lambda c: c[0]):
        if ts > upto:
            break
        if op == "delete":
            now.pop(i, None)
        else:
            now[i] = new
    return now


async def _table(db, T):
    t, _ = await db.query("t", limit=None, as_of=T)
    return {r["id"]: r for r in t.to_pylist()}


async def _delete(db, model, f):
    res = await db.delete_where("t", **f)
    T = res.commit_ts
    gone = sorted(i for i, r in _state(model, T - 1).items() if _holds(r, f))
    model.delete(T, gone)
    return res, gone


@pytest.mark.parametrize("seed,indexes", [(1, ()), (2, ("v", "n", "loc")), (3, ("loc",))])
async def test_a_delete_by_predicate_removes_what_matched_at_T_minus_1_and_nothing_else(seed, indexes, monkeypatch):
    monkeypatch.setattr(selection, "PIECE_ROWS", 3)  # many pieces per partition
    rng = random.Random(seed)
    w = TablesWorld(partitions=4, seal_bytes=4096)
    db = await w.start()
    await db.create_table("t", SCHEMA, indexes=list(indexes))
    model = Model()
    for _ in range(4):
        await _write(db, model, rng, 25)
        f = _predicate(rng)
        res, gone = await _delete(db, model, f)
        T = res.commit_ts
        assert res.count == len(gone), f
        assert await _table(db, T - 1) == _state(model, T - 1)  # as of T - 1: every one still there
        assert await _table(db, T) == _state(model, T), f
        assert not any(_holds(r, f) for r in (await _table(db, T)).values())
    await _write(db, model, rng, 10)  # after T: kept
    assert await _table(db, None) == _state(model, 2**63)
    await db.close()


async def test_writers_racing_a_delete_commit_before_or_after_it(monkeypatch):
    monkeypatch.setattr(selection, "PIECE_ROWS", 2)
    rng = random.Random(11)
    w = TablesWorld(partitions=4, seal_bytes=8192)
    db = await w.start()
    await db.create_table("t", SCHEMA, indexes=["v"])
    model = Model()
    await _write(db, model, rng, 30)
    for k in range(3):
        f = {"where": [["v", "<", rng.uniform(-10, 10)]]}
        writers = [asyncio.ensure_future(_write(db, model, random.Random(k * 10 + j), 15)) for j in range(3)]
        await asyncio.sleep(0)
        res = await db.delete_where("t", **f)
        await asyncio.gather(*writers)
        T = res.commit_ts
        gone = sorted(i for i, r in _state(model, T - 1).items() if _holds(r, f))
        model.delete(T, gone)
        assert res.count == len(gone)
        assert not any(_holds(r, f) for r in (await _table(db, T)).values())  # none of the predicate's at T
        assert await _table(db, T) == _state(model, T)
    assert await _table(db, None) == _state(model, 2**63)  # every write after a T kept
    await db.close()


async def test_a_delete_with_no_term_or_a_bad_term_is_refused_and_changes_nothing():
    w = TablesWorld(partitions=2)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, random.Random(5), 10)
    before = await _table(db, None)
    for bad in ({}, {"where": []}, {"where": [["nope", "=", 1]]}, {"where": [["v", "~", 1]]},
                {"bbox": {"column": "v", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1}}, {"prefix": ["x"]}):
        with pytest.raises((QueryError, InvalidKeyError)):
            await db.delete_where("t", **bad)
    assert await _table(db, None) == before
    assert db.participant.held == 0
    await db.close()


async def test_a_prefix_delete_reads_only_the_prefixs_keys(monkeypatch):
    """A ``prefix`` names a key range: the participant reads the key index in that range alone
    (a sensor's readings, not the partition's), whatever the other terms, and deletes the same
    rows as the terms would."""
    w = TablesWorld(partitions=2)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, random.Random(13), 80)
    fetched: list[int] = []
    real = selection.fetch

    async def counting(store, ids, *a, **k):
        fetched.append(len(ids))
        return await real(store, ids, *a, **k)
    monkeypatch.setattr(selection, "fetch", counting)
    now = await _table(db, None)
    target = next(i for i in sorted(now))
    for f in ({"prefix": [target]}, {"prefix": [target], "where": [["v", ">", -1e9]]}):
        fetched.clear()
        await _delete(db, model, f)
        assert sum(fetched) <= 1, fetched  # one key's visible version, not the partition's rows
    assert target not in await _table(db, None) and len(now) > 10
    await db.close()


async def test_a_delete_routed_here_is_refused_when_a_partition_is_no_longer_served_here():
    """A cluster node routes a delete here for the partitions it leads; one it stopped leading
    since is refused (503), not skipped: the delete changes nothing and is not acknowledged
    (before, it deleted in the partitions still served and answered — the 3-node test with
    kills and the collector on saw its skipped rows at the end)."""
    from rowstore.errors import UnavailableError

    w = TablesWorld(partitions=3)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, random.Random(8), 60)
    f = {"where": [["v", "<", 100.0]]}

    async def part(p: int, as_of: int | None = None) -> dict[int, dict]:
        t, _ = await db.query("t", limit=None, partitions=[p], as_of=as_of)
        return {r["id"]: r for r in t.to_pylist()}
    before = [await part(p) for p in (0, 1)]
    assert all(before) and any(_holds(r, f) for b in before for r in b.values())
    table = await db.committer.tables.table(await db.describe("t"))
    table.unserve(2)  # demoted meanwhile
    with pytest.raises(UnavailableError, match=r"partitions \[2\] are not served"):
        await db.delete_where("t", **f, pids=[0, 1, 2])
    assert db.participant.held == 0
    assert [await part(p) for p in (0, 1)] == before  # nothing deleted in the partitions still served
    res = await db.delete_where("t", **f, pids=[0, 1])  # the partitions it serves: deleted there
    assert res.count == sum(1 for b in before for r in b.values() if _holds(r, f))
    after = [await part(p, res.commit_ts) for p in (0, 1)]
    assert not any(_holds(r, f) for a in after for r in a.values())
    await db.close()


@pytest.mark.parametrize("decided", [True, False])
async def test_a_crash_between_prepare_and_decision_keeps_the_delete_whole_or_drops_it(decided, monkeypatch):
    """The delete's pieces are durable in every partition's log when the node dies; recovery
    asks ``txn/X``: committed (the decision had landed), every piece replays; absent, the
    recovery aborts it and every row is back."""
    import rowstore.db.write.local_delete as bp
    from terrafs.catalog_ops import commit

    monkeypatch.setattr(selection, "PIECE_ROWS", 4)
    rng = random.Random(21)
    w = TablesWorld(partitions=4)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, rng, 40)
    f = {"where": [["v", ">=", 0.0]]}
    before = _state(model, 2**63)
    gone = sorted(i for i, r in before.items() if _holds(r, f))
    assert len(gone) > 8
    crashed = asyncio.Event()

    async def die(catalog, checks, puts):  # the commit point: written (or not), then power loss
        if decided:
            await commit(catalog, checks, puts)
        w.crash()
        crashed.set()
        await asyncio.Event().wait()
    monkeypatch.setattr(bp, "commit", die)
    task = asyncio.ensure_future(db.delete_where("t", **f))
    await crashed.wait()
    task.cancel()
    monkeypatch.undo()
    db2 = await w.start()
    after = await _table(db2, None)
    want = {i: r for i, r in before.items() if i not in gone} if decided else before
    assert after == want
    await db2.close()
