"""Writes outrunning the checkpoints wait for one (a write stall): memtables stay within
their stall limit, every acknowledged row is there; a checkpoint that cannot run (its object
store failing) refuses the write, which changes nothing."""
import numpy as np
import pytest

from rowstore.db.background.maintenance import STALL
from terrafs.backends.memory import MemoryObjectStore
from terrafs.errors import StorageIOError
from terrafs.faults import FaultyObjectStore
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows

BUDGET = 64 << 10


async def test_memtables_stay_within_the_stall_limit_and_lose_nothing():
    db = await TablesWorld(partitions=2, memtable_bytes=BUDGET).start()
    await db.create_table("t", SCHEMA, indexes=["name", "v", "loc"])
    most, step = 0, 500
    for lo in range(0, 12_000, step):
        await db.upsert("t", rows(np.arange(lo, lo + step), seed=lo))
        most = max(most, db.memtable_bytes())
    one_batch = 2 * step * 120  # a batch's entries, generously: what may land past the check
    assert db.maintenance.stalls > 0 and most <= STALL * BUDGET + one_batch
    got, _ = await db.read_all("t")
    assert sorted(got.column("id").to_pylist()) == list(range(12_000))
    q, _ = await db.query("t", where=[["name", "=", "name-3"]], limit=None)
    assert sorted(q.column("id").to_pylist()) == [i for i in range(12_000) if i % 13 == 3]


async def test_a_checkpoint_that_cannot_run_refuses_the_write_and_changes_nothing():
    objects = FaultyObjectStore(MemoryObjectStore())
    db = await TablesWorld(partitions=2, memtable_bytes=BUDGET, objects=objects).start()
    await db.create_table("t", SCHEMA)
    lo = 0
    while db.memtable_bytes() <= STALL * BUDGET:
        await db.upsert("t", rows(np.arange(lo, lo + 500)))
        lo += 500
    objects.plan.p, objects.plan.ops = 1.0, ("put",)  # every put fails from now on
    with pytest.raises(StorageIOError):
        await db.upsert("t", rows(np.arange(lo, lo + 500)))
    objects.plan.p = 0.0
    got, _ = await db.read_all("t")
    assert sorted(got.column("id").to_pylist()) == list(range(lo))  # the refused rows are not there
    await db.upsert("t", rows(np.arange(lo, lo + 500)))  # the store back: the write checkpoints and goes on
    assert db.memtable_bytes() <= STALL * BUDGET + 2 * 500 * 120
    assert (await db.read_all("t"))[0].num_rows == lo + 500


async def test_a_stalled_write_does_not_wait_for_a_partition_a_merge_holds():
    """A merge holds its partition's manifest (its publish lock) for as long as it runs; a
    write past the stall limit checkpoints the other partitions and goes on meanwhile (it
    once chose the held one — no checkpoint could take its memtable, so it grew to be the
    largest — and waited out the merge)."""
    import asyncio
    db = await TablesWorld(partitions=2, memtable_bytes=BUDGET).start()
    await db.create_table("t", SCHEMA)
    held = db.tables.partitions()[0]
    await held.index.publish_lock.acquire()  # a merge of the held partition, running
    try:
        lo = 0
        while db.memtable_bytes() <= STALL * BUDGET:
            await db.upsert("t", rows(np.arange(lo, lo + 500)))
            lo += 500
        await asyncio.wait_for(db.upsert("t", rows(np.arange(lo, lo + 500))), 30)
        assert db.maintenance.stalls > 0 and held.mem_bytes > 0
    finally:
        held.index.publish_lock.release()
    assert (await db.read_all("t"))[0].num_rows == lo + 500
