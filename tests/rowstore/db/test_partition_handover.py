"""A writer that took a partition's segment just before this node stopped serving it (a
demotion closes the partition's files between ``current()`` and ``append``): the write fails
whole as ``unavailable`` — retryable — never as a storage error, and nothing is appended. A
read that found the partition's rowids before the demotion meets the same (the nemesis suite
saw a 500 ``segment … is sealed, not offloaded``), and the offloader skips the sealed segments
whose files were released (it failed on them, every segment after them left on the device)."""
import pytest

from rowstore.codec.rows import encode_rows
from rowstore.errors import UnavailableError
from rowstore.db.partition import Partition
from tests.rowstore.segments.test_segments import S1, batch
from tests.rowstore.segments.test_store import World


async def _world():
    store = await World().start()
    part = Partition(store, "t", 0, "int64", [])
    return store, part


async def test_a_write_whose_segment_closed_under_it_is_unavailable():
    store, part = await _world()
    seg = await part.current()
    ids = await (await part.append(seg, encode_rows(batch(0, 10), S1, 5), 5))
    assert len(ids) == 10
    seg2 = await part.current()  # a writer holds the segment ...
    for inode in store.release_local("t", 0):  # ... while the partition is handed over (Leadership._demote)
        await store.fs.close_active(inode)
    task = await part.append(seg2, encode_rows(batch(10, 20), S1, 6), 6)
    with pytest.raises(UnavailableError, match="retry"):
        await task
    assert seg.durable_rows == 10


async def test_a_retired_partition_refuses_before_enqueueing():
    store, part = await _world()
    seg = await part.current()
    part.retired = True
    with pytest.raises(UnavailableError, match="no longer led"):
        await (await part.append(seg, encode_rows(batch(0, 10), S1, 5), 5))
    assert seg.durable_rows == 0 and seg.file.durable_size == 0


async def _demoted(store) -> None:
    """What ``Leadership._demote`` does to the store, in its order."""
    store.not_led.add(("t", 0))
    for inode in store.release_local("t", 0):
        await store.fs.close_active(inode)


@pytest.mark.parametrize("state", ["active", "sealed"])
async def test_a_read_of_a_partition_demoted_under_it_is_unavailable(state):
    store, part = await _world()
    seg = await part.current()
    ids = await (await part.append(seg, encode_rows(batch(0, 10), S1, 5), 5))
    if state == "sealed":
        await store.seal(seg.segid)
    assert (await store.get(ids[:2], S1)).batch.column("id").to_pylist() == [0, 1]
    await _demoted(store)
    with pytest.raises(UnavailableError, match="no longer led.*retry"):
        await store.get(ids[:2], S1)
    with pytest.raises(UnavailableError, match="no longer led.*retry"):
        await store.row_bytes(int(ids[0]))


async def test_the_offloader_skips_sealed_segments_released_by_a_demotion():
    store, part = await _world()
    seg = await part.current()
    await (await part.append(seg, encode_rows(batch(0, 10), S1, 5), 5))
    await store.seal(seg.segid)
    assert await store.pending_offload() == [seg.segid]
    await _demoted(store)
    assert await store.pending_offload() == []
