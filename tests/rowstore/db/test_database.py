"""Tables: upserts and deletes by key, reads as of T, atomic multi-partition batches, recovery."""
import pyarrow as pa
import pytest

from rowstore.errors import (FutureTimestampError, HistoryPurgedError, QueryError, RowValidationError,
                             TableNotFoundError)
from rowstore.hlc import ts_from_ms
from terrafs.failpoints import FailPointCrash, armed
from tests.fixtures.waits import eventually_async
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def make(partitions=4, **cfg):
    w = TablesWorld(partitions, **cfg)
    db = await w.start()
    await db.create_table("m", SCHEMA, indexes=["loc", "v", "name"])
    return w, db


async def ids_at(db, T=None):
    t, _ = await db.read_all("m", as_of=T)
    return t.column("id").to_pylist()


async def test_upsert_get_delete_as_of():
    w, db = await make()
    r1 = await db.upsert("m", rows(range(100)))
    assert r1.count == 100
    r2 = await db.upsert("m", pa.table({"id": pa.array([5], pa.int64()), "v": [99.0]}))
    assert r2.commit_ts > r1.commit_ts
    now = await db.get("m", 5)
    assert now["v"] == 99.0 and now["name"] is None  # an upsert replaces the whole row
    assert (await db.get("m", 5, as_of=r1.commit_ts))["name"] == "name-5"
    d = await db.delete("m", [6, 7, 12345])
    assert d.count == 2 and d.commit_ts > r2.commit_ts
    assert await db.get("m", 6) is None
    assert (await db.get("m", 6, as_of=d.commit_ts - 1))["id"] == 6
    assert await db.get("m", 5, as_of=r1.commit_ts - 1) is None
    assert await ids_at(db) == [i for i in range(100) if i not in (6, 7)]
    assert await ids_at(db, r1.commit_ts) == list(range(100))


async def test_last_row_of_a_key_in_a_batch_wins():
    w, db = await make()
    b = pa.concat_tables([rows([1, 2], v=1.0), rows([1], v=2.0)])
    assert (await db.upsert("m", b)).count == 2
    assert (await db.get("m", 1))["v"] == 2.0


async def test_bad_batches_change_nothing():
    w, db = await make()
    await db.upsert("m", rows(range(10)))
    before = await ids_at(db)
    bad = [
        pa.table({"id": pa.array([1], pa.int64()), "nope": [1]}),  # unknown column
        pa.table({"v": [1.0]}),  # no primary key
        pa.table({"id": pa.array([1, None], pa.int64())}),  # null key
        pa.table({"id": pa.array([1], pa.int64()), "v": ["x"]}),  # wrong type
        pa.table({"id": pa.array([1], pa.int64()), "name": pa.array([1], pa.int64())}),
    ]
    for b in bad:
        with pytest.raises(RowValidationError):
            await db.upsert("m", b)
    assert await ids_at(db) == before
    with pytest.raises(TableNotFoundError):
        await db.upsert("zz", rows([1]))


async def test_lossless_conversions_accepted():
    w, db = await make()
    t = pa.table({"id": pa.array([1, 2], pa.int32()), "v": pa.array([1, 2], pa.int16()),
                  "name": pa.array(["a", "b"], pa.large_string()),
                  "ts": pa.array([1, 2], pa.timestamp("ms"))})
    await db.upsert("m", t)
    got = await db.get("m", 2)
    assert got["v"] == 2.0 and got["name"] == "b" and got["ts"].timestamp() == 0.002


async def test_as_of_errors():
    w, db = await make(retention_ms=60_000)
    r = await db.upsert("m", rows([1]))
    with pytest.raises(FutureTimestampError):
        await db.get("m", 1, as_of=r.commit_ts + ts_from_ms(3_600_000))
    with pytest.raises(HistoryPurgedError):
        await db.get("m", 1, as_of=r.commit_ts - ts_from_ms(120_000))
    with pytest.raises(QueryError):
        await db.get("m", 1, as_of="yesterday")
    # a timestamp just taken from the clock closes at once (nothing in flight)
    assert (await db.get("m", 1, as_of=await db.clock.now()))["id"] == 1


async def test_multi_partition_batch_crash_before_decision_is_all_or_nothing():
    w, db = await make()
    await db.upsert("m", rows(range(50)))
    with armed("txn.after_prepare"), pytest.raises(FailPointCrash):
        await db.upsert("m", rows(range(50, 150)))
    w.crash()
    db2 = await w.start()
    assert await ids_at(db2) == list(range(50))
    r = await db2.upsert("m", rows(range(150, 160)))  # the partitions write on after the aborted prepare
    assert await ids_at(db2) == list(range(50)) + list(range(150, 160))
    w.crash()
    db3 = await w.start()
    assert await ids_at(db3) == list(range(50)) + list(range(150, 160))
    assert (await db3.get("m", 155, as_of=r.commit_ts))["id"] == 155


