"""A one-copy partition moved between two nodes through the object store (rowstore.db.serving.handoff):
every acknowledged row and every past version readable on the new node, writes refused on the
old one from the release on, the new node's commits above the old ones, and a restart of
either side keeping it where the placement says."""
import pyarrow as pa
import pytest

from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from rowstore.errors import UnavailableError
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS
from tests.rowstore.tables_world import SCHEMA, rows


class Two:
    """Two nodes on one catalog and object store; ``owner`` is the placement (one partition)."""

    def __init__(self):
        self.cat, self.objects = MemoryCatalog(), MemoryObjectStore()
        self.blocks = {n: MemoryBlockDevice() for n in ("n1", "n2")}
        self.owner, self.epoch = "n1", 1

    async def start(self, node: str) -> Database:
        fs = TerrascaleFS(self.cat, self.blocks[node], MemoryBlockDevice(durable=False), self.objects,
                          config=FsConfig(node_id=node, sealed_block_size=4096, flush=ActiveConfig(flush_ms=0.5)))
        await fs.open()
        db = Database(fs, TablesConfig(partitions=1))

        async def owns(d):
            return {0: self.epoch} if self.owner == node else {}
        await db.open(owns)
        return db


def ids_and_v(t: pa.Table):
    return list(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


async def test_a_partition_moves_whole_with_its_history():
    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    d = await n1.create_table("m", SCHEMA, indexes=["name"])
    await n2.tables.table(d)  # n2 has the table open, without the partition
    t1 = (await n1.upsert("m", rows(range(300), seed=1))).commit_ts
    await n1.seal()
    await n1.offload()  # some rows in objects already, the rest in the active segment and memtable
    t2 = (await n1.upsert("m", rows(range(100, 200), v=7.0))).commit_ts
    t3 = (await n1.delete("m", list(range(0, 20)))).commit_ts
    want = {T: ids_and_v((await n1.query("m", as_of=T, limit=None))[0]) for T in (t1, t2, t3)}
    top = await n1.handoffs.release(d, 0)
    assert top == t3
    with pytest.raises(UnavailableError):  # released: writes refused here, whole
        await n1.upsert("m", rows([5000]))
    assert ids_and_v((await n1.query("m", limit=None))[0]) == want[t3]  # still readable until forgotten

    async def switch():  # the placement switch (the node layer's compare-and-set)
        w.owner, w.epoch = "n2", 2
        return True
    assert await n1.handoffs.switch(d, 0, switch)
    with pytest.raises(UnavailableError):  # no longer served here
        await n1.query("m", limit=None, partitions=[0])
    assert (await n1.tables.table(d)).parts[0].index.moved is False  # a fresh, unopened one
    assert await n2.handoffs.take(d, 0, 2) and not await n2.handoffs.take(d, 0, 2)
    for T, rowsT in want.items():
        assert ids_and_v((await n2.query("m", as_of=T, limit=None))[0]) == rowsT
    got = await n2.query("m", where=[["name", "=", "name-3"]], limit=None)  # the column index came along
    assert got[0].num_rows == sum(1 for i, _ in want[t3] if i % 13 == 3)
    t4 = (await n2.upsert("m", rows([5000, 21], v=1.5))).commit_ts
    assert t4 > t3  # the new node commits above every commit of the partition
    assert (await n2.get("m", 21))["v"] == 1.5 and await n2.get("m", 5) is None
    with pytest.raises(UnavailableError):
        await n1.upsert("m", rows([6000]))
    await n1.close()
    await n2.close()
    n1, n2 = await w.start("n1"), await w.start("n2")  # restarts: the partition stays on n2
    assert (await n2.get("m", 5000))["v"] == 1.5
    assert ids_and_v((await n2.query("m", as_of=t3, limit=None))[0]) == want[t3]
    with pytest.raises(UnavailableError):
        await n1.upsert("m", rows([6000]))
    await n1.close()
    await n2.close()


async def test_a_release_that_fails_takes_writes_again():
    w = Two()
    n1 = await w.start("n1")
    d = await n1.create_table("m", SCHEMA)
    await n1.upsert("m", rows(range(50)))
    broken = n1.store.offload

    async def failing(*a, **k):
        raise OSError("object store down")
    n1.store.offload = failing
    with pytest.raises(OSError):
        await n1.handoffs.release(d, 0)
    n1.store.offload = broken
    await n1.upsert("m", rows([77]))  # still this node's, taking writes
    assert (await n1.query("m", limit=None))[0].num_rows == 51
    await n1.handoffs.release(d, 0)

    async def refused():  # the placement changed meanwhile: the compare-and-set failed
        return False
    assert not await n1.handoffs.switch(d, 0, refused)
    await n1.upsert("m", rows([78]))  # takes writes again
    assert (await n1.query("m", limit=None))[0].num_rows == 52
    await n1.seal()
    await (await n1.tables.table(d)).parts[0].current()  # an empty active segment: sealed and offloaded too
    await n1.handoffs.release(d, 0)
    recs = await (await n1.tables.table(d)).parts[0].segments()
    assert recs and all(r.state.value == "offloaded" for r in recs), recs
    await n1.close()


async def test_after_a_restart_the_new_node_still_commits_above_the_old_nodes_commits():
    """The old node's clock ran ahead (it observed a later timestamp); the partition moves and
    the new node restarts: its next delete must still be newer than the old node's upsert
    (it was not: the restart opened the partition without observing its commits)."""
    from rowstore.hlc import ts_from_ms

    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    d = await n1.create_table("m", SCHEMA)
    await n2.tables.table(d)
    n1.clock.observe(n1.clock._last + ts_from_ms(3000))  # n1's clock 3 s ahead of n2's
    t1 = (await n1.upsert("m", rows([5]))).commit_ts
    await n1.handoffs.release(d, 0)

    async def switch():
        w.owner, w.epoch = "n2", 2
        return True
    assert await n1.handoffs.switch(d, 0, switch)
    assert await n2.handoffs.take(d, 0, 2)
    await n2.close()
    n2 = await w.start("n2")  # restarted: the partition is opened with the table
    t2 = (await n2.delete("m", [5])).commit_ts
    assert t2 > t1
    assert await n2.get("m", 5) is None
    await n1.close()
    await n2.close()


async def test_a_switch_that_fails_after_its_compare_and_set_leaves_one_owner():
    """The placement's compare-and-set committed, then the call raised (its answer lost, the
    cache refresh failed): the old node must not take writes again — the new one serves the
    partition now. It stops serving; were the switch not done, its reconcile takes it back."""
    w = Two()
    n1, n2 = await w.start("n1"), await w.start("n2")
    d = await n1.create_table("m", SCHEMA)
    await n2.tables.table(d)
    await n1.upsert("m", rows(range(50)))
    await n1.handoffs.release(d, 0)

    async def switch():
        w.owner, w.epoch = "n2", 2  # committed ...
        raise ConnectionError("the catalog's answer was lost")  # ... but the caller cannot tell
    with pytest.raises(ConnectionError):
        await n1.handoffs.switch(d, 0, switch)
    with pytest.raises(UnavailableError):  # not two owners: n1 takes no writes
        await n1.upsert("m", rows([7000]))
    assert await n2.handoffs.take(d, 0, 2)
    assert (await n2.upsert("m", rows([7000]))).count == 1
