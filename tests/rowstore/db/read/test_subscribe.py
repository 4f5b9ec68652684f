"""Subscriptions in the engine against a model (docs/rfcs/0015-subscriptions.md): random
upserts, overwrites and deletes; subscribers with random filters, from random closed
timestamps; what each receives up to its last closed T is exactly the model's changes whose
new or old version matches, in commit order, and a resume from any closed T continues
exactly once."""
from __future__ import annotations

import asyncio
import random

import numpy as np
import pyarrow as pa
import pytest

from rowstore.db.read.subscribe import Changes, Closed
from rowstore.errors import FutureTimestampError, HistoryPurgedError, QueryError, SubscriptionEndedError, \
    TableNotFoundError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


def _matches(row, f) -> bool:
    if row is None:
        return False
    for col, op, val in f.get("where") or []:
        x = row[col]
        if not {"=": x == val, "!=": x != val, "<": x < val, "<=": x <= val, ">": x > val, ">=": x >= val}[op]:
            return False
    b = f.get("bbox")
    if b is not None:
        p = row[b["column"]]
        return b["xmin"] <= p["x"] <= b["xmax"] and b["ymin"] <= p["y"] <= b["ymax"]
    return True


class Model:
    """Every committed change: (commit_ts, id, op, the row or None, the version before)."""

    def __init__(self):
        self.now: dict[int, dict] = {}
        self.changes: list[tuple[int, int, str, dict | None, dict | None]] = []

    def upsert(self, ts, table):
        for r in table.to_pylist():
            self.changes.append((ts, r["id"], "upsert", r, self.now.get(r["id"])))
            self.now[r["id"]] = r

    def delete(self, ts, ids):
        for i in ids:
            self.changes.append((ts, i, "delete", None, self.now.pop(i, None)))

    def expected(self, f, after, upto):
        narrow = bool(f.get("where") or f.get("bbox"))
        out = []
        for ts, i, op, new, old in sorted(self.changes, key=lambda c: (c[0], c[1])):
            if after < ts <= upto and (not narrow or _matches(new, f) or _matches(old, f)):
                out.append((ts, i, op))
        return out


def _random_filter(rng):
    kind = rng.randrange(4)
    if kind == 0:
        return {}
    if kind == 1:
        return {"where": [["v", rng.choice([">", "<=", ">="]), rng.uniform(-40, 40)]]}
    if kind == 2:
        x, y = rng.uniform(0, 70), rng.uniform(0, 70)
        return {"bbox": {"column": "loc", "xmin": x, "ymin": y, "xmax": x + 30, "ymax": y + 30}}
    return {"where": [["n", "<", rng.randrange(1, 17)]], "bbox": {"column": "loc", "xmin": 0, "ymin": 0,
                                                                   "xmax": 60, "ymax": 60}}


async def _drain(sub, until_closed: int, timeout: float = 10.0):
    """Items until a Closed at or past ``until_closed``: (changes as (ts, id, op), last closed)."""
    got, last = [], 0
    while last < until_closed:
        item = await asyncio.wait_for(sub.next(), timeout)
        if isinstance(item, Closed):
            assert item.ts > last, "closed timestamps only move up"
            last = item.ts
        else:
            assert isinstance(item, Changes)
            r, idx = item.round, item.idx
            ids = r.batch.column("id").to_pylist()
            for i in idx.tolist():
                got.append((int(r.ts[i]), ids[i], "delete" if r.deleted[i] else "upsert"))
    return got, last


def _upto(got, last):
    """The changes at or below ``last``, in (commit_ts, key) order (one commit's rows may come
    in any order)."""
    return sorted(g for g in got if g[0] <= last)