async def test_multi_partition_batch_crash_after_decision_commits_everywhere():
    w, db = await make()
    with armed("txn.after_decision"), pytest.raises(FailPointCrash):
        await db.upsert("m", rows(range(100)))
    w.crash()
    db2 = await w.start()
    assert await ids_at(db2) == list(range(100))
    assert not [e for e in await w.cat.scan("txn/")]  # decision rows cleaned up after recovery
    w.crash()
    db3 = await w.start()
    assert await ids_at(db3) == list(range(100))


async def test_recovery_replays_after_checkpoint_mark_and_reads_offloaded():
    w, db = await make()
    await db.upsert("m", rows(range(0, 40)))
    await db.checkpoint()
    await db.upsert("m", rows(range(40, 80)))
    await db.seal()
    await db.offload()
    await db.delete("m", [3, 45])
    await db.checkpoint()
    await db.upsert("m", rows(range(80, 90), v=7.0))
    w.crash()
    db2 = await w.start()
    want = [i for i in range(90) if i not in (3, 45)]
    assert await ids_at(db2) == want
    t, _ = await db2.query("m", where=[["v", "=", 7.0]])
    assert t.column("id").to_pylist() == list(range(80, 90))


async def test_crash_during_checkpoint_publish_keeps_everything():
    w, db = await make()
    await db.upsert("m", rows(range(60)))
    with armed("offload.after_upload"), pytest.raises(FailPointCrash):
        await db.checkpoint()
    w.crash()
    db2 = await w.start()
    assert await ids_at(db2) == list(range(60))
    assert (await db2.checkpoint())["checkpointed"] > 0
    t, _ = await db2.query("m", bbox={"column": "loc", "xmin": 0, "ymin": 0, "xmax": 100, "ymax": 100})
    assert t.num_rows == 60


async def test_schema_history_reads():
    w, db = await make()
    r1 = await db.upsert("m", rows([1]))
    await db.alter_table("m", lambda s: s.add_column("extra", "int32"))
    r2 = await db.upsert("m", pa.table({"id": pa.array([2], pa.int64()), "extra": pa.array([7], pa.int32())}))
    await db.alter_table("m", lambda s: s.rename_column("name", "label"))
    d3 = await db.alter_table("m", lambda s: s.drop_column("extra"))
    await db.alter_table("m", lambda s: s.add_column("extra", "string"))  # a new column, same name
    assert set(await db.get("m", 1, as_of=r1.commit_ts)) == {"id", "ts", "loc", "name", "v", "n"}
    assert (await db.get("m", 1, as_of=r2.commit_ts))["extra"] is None
    assert (await db.get("m", 2, as_of=r2.commit_ts))["extra"] == 7
    assert (await db.get("m", 1, as_of=d3.ts))["label"] == "name-1"
    assert "extra" not in await db.get("m", 2, as_of=d3.ts)
    assert (await db.get("m", 2))["extra"] is None  # the old values never show under the new column
    with pytest.raises(QueryError):
        await db.query("m", where=[["name", "=", "x"]])  # renamed away
    t, _ = await db.query("m", where=[["name", "=", "name-1"]], as_of=r2.commit_ts)
    assert t.column("id").to_pylist() == [1]


async def test_drop_and_recreate_is_a_new_table():
    w, db = await make()
    r = await db.upsert("m", rows([1, 2]))
    await db.drop_table("m")
    with pytest.raises(TableNotFoundError):
        await db.get("m", 1)
    await db.create_table("m", "id int64 primary key, w string")
    assert await db.get("m", 1) is None
    assert (await db.get("m", 1, as_of=r.commit_ts))["name"] == "name-1"


async def test_string_and_uuid_keys():
    w = TablesWorld(4)
    db = await w.start()
    await db.create_table("s", "k string primary key, v int64")
    await db.create_table("u", "k uuid primary key, v int64")
    await db.upsert("s", pa.table({"k": ["a", "bb", "ccc", ""], "v": [1, 2, 3, 4]}))
    assert (await db.get("s", "bb"))["v"] == 2 and (await db.get("s", ""))["v"] == 4
    assert await db.get("s", "b") is None and await db.get("s", "bbb") is None
    import uuid
    us = [uuid.UUID(int=i << 64) for i in range(5)]
    await db.upsert("u", pa.table({"k": pa.array([u.bytes for u in us], pa.binary(16)), "v": list(range(5))}))
    assert (await db.get("u", str(us[3])))["v"] == 3
    t, _ = await db.read_all("s", start=["a"], end=["c"])
    assert t.column("k").to_pylist() == ["a", "bb"]
    with pytest.raises(RowValidationError):
        await db.upsert("s", pa.table({"k": ["x\x00"], "v": [1]}))


