"""Reads of partitions from their objects alone (RFC 0010 §6, docs/format/replication.md
`rs/wm/`): the watermark each offload moves, and visibility worked out from the objects,
equal to the key index's answer at every T at or below it; above it, refused."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from pyroaring import BitMap

from rowstore.db.background.gc import GcConfig
from rowstore.db.read.leaderless import _among, read_watermark
from rowstore.errors import UnavailableError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows

BOX = {"column": "loc", "xmin": 20, "ymin": 10, "xmax": 70, "ymax": 60}
PARTS = 3


async def history(db, rounds=4, n=300, seed=3):
    """Rows, then rounds of overwrites and deletes, each sealed and offloaded; the commit
    timestamp after each round."""
    rng = np.random.default_rng(seed)
    out = [(await db.upsert("m", rows(range(n), seed=seed))).commit_ts]
    await db.seal()
    await db.offload()
    for r in range(rounds):
        keys = np.sort(rng.choice(n + 50, n // 2, replace=False))
        await db.upsert("m", rows(keys, seed=seed + r + 1))
        gone = np.sort(rng.choice(n + 50, n // 10, replace=False)).tolist()
        out.append((await db.delete("m", gone)).commit_ts)
        await db.seal()
        await db.offload()
    return out


def _visible(plan) -> dict[int, list[int]]:
    return {s.segid: list(BitMap.deserialize(s.visible)) for s in plan if len(BitMap.deserialize(s.visible))}


async def same_as_index(db, T):
    """What the objects say at T equals what the key index says, for queries and plans."""
    pids = list(range(PARTS))
    want, _ = await db.query("m", as_of=T, limit=None)
    got = await db.query_without_leader("m", T, pids)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    assert got.column("v").to_pylist() == want.column("v").to_pylist()
    want, _ = await db.query("m", as_of=T, bbox=BOX, where=[["name", "=", "name-3"]], limit=None)
    got = await db.query_without_leader("m", T, pids, where=[["name", "=", "name-3"]], bbox=BOX)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()
    plan = await db.read_plan("m", as_of=T, sealed_only=True)
    assert not plan.tail
    assert _visible(await db.plan_without_leader("m", T, pids)) == _visible(plan.sealed)


async def test_objects_alone_answer_like_the_index_at_or_below_the_watermark():
    w = TablesWorld(PARTS, gc=GcConfig(min_garbage=0.1, grace_s=0.0))
    db = await w.start()
    d = await db.create_table("m", SCHEMA, indexes=["loc", "name"])
    stamps = await history(db)
    marks = [await read_watermark(db.catalog, d.table_id, p) for p in range(PARTS)]
    assert all(m is not None and m.ts >= stamps[-1] for m in marks), marks
    for T in stamps:
        await same_as_index(db, T)
    # newer writes, not offloaded: reads above the watermark are refused, below still served
    await db.upsert("m", rows(range(10), v=7.0))
    top = (await db.upsert("m", rows(range(400, 410), v=8.0))).commit_ts
    with pytest.raises(UnavailableError, match="needs its leader"):
        await db.query_without_leader("m", top, list(range(PARTS)))
    with pytest.raises(UnavailableError):
        await db.plan_without_leader("m", top, list(range(PARTS)))
    await same_as_index(db, stamps[-1])
    await db.seal()
    await db.offload()
    await same_as_index(db, top)


async def test_the_garbage_collectors_copies_answer_for_their_victims():
    """Copies hold their victims' live rows (new localids, the same commit timestamps): the
    objects, copies included, still answer like the index."""
    w = TablesWorld(PARTS, retention_ms=3000, gc=GcConfig(min_garbage=0.1, grace_s=0.0))
    db = await w.start()
    d = await db.create_table("m", SCHEMA, indexes=["loc", "name"])
    await history(db)
    w.clock.advance((3000 + db.cfg.purge_lag_ms) / 1000 + 0.2)  # every overwritten version falls below it
    await db.collect_garbage("m")
    assert any(r.copy for r in await db.store.list(table=d.table_id))
    T = (await db.upsert("m", rows(range(5), v=3.0))).commit_ts
    await db.seal()
    await db.offload()
    await same_as_index(db, T)


async def test_a_partition_with_nothing_offloaded_is_refused():
    w = TablesWorld(PARTS)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    T = (await db.upsert("m", rows(range(50)))).commit_ts
    with pytest.raises(UnavailableError, match="nothing offloaded"):
        await db.query_without_leader("m", T, [0])


async def test_the_watermark_stops_below_a_sealed_segment_not_offloaded():
    """Seal twice, offload only the first (as a node that died before offloading the second
    would): the watermark stays below the second segment's rows."""
    w = TablesWorld(1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    t1 = (await db.upsert("m", rows(range(20)))).commit_ts
    await db.seal()
    t2 = (await db.upsert("m", rows(range(10), v=1.0))).commit_ts
    await db.seal()
    first = min((r for r in await db.store.list(table=d.table_id)), key=lambda r: r.seq)
    await db.store.offload(first.segid, d.schema, await db.tables.schemas_of(d))
    from rowstore.db.read.leaderless import advance_watermark
    wm = await advance_watermark(db.store, db.timeline, d.table_id, 0)
    assert wm is not None and t1 <= wm.ts < t2, (t1, wm, t2)
    await same_as_index_one(db, t1)
    with pytest.raises(UnavailableError):
        await db.query_without_leader("m", t2, [0])


async def same_as_index_one(db, T):
    want, _ = await db.query("m", as_of=T, limit=None)
    got = await db.query_without_leader("m", T, [0])
    assert got.column("v").to_pylist() == want.column("v").to_pylist()


async def test_an_idle_partitions_watermark_follows_the_closed_timestamp():
    """Nothing written, or everything offloaded: the maintenance round moves the watermark to
    the closed timestamp, so the partition reads (empty, or its objects) without its leader."""
    w = TablesWorld(PARTS)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    T0 = db.closed_ts
    await db.offload()  # a maintenance round's offload step
    for p in range(PARTS):
        assert (await read_watermark(db.catalog, d.table_id, p)).ts >= T0
    assert (await db.query_without_leader("m", T0, list(range(PARTS)))).num_rows == 0
    T1 = (await db.upsert("m", rows(range(30)))).commit_ts
    await db.offload()  # rows in active segments: the watermark stays below them
    with pytest.raises(UnavailableError):
        await db.query_without_leader("m", T1, list(range(PARTS)))
    await db.seal()
    db.maintenance._marked.clear()  # as WATERMARK_EVERY_S later
    await db.offload()
    await same_as_index(db, T1)


@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 60), max_size=40))
def test_among_is_membership_in_the_sorted_rowids(rid, ids):
    """The query's per-batch membership test equals ``np.isin`` (which re-sorted the partition's
    visible rowids for every batch)."""
    r, i = np.sort(np.asarray(rid, np.uint64)), np.unique(np.asarray(ids, np.uint64))
    assert (_among(r, i) == np.isin(r, i)).all()
