"""A disk error (EIO on a write or an fdatasync): the failed write answers an error and changes
nothing, queries go on (the change feed answers 503 while a failed file holds unwritten
records), and once the device works again writing
resumes by itself — the failed file cut back to its last durable group, never trusting what
the failed group left in the page cache ("fsyncgate") — and a restart finds every acknowledged
row and none of the refused ones. (Replicated partitions step down instead: tests/sim.)"""
import errno

import pytest

from rowstore.errors import RowstoreError
from rowstore.segments.store import SegmentStore
from terrafs.backends.memory import MemoryDeviceFile
from terrafs.errors import TerrafsError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


async def values(db) -> dict[int, float]:
    t, _ = await db.query("m", columns=["id", "v"], limit=None)
    return dict(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


async def feed(db) -> set[int]:
    t, _ = await db.changes("m", 0)
    return set(t.column("id").to_pylist())


async def test_a_disk_error_refuses_writes_serves_reads_and_resumes_once_the_disk_works():
    w = TablesWorld(1)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(100), v=1.0))
    acked = {k: 1.0 for k in range(100)}
    w.block.broken = True
    for _ in range(2):
        with pytest.raises((RowstoreError, TerrafsError)):
            await db.upsert("m", rows(range(100, 110), v=-1.0))
    assert await values(db) == acked  # queries go on
    with pytest.raises(TerrafsError):  # the feed cannot tell a refused batch from a committed one
        await feed(db)  # whose COMMIT the failed group held: DeviceError (503) until revived
    out = await db.resume_writes()
    assert out["revived"] == 0 and out["still_failing"] == 1  # the device still fails the cut
    with pytest.raises((RowstoreError, TerrafsError)):
        await db.upsert("m", rows(range(100, 110), v=-1.0))
    w.block.broken = False
    assert (await db.resume_writes())["revived"] == 1
    await db.upsert("m", rows(range(200, 300), v=2.0))
    acked.update({k: 2.0 for k in range(200, 300)})
    assert await values(db) == acked and await feed(db) == set(acked)
    w.crash()  # power loss: nothing acknowledged lost, nothing refused appears
    db = await w.start()
    assert await values(db) == acked


async def test_a_group_whose_fdatasync_failed_is_cut_away_before_writing_resumes(monkeypatch):
    """The group's bytes reached the device, its fdatasync failed: they must not count (the
    write was refused), even though reading the file back would find them whole."""
    w = TablesWorld(1)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(50), v=1.0))

    async def failing_sync(self):
        raise OSError(errno.EIO, "Input/output error")
    with monkeypatch.context() as m:
        m.setattr(MemoryDeviceFile, "sync", failing_sync)  # writes land, fdatasync fails
        with pytest.raises((RowstoreError, TerrafsError)):
            await db.upsert("m", rows(range(50, 60), v=-1.0))
    assert (await db.resume_writes())["revived"] == 1
    assert await values(db) == {k: 1.0 for k in range(50)}
    await db.upsert("m", rows(range(60, 70), v=2.0))
    want = {**{k: 1.0 for k in range(50)}, **{k: 2.0 for k in range(60, 70)}}
    assert await values(db) == want
    w.crash()
    db = await w.start()
    assert await values(db) == want


async def test_a_seal_that_fails_at_the_disk_leaves_nothing_behind_once_the_disk_works():
    """A batch over two partitions is acknowledged with its ``COMMIT`` records still buffered
    (appended lazily); the disk breaks and a seal flushes them: the flush fails after the
    segments stopped being current. The change feed refuses (it would leave the committed
    batch out) until the failed segments are revived — found by the simulation (seed 171):
    only a partition's *current* segment counted as failed, so these were never revived."""
    w = TablesWorld(2)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    await db.upsert("m", rows(range(40), v=1.0))
    w.block.broken = True  # the COMMITs of that batch are still in the buffer
    with pytest.raises(TerrafsError):
        await db.seal()
    assert await values(db) == {k: 1.0 for k in range(40)}  # queries go on
    with pytest.raises(TerrafsError):
        await feed(db)  # DeviceError (503): it would miss the batch
    assert db.can_write() is False
    w.block.broken = False
    assert (await db.resume_writes())["revived"] >= 1
    assert db.can_write() is True
    assert await feed(db) == set(range(40))
    await db.upsert("m", rows(range(40, 50), v=2.0))
    want = {**{k: 1.0 for k in range(40)}, **{k: 2.0 for k in range(40, 50)}}
    assert await values(db) == want
    w.crash()
    db = await w.start()
    assert await values(db) == want and await feed(db) == set(range(50))


async def test_rows_in_a_segment_whose_create_failed_at_the_disk_survive_a_checkpoint_and_two_crashes(monkeypatch):
    """The first segment's row is committed, its file's creation fails at the disk (and the
    row stays: its removal failed too): the partition has no current segment, and a checkpoint
    then must not move the replay mark past that active row — a restart takes it up, rows land
    in it, and after a crash before the next checkpoint the replay would skip them (simulation
    seed 53719, where a promotion adopted such a segment: three acknowledged batches lost a
    partition's share)."""
    async def left(*a):
        return None
    monkeypatch.setattr(SegmentStore, "_forget_created", left)
    w = TablesWorld(1)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    w.block.broken = True
    with pytest.raises((RowstoreError, TerrafsError)):
        await db.upsert("m", rows(range(10), v=-1.0))
    w.block.broken = False
    await db.checkpoint()
    w.crash()
    db = await w.start()
    await db.upsert("m", rows(range(20), v=1.0))
    w.crash()  # before any checkpoint: the replay is all that indexes these rows
    db = await w.start()
    assert await values(db) == {k: 1.0 for k in range(20)}


async def test_a_disk_that_fails_every_create_leaves_no_segment_rows():
    """Each write while the disk fails creates a segment: its row is committed, its file is
    refused. The rows go again, so a failing disk does not pile up active rows — simulation
    seed 70455 left 164, and every promotion's adoption (one transaction over the partition's
    active rows) went past the catalog's 256 parts, for ever."""
    w = TablesWorld(1)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    w.block.broken = True
    for _ in range(5):
        with pytest.raises((RowstoreError, TerrafsError)):
            await db.upsert("m", rows(range(10), v=-1.0))
    assert await db.store.list() == []
    w.block.broken = False
    await db.upsert("m", rows(range(10), v=1.0))
    assert len(await db.store.list()) == 1 and await values(db) == {k: 1.0 for k in range(10)}