async def test_query_validation():
    w, db = await make()
    for where in [[["nope", "=", 1]], [["v", "~", 1]], [["v", "=", "abc"]], [["loc", "=", 1]], "v>1",
                  [["v", "=", None]], [["v", ">"]]]:
        with pytest.raises(QueryError):
            await db.query("m", where=where)
    for bbox in [{"column": "v", "xmin": 0, "ymin": 0, "xmax": 1, "ymax": 1},
                 {"column": "loc", "xmin": 1, "ymin": 0, "xmax": 0, "ymax": 1},
                 {"column": "loc", "xmin": "a", "ymin": 0, "xmax": 1, "ymax": 1}, [1, 2]]:
        with pytest.raises(QueryError):
            await db.query("m", bbox=bbox)
    with pytest.raises(QueryError):
        await db.query("m", columns=["zz"])
    with pytest.raises(QueryError):
        await db.query("m", limit=-1)


async def test_rollover_at_seal_bytes_and_background_jobs():
    w, db = await make(partitions=2, seal_bytes=16 << 10)
    for i in range(10):
        await db.upsert("m", rows(range(i * 100, i * 100 + 100), seed=i))

    async def sealed():  # rolled over in the background
        states = [r.state.value for _, r in await db.segment_records("m")]
        assert states.count("sealed") >= 2, states
    await eventually_async(sealed)
    assert (await db.offload())["offloaded"]
    assert await ids_at(db) == list(range(1000))


async def test_rows_of_several_versions_in_one_fetch():
    """A shorter row of a newer version at the end of a fetched range must not be read with
    the older version's (longer) layout."""
    w = TablesWorld(1)
    db = await w.start()
    await db.create_table("t", "id int64 primary key, v float64, e1 int64")
    await db.upsert("t", pa.table({"id": pa.array([32], pa.int64()), "e1": pa.array([5], pa.int64())}))
    await db.alter_table("t", lambda s: s.drop_column("e1"))
    await db.upsert("t", pa.table({"id": pa.array([0], pa.int64()), "v": [1.0]}))
    t, _ = await db.read_all("t")
    assert t.to_pylist() == [{"id": 0, "v": 1.0}, {"id": 32, "v": None}]


async def test_a_checkpoint_under_the_budget_brings_the_memtables_within_it():
    """What the node's checkpoint job runs once the memtables pass ``memtable_bytes``
    (``node/daemon/jobs.py``): the largest are checkpointed until the budget is met."""
    w, db = await make(partitions=2, memtable_bytes=20_000)
    n = 0
    while db.memtable_bytes() <= 20_000:  # over the budget, under the write stall's limit
        await db.upsert("m", rows(range(n, n + 50), seed=n))
        n += 50
    assert db.maintenance.stalls == 0
    out = await db.checkpoint(force=False)
    assert out["checkpointed"] >= 1 and db.memtable_bytes() <= 20_000
    assert any(p.index.runs for p in db.tables.partitions())
    assert await ids_at(db) == list(range(n))
    t, _ = await db.query("m", where=[["v", ">", 0.0]], limit=None)
    assert t.num_rows == sum(1 for v in (await db.read_all("m"))[0].column("v").to_pylist() if v > 0)


async def test_concurrent_batches_commit_in_groups_each_with_its_own_timestamp():
    import asyncio
    w, db = await make()
    results = {}

    async def client(c):
        for i in range(6):
            ids = range(c * 1000 + i * 50, c * 1000 + i * 50 + 50)  # spans every partition
            results[(c, i)] = await db.upsert("m", rows(ids, v=float(c * 10 + i)))

    await asyncio.gather(*(client(c) for c in range(8)))
    tss = sorted(r.commit_ts for r in results.values())
    assert len(set(tss)) == len(tss)  # one commit_ts per batch, even when committed together
    for r in results.values():  # as of its own ts, a batch and every earlier one are visible
        seen = set(await ids_at(db, r.commit_ts))
        earlier = {k for (c2, i2), r2 in results.items() if r2.commit_ts <= r.commit_ts
                   for k in range(c2 * 1000 + i2 * 50, c2 * 1000 + i2 * 50 + 50)}
        assert seen == earlier