async def _write(db, model, rng, n_ops, ids=40):
    for _ in range(n_ops):
        chore = rng.random()
        if chore < 0.04:  # seals, offloads, checkpoints and GC move rows, never changes
            await db.seal()
            await db.offload()
        elif chore < 0.06:
            await db.checkpoint()
        elif chore < 0.08:
            await db.collect_garbage()
        if rng.random() < 0.25:
            keys = rng.sample(range(ids), rng.randrange(1, 4))
            res = await db.delete("t", keys)
            model.delete(res.commit_ts, keys)
        else:
            keys = rng.sample(range(ids), rng.randrange(1, 6))
            t = rows(keys, seed=rng.randrange(1 << 30))
            res = await db.upsert("t", t)
            model.upsert(res.commit_ts, t)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_subscribers_receive_the_models_filtered_changes_and_resume_exactly_once(seed):
    rng = random.Random(seed)
    w = TablesWorld(partitions=4, progress_every_s=0.05)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, rng, 20)  # history before anyone subscribes
    start = db.closed_ts
    filters = [_random_filter(rng) for _ in range(5)]
    subs = [await db.subscribe("t", None if i == 0 else start, **f) for i, f in enumerate(filters)]
    froms = [subs[0].after] + [start] * 4
    # concurrent writers while the subscribers are live
    await asyncio.gather(*(_write(db, model, random.Random(seed * 10 + k), 25) for k in range(3)))
    end = db.closed_ts
    for sub, f, frm in zip(subs, filters, froms):
        got, last = await _drain(sub, end)
        assert _upto(got, last) == model.expected(f, frm, last), f
        assert [g[0] for g in got] == sorted(g[0] for g in got)  # commit order
        db.unsubscribe(sub)
    # resume from a random closed timestamp: the changes after it, exactly once
    for f in filters:
        frm = rng.randrange(start, end)
        sub = await db.subscribe("t", frm, **f)
        await _write(db, model, rng, 5)
        got, last = await _drain(sub, db.closed_ts)
        assert _upto(got, last) == model.expected(f, frm, last)
        db.unsubscribe(sub)
    await db.close()


async def test_a_change_leaving_the_window_and_a_delete_of_a_row_in_it_are_sent():
    w = TablesWorld(partitions=2, progress_every_s=0.05)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    await db.upsert("t", rows([1, 2], v=10.0))
    sub = await db.subscribe("t", where=[["v", ">", 5]], columns=["v"])
    await db.upsert("t", rows([1], v=0.0))  # leaves the window: its old version matched
    await db.upsert("t", rows([3], v=0.0))  # never in it
    res = await db.delete("t", [2])  # was in it
    got, last = await _drain(sub, res.commit_ts)
    assert [(i, op) for _, i, op in got] == [(1, "upsert"), (2, "delete")]
    assert sub.filter.columns == ["v", "id"]  # the key always travels
    db.unsubscribe(sub)
    await db.close()


async def test_refusals_open_nothing():
    w = TablesWorld(partitions=2, progress_every_s=0.05, retention_ms=60_000)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    with pytest.raises(TableNotFoundError):
        await db.subscribe("nope")
    with pytest.raises(QueryError):
        await db.subscribe("t", where=[["nope", "=", 1]])
    with pytest.raises(QueryError):
        await db.subscribe("t", columns=["nope"])
    with pytest.raises(QueryError):
        await db.subscribe("t", bbox={"column": "v", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1})
    with pytest.raises(HistoryPurgedError):
        await db.subscribe("t", 1)
    with pytest.raises(FutureTimestampError):
        await db.subscribe("t", db.closed_ts + (3600_000 << 16))
    assert len(db.subscriptions) == 0 and not db.commit_tail._held
    await db.close()


async def test_a_subscriber_over_its_buffer_is_ended_and_writers_never_wait():
    w = TablesWorld(partitions=2, progress_every_s=0.05, subscriber_bytes=20_000)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    sub = await db.subscribe("t")
    for k in range(20):  # nobody reads: the queue passes its budget
        await asyncio.wait_for(db.upsert("t", rows(np.arange(k * 50, k * 50 + 50))), 5)
    await asyncio.sleep(0.2)
    with pytest.raises(SubscriptionEndedError) as e:
        while True:
            await asyncio.wait_for(sub.next(), 2)
    assert e.value.code == "slow_subscriber" and sub.queued_bytes == 0
    db.unsubscribe(sub)
    assert len(db.subscriptions) == 0
    await db.close()



async def test_a_schema_change_or_a_drop_ends_the_subscription_with_its_reason():
    w = TablesWorld(partitions=2, progress_every_s=0.05)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    sub = await db.subscribe("t")
    await db.alter_table("t", lambda s: s.add_column("extra", "float64"))
    await db.upsert("t", rows([1]).append_column("extra", pa.array([1.5])))
    with pytest.raises(SubscriptionEndedError) as e:
        while True:
            await asyncio.wait_for(sub.next(), 5)
    assert e.value.code == "schema_changed"
    db.unsubscribe(sub)
    sub = await db.subscribe("t")  # the new columns
    res = await db.upsert("t", rows([2]).append_column("extra", pa.array([2.5])))
    got, _ = await _drain(sub, res.commit_ts)
    assert [(i, op) for _, i, op in got] == [(2, "upsert")]
    await db.drop_table("t")
    with pytest.raises(SubscriptionEndedError) as e:
        while True:
            await asyncio.wait_for(sub.next(), 5)
    assert e.value.code == "table_dropped"
    db.unsubscribe(sub)
    await db.close()


