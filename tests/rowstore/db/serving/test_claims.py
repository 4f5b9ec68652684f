"""Only the node serving a partition at its current epoch publishes its index
(docs/format/index-run.md, "The claim"; RFC 0009, "Who collects"): a node that stopped serving
it — paused while another took over — publishes nothing more, checkpoint, merge or collection
pass; a claim older than the manifest's is refused; a node's collector leaves alone the
partitions it does not serve."""
import asyncio
import json

import pytest

from rowstore.errors import ConflictError, FencedError
from rowstore.index.key_manifest import Claim, Manifest
from rowstore.db.partition import manifest_key
from tests.rowstore.db.serving.test_handoff import Two, ids_and_v
from tests.rowstore.tables_world import SCHEMA, rows


async def manifest(db, d) -> Manifest:
    return Manifest.from_bytes((await db.catalog.get(manifest_key(d.table_id, 0))).value)


async def test_a_node_that_lost_its_partition_publishes_nothing(caplog):
    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    d = await n1.create_table("m", SCHEMA, indexes=["name"])
    await n1.upsert("m", rows(range(200), seed=1))
    await n1.checkpoint()
    m = await manifest(n1, d)
    assert (m.owner, m.epoch) == ("n1", 1)
    await n1.upsert("m", rows(range(100), v=2.0))  # superseded versions: garbage for a pass
    await n1.seal()
    await n1.offload()
    stale = (await n1.tables.table(d)).parts[0]
    await n2.tables.table(d)  # open on n2, without the partition
    # n1 is paused (it never released the partition); the placement moves to n2 at epoch 2
    w.owner, w.epoch = "n2", 2
    assert await n2.handoffs.take(d, 0, 2)
    before = await n1.catalog.get(manifest_key(d.table_id, 0))
    assert (Manifest.from_bytes(before.value).owner, Manifest.from_bytes(before.value).epoch) == ("n2", 2)
    await n1.upsert("m", rows([7000]))  # n1 still believes it serves partition 0 (a stale leader)
    with pytest.raises(ConflictError):
        await stale.checkpoint()
    n1.reader.retention_ms = n1.reader.purge_lag_ms = 0
    out = await n1.collect_garbage()  # the pass abandons the partition: nothing retired or deleted
    assert out["retired"] == [] and out["deleted"] == []
    assert "gc_partition_abandoned" in caplog.text
    after = await n1.catalog.get(manifest_key(d.table_id, 0))
    assert after.version == before.version  # nothing n1 did after the claim was published
    got = ids_and_v((await n2.query("m", limit=None))[0])
    assert len(got) == 200 and all(v == 2.0 for i, v in got if i < 100)
    await n1.close()
    await n2.close()


async def test_an_older_epoch_cannot_claim():
    w = Two()
    n1 = await w.start("n1")
    d = await n1.create_table("m", SCHEMA)
    await n1.upsert("m", rows(range(10)))
    await n1.checkpoint()
    part = (await n1.tables.table(d)).parts[0]
    with pytest.raises(FencedError):
        await part.index._claim(Claim("n2", 0))  # below n1's epoch 1
    with pytest.raises(FencedError):
        await part.index._claim(Claim("n2", 1))  # n1's epoch, another node
    await part.index._claim(Claim("n1", 1))  # its own: nothing written
    await n1.close()


async def test_a_collector_leaves_partitions_it_does_not_serve_alone():
    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    d = await n1.create_table("m", SCHEMA)
    await n2.tables.table(d)  # open on n2 too, without the partition
    for v in range(4):
        await n1.upsert("m", rows(range(300), v=float(v)))
        await n1.seal()
        await n1.offload()
    n1.reader.retention_ms = n2.reader.retention_ms = n1.reader.purge_lag_ms = n2.reader.purge_lag_ms = 0
    segs = {r.segid: r.state for r in await n1.store.list()}
    out = await n2.collect_garbage()
    assert out["retired"] == [] and out["deleted"] == []
    assert {r.segid: r.state for r in await n1.store.list()} == segs
    out = await n1.collect_garbage()  # the serving node collects them
    assert out["segments_collected"] >= 1
    assert ids_and_v((await n1.query("m", limit=None))[0]) == [(i, 3.0) for i in range(300)]
    await n1.close()
    await n2.close()


async def test_a_dropped_table_is_reclaimed_once_by_one_node():
    """Both nodes run passes after a drop: one takes the reclaim row and deletes the objects
    and indexes; the other deletes only its own local segments; nothing fails, nothing is left."""
    from rowstore.db.background.gc import RECLAIM_PREFIX

    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    for db in (n1, n2):
        db.gc.cfg = type(db.gc.cfg)(min_garbage=0.5, grace_s=0.0)
        db.reader.retention_ms = db.reader.purge_lag_ms = 0
    d = await n1.create_table("m", SCHEMA)
    await n2.tables.table(d)
    await n1.upsert("m", rows(range(300)))
    await n1.seal()
    await n1.offload()
    await n1.upsert("m", rows(range(50)))  # an active segment too (n1's own, local)
    await n1.checkpoint()
    dropped = await n1.drop_table("m")
    for db in (n1, n2):
        db.clock.observe(dropped.ts)  # both clocks past the drop (the horizon is now: retention 0)
    while min(n1.horizon(), n2.horizon()) <= dropped.ts:  # the wall clock past the drop's millisecond
        await asyncio.sleep(0.001)
    out2 = await n2.collect_garbage()  # first: n2 takes the reclaim row
    doc = json.loads((await n2.catalog.get(f"{RECLAIM_PREFIX}{d.table_id}")).value)
    assert doc["node"] == "n2" and not doc["done"]
    left = {r.segid: (r.owner, r.state.value) for r in await n2.store.list(table=d.table_id)}
    assert set(out2["deleted"]) and all(o == "n1" and s != "retired" for o, s in left.values()), left
    await n1.collect_garbage()  # n1 retires and deletes its own local segment
    await n2.collect_garbage()  # n2 sees nothing left: done
    assert await n1.store.list(table=d.table_id) == []
    assert not await n1.catalog.scan(f"idx/{d.table_id}/")
    assert json.loads((await n2.catalog.get(f"{RECLAIM_PREFIX}{d.table_id}")).value)["done"]
    await n1.close()
    await n2.close()