async def test_crash_inside_a_group_loses_only_unacknowledged_batches_whole():
    import asyncio
    w, db = await make()
    acked, failed = [], []

    async def client(c):
        for i in range(5):
            ids = list(range(c * 1000 + i * 40, c * 1000 + i * 40 + 40))
            try:
                await db.upsert("m", rows(ids))
                acked.append(ids)
            except FailPointCrash:
                failed.append(ids)
                return

    with armed("txn.after_prepare", skip=2):
        await asyncio.gather(*(client(c) for c in range(6)))
    assert failed
    w.crash()
    db2 = await w.start()
    have = set(await ids_at(db2))
    for ids in acked:
        assert set(ids) <= have
    for ids in failed:
        assert not set(ids) & have


async def test_progress_records_close_timestamps_in_the_write_ahead():
    w, db = await make(partitions=2)
    r = await db.upsert("m", rows(range(20)))
    assert (await db.maintain())["progress"] == 2
    assert (await db.maintain())["progress"] == 0  # nothing new to close
    w.crash()
    db2 = await w.start()
    assert all(seg.wal.closed_ts >= r.commit_ts for seg in db2.store.active.values())


async def test_limit_returns_the_first_matching_keys():
    w, db = await make(partitions=3)
    await db.upsert("m", rows(range(3000)))
    full, _ = await db.query("m", where=[["n", ">", 10]], limit=None)
    for limit in (0, 1, 7, 100, 5000):
        got, _ = await db.query("m", where=[["n", ">", 10]], limit=limit)
        assert got.column("id").to_pylist() == full.column("id").to_pylist()[:limit]


async def test_point_reads_follow_table_changes():
    """Gets at the present keep the table as they need it; every table change replaces it."""
    w, db = await make()
    await db.upsert("m", rows([1, 2]))
    assert set(await db.get("m", 1)) == {"id", "ts", "loc", "name", "v", "n"}
    await db.alter_table("m", lambda s: s.add_column("extra", "int32"))
    assert (await db.get("m", 1))["extra"] is None
    await db.upsert("m", pa.table({"id": pa.array([1], pa.int64()), "extra": pa.array([7], pa.int32())}))
    assert (await db.get("m", 1))["extra"] == 7
    await db.drop_table("m")
    with pytest.raises(TableNotFoundError):
        await db.get("m", 1)
    await db.create_table("m", "id int64 primary key, w string")
    assert await db.get("m", 1) is None
    await db.upsert("m", pa.table({"id": pa.array([1], pa.int64()), "w": ["x"]}))
    assert await db.get("m", 1) == {"id": 1, "w": "x"}
    with pytest.raises(RowValidationError):
        await db.get("m", "not a number")


async def test_point_read_waits_for_a_definition_newer_than_the_closed_timestamp():
    """A batch still in flight holds the closed timestamp below a later schema change: a get
    at the present reads with the definition visible at that timestamp, not the newest."""
    w, db = await make()
    await db.upsert("m", rows([1]))
    assert "extra" not in await db.get("m", 1)
    ts = await db.timeline.begin()  # a batch in flight
    d = await db.alter_table("m", lambda s: s.add_column("extra", "int32"))
    assert d.ts > ts and "extra" not in await db.get("m", 1)
    db.timeline.end(ts)
    assert (await db.get("m", 1))["extra"] is None


async def test_point_reads_from_offloaded_segments_after_restart_equal_get_many():
    w, db = await make(partitions=2)
    await db.upsert("m", rows(range(300)))
    await db.delete("m", [5, 6])
    await db.checkpoint()
    await db.seal()
    await db.offload()
    await db.close()
    db = await w.start()
    keys = [0, 5, 6, 7, 150, 299, 300]
    many = {r["id"]: r for r in (await db.get_many("m", pa.array(keys, pa.int64()))).to_pylist()}
    for _ in range(2):  # pages and blocks read, then the same from memory only
        assert {k: await db.get("m", k) for k in keys} == {k: many.get(k) for k in keys}


async def test_read_all_is_one_read_at_one_T_with_no_history_kept(monkeypatch):
    """Every row at one T: with a retention of 0, a T older than the purge lag is refused, and
    a read_all that paged (checking its T at every page) was refused at a later page once the
    read outlived the lag (the GC benchmark's read of a million rows to quiescence). It is one
    read now (here each scan call starts 6 s later than the one before)."""
    w = TablesWorld(partitions=2, retention_ms=0)
    db = await w.start()
    await db.create_table("t", "id int64 primary key, v int64")
    await db.upsert("t", pa.table({"id": list(range(25_000)), "v": list(range(25_000))}))
    scan = db.reader.scan

    async def later(*a, **k):
        w.clock.advance(6.0)
        return await scan(*a, **k)

    monkeypatch.setattr(db.reader, "scan", later)
    t, _ = await db.read_all("t")
    assert t.column("id").to_pylist() == list(range(25_000))