async def test_a_prefix_covering_the_partition_key_watches_only_its_partition():
    """Only the partition the prefix picks is watched (no other partition's rounds decoded to
    be filtered out; across nodes, only its leader's share is opened), and it still gets every
    change of the prefix's rows, exactly as the model says."""
    from rowstore.tables.keys import partition_of_key

    rng = random.Random(7)
    w = TablesWorld(partitions=4, progress_every_s=0.05)
    db = await w.start()
    d = await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, rng, 10, ids=12)
    start = db.closed_ts
    sub = await db.subscribe("t", start, prefix=[5])
    assert sub.pids == {partition_of_key(d.schema.pk, (5,), 4)}
    await _write(db, model, rng, 40, ids=12)
    got, last = await _drain(sub, db.closed_ts)
    want = model.expected({"where": [["id", "=", 5]]}, start, last)  # a prefix is equality on the key
    assert _upto(got, last) == want and any(op == "delete" for _, _, op in want), want
    db.unsubscribe(sub)
    await db.close()


@pytest.mark.parametrize("seed", [4, 5])
async def test_a_catch_up_in_small_windows_sends_the_models_changes(seed, monkeypatch):
    """A catch-up reads its interval window by window (rowstore/db/read/feed.py): with windows
    of a few changes, over segments sealed, offloaded and collected meanwhile, every
    subscriber still receives exactly the model's changes, old versions across windows
    included."""
    import rowstore.db.read.bridge as bridge
    from rowstore.db.read import feed, subscribe

    monkeypatch.setattr(subscribe, "CATCH_UP_WINDOW", 7)
    cut: list[int] = []

    def counting(recs, after, T, n):
        out = feed.windows(recs, after, T, n)
        cut.append(len(out))
        return out
    monkeypatch.setattr(bridge, "windows", counting)
    rng = random.Random(seed)
    w = TablesWorld(partitions=4, progress_every_s=0.05, seal_bytes=4096)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, rng, 10)
    start = db.closed_ts
    await _write(db, model, rng, 60)
    end = db.closed_ts
    for f in [{}, *(_random_filter(rng) for _ in range(4))]:
        sub = await db.subscribe("t", start, **f)
        got, last = await _drain(sub, end)
        assert _upto(got, last) == model.expected(f, start, last), f
        db.unsubscribe(sub)
    assert cut and min(cut) > 3, cut  # the catch-ups were read in windows
    await db.close()


@pytest.mark.parametrize("catch_up", [True, False])
async def test_a_round_of_the_pump_during_the_seam_is_neither_repeated_nor_closed_backwards(catch_up):
    """While a subscription waits for its seam C1 (RFC 0015 §4) the table's pump, started by
    another subscriber, runs rounds; their changes are at or below C1, so the catch-up has them
    and the subscriber must not get them again, nor a closed timestamp below C1 after it (a
    fresh-clone CI run saw ``closed`` move down over HTTP)."""
    rng = random.Random(7)
    w = TablesWorld(partitions=2, progress_every_s=0.02)
    db = await w.start()
    await db.create_table("t", SCHEMA)
    model = Model()
    await _write(db, model, rng, 10)
    start = db.closed_ts
    other = await db.subscribe("t", None)  # the pump runs
    tl = db.subscriptions.timeline
    plain = tl.wait_closed
    seams: list[int] = []

    async def slow(ts, *a):
        if not a:  # the seam's wait (the pump's passes a timeout): rounds of the pump run meanwhile
            seams.append(ts)
            await asyncio.sleep(0.3)
        return await plain(ts, *a)
    tl.wait_closed = slow
    writing = asyncio.ensure_future(_write(db, model, random.Random(8), 40))
    await asyncio.sleep(0.05)
    sub = await db.subscribe("t", start if catch_up else None)
    frm = start if catch_up else sub.after
    tl.wait_closed = plain
    await writing
    end = db.closed_ts
    got, last = await _drain(sub, end)
    assert seams and sub.after > start
    assert _upto(got, last) == model.expected({}, frm, last)
    db.unsubscribe(sub)
    db.unsubscribe(other)
    await db.close()
