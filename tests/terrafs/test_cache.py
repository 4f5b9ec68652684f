"""The block cache: the many-key lookups, the disk tier's bounds, its fresh start."""
import asyncio

from terrafs.cache import BlockCache


def test_get_mem_many_returns_held_blocks_and_refreshes_them():
    c = BlockCache(memory_bytes=4 * (100 + 64))
    for i in range(4):
        c.put_mem(("f", i), bytes([i]) * 100)
    assert c.get_mem_many([("f", 0), ("f", 9), ("f", 2)]) == {("f", 0): bytes(100), ("f", 2): b"\x02" * 100}
    assert c.stats["mem_hits"] == 2
    c.put_mem(("f", 4), b"x" * 100)  # evicts the least recent: 1 (0 and 2 were just read)
    c.put_mem(("f", 5), b"y" * 100)  # then 3
    assert sorted(k for _, k in c.get_mem_many([("f", i) for i in range(6)])) == [0, 2, 4, 5]


async def test_disk_tier_writes_go_in_batches_and_read_back(tmp_path):
    """Many blocks put at once (a cold full scan) are written by one task in batches — each batch
    one worker-thread hop on a local device — and every one reads back; the tier's budget still
    evicts the oldest files."""
    from terrafs.backends.local import LocalBlockDevice
    from terrafs.cache import WRITE_BATCH

    dev = LocalBlockDevice(str(tmp_path), durable=False)
    hops = []
    real = dev.write_files

    async def counted(items):
        hops.append(len(items))
        await real(items)
    dev.write_files = counted
    c = BlockCache(volatile=dev, volatile_bytes=150 * 1000)
    await c.open()
    for i in range(200):
        c.put_disk(("obj", i), bytes([i % 256]) * 1000)
    assert len(c._writes) == 1  # one writer task, not one per block
    await c.drain()
    assert sum(hops) == 200 and max(hops) <= WRITE_BATCH and len(hops) == -(-200 // WRITE_BATCH)
    assert await c.get_disk(("obj", 0)) is None  # evicted: the tier holds 150 of them
    assert await c.get_disk(("obj", 199)) == bytes([199]) * 1000
    assert len([n for n in await dev.list("") if not n.endswith(".tmp")]) == 150
    await asyncio.sleep(0)


async def test_a_failed_disk_batch_costs_only_a_refetch(tmp_path):
    from terrafs.backends.local import LocalBlockDevice

    dev = LocalBlockDevice(str(tmp_path), durable=False)
    c = BlockCache(volatile=dev)
    fail = [True]
    real = dev.write_files

    async def flaky(items):
        if fail[0]:
            fail[0] = False
            raise OSError("disk full")
        await real(items)
    dev.write_files = flaky
    c.put_disk(("a", 1), b"x" * 10)
    await c.drain()
    assert await c.get_disk(("a", 1)) is None  # never held: a miss, refetched by the caller
    c.put_disk(("a", 2), b"y" * 10)
    await c.drain()
    assert await c.get_disk(("a", 2)) == b"y" * 10


async def test_records_waiting_for_the_device_are_bounded(tmp_path):
    """A read faster than the device (a cold scan) leaves the records past the bound uncached
    rather than holding them all in memory; once written, the room is there again."""
    from unittest import mock

    import terrafs.cache as cache
    from terrafs.backends.local import LocalBlockDevice

    c = BlockCache(volatile=LocalBlockDevice(str(tmp_path), durable=False))
    await c.open()
    with mock.patch.object(cache, "PENDING_BYTES", 5000):
        for i in range(10):
            c.put_disk(("obj", i), bytes(1000))
        assert len(c._pending) == 5 and c.stats["disk_skipped"] == 5
        await c.drain()
        c.put_disk(("obj", 10), bytes(1000))
        await c.drain()
    assert [await c.get_disk(("obj", i)) is not None for i in (0, 4, 5, 9, 10)] == [True, True, False, False, True]


async def test_a_start_does_not_wait_for_the_last_runs_cache_files(tmp_path, monkeypatch):
    """The last run's cached blocks are never read again and are deleted in the background,
    a batch per worker-thread hop, while this run caches its own under a new directory (the
    deletion at open, tens of thousands of files, took 3–19 s of a restart at 30–50M rows);
    other files of the device stay; a close stops the sweep and the next open finishes it."""
    from terrafs import cache as cache_mod
    from terrafs.backends.local import LocalBlockDevice
    from terrafs.cache import CACHE_DIR

    monkeypatch.setattr(cache_mod, "SWEEP_BATCH", 64)
    dev = LocalBlockDevice(str(tmp_path), durable=False)
    await dev.write_files([(f"{CACHE_DIR}/{i % 7:02d}/{i:08x}", b"x") for i in range(300)] + [("keep/me", b"y")])
    gate, hops = asyncio.Event(), []
    delete_files = dev.delete_files

    async def counted(names):
        hops.append(len(names))
        await gate.wait()
        await delete_files(names)

    monkeypatch.setattr(dev, "delete_files", counted)
    c = BlockCache(volatile=dev)
    await c.open("g1")  # returns before the sweep deletes anything
    c.put_disk(("obj", 0), b"new block")
    await c.drain()
    assert await c.get_disk(("obj", 0)) == b"new block"

    async def first_hop():
        while not hops:  # the old files listed (a worker thread), the first batch held
            await asyncio.sleep(0.01)
    await asyncio.wait_for(first_hop(), 10)
    await c.close()  # stops the sweep in its first hop
    assert hops == [64] and len(await dev.list("")) == 302
    gate.set()
    again = BlockCache(volatile=dev)
    await again.open("g2")

    async def swept():
        while await dev.list("") != ["keep/me"]:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(swept(), 10)  # the last run's block too
    assert hops == [64, 64, 64, 64, 64, 45] and await again.get_disk(("obj", 0)) is None
    await again.close()
