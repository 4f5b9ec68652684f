"""A partition object this node stopped serving must not touch the partition's log any more
(rowstore/db/partition.py).

The store keys a partition's current segment by (table, partition), while the writer lock
that orders its log belongs to one ``Partition`` object. When a node stops serving a
partition and serves it again (a demotion then a promotion, or a hand-over back), a new
object with a new lock takes over the same log; a background job still holding the old
object — the maintenance round lists the partitions once, then works through them for
seconds — then rolled the segment under the wrong lock. Found by the seeded simulation (seed
4051): the old object sealed and offloaded the segment while the new one held a prepared
``BATCH X``; its ``COMMIT X`` then met a closed file, the sealed object left the batch out
(no COMMIT), and the key index named six rows past the segment's end."""
import secrets

from catalog.abc import Check, Put
from rowstore.db.write.two_phase import COMMITTED, txn_key
from rowstore.segments.store import SegState
from rowstore.segments.wal import DECIDED, SPANS_NODES
from terrafs.catalog_ops import commit
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def test_a_retired_partition_object_neither_rolls_nor_records_progress_in_the_log_it_left():
    w = TablesWorld(partitions=1)
    db = await w.start()
    d = await db.create_table("m", SCHEMA)
    table = await db.tables.table(d)
    stale = table.parts[0]  # what a maintenance round listed before the partition moved
    await db.handoffs.release(d, 0)

    async def switch():
        return True
    assert await db.handoffs.switch(d, 0, switch)  # served no more here
    assert await db.handoffs.take(d, 0, 1)  # and served here again: a new object, a new writer lock
    live = table.parts[0]
    assert live is not stale and stale.retired
    await db.upsert("m", rows(range(10)))
    txn = DECIDED | SPANS_NODES | secrets.randbits(60)
    r = await db.participant.reserve("m", d.table_id, d.schema.version, rows(range(100, 106)), 0, txn)
    await db.participant.prepare(txn, r.ts)  # BATCH X durable; the live writer lock stays held
    seg = await live.current()

    assert await stale.roll() is None
    assert not await stale.progress(r.ts + 10)
    assert not await stale.revive()
    assert (await db.store.record(seg.segid))[0].state == SegState.ACTIVE

    await commit(db.catalog, [Check(txn_key(txn), 0)], [Put(txn_key(txn), COMMITTED)])
    await db.participant.commit(txn)
    await db.seal()
    await db.offload()
    assert (await db.store.record(seg.segid))[0].state == SegState.OFFLOADED
    got, _ = await db.read_all("m")
    assert got.column("id").to_pylist() == [*range(10), *range(100, 106)]
    for k in (0, 9, 100, 105):
        assert (await db.get("m", k))["id"] == k
