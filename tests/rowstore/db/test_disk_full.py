"""A full block device (ENOSPC): writes answer ``NoSpaceError`` (507 at the edge) and change
nothing, reads go on, and writing resumes by itself once space comes back — without a
restart, with localids that match the file (a restart afterwards finds every acknowledged
row and none of the refused ones)."""
import pytest

from terrafs.errors import NoSpaceError
from tests.rowstore.tables_world import SCHEMA, TablesWorld, rows


def used(dev) -> int:
    """Bytes the files of an in-memory device hold."""
    return sum(len(d.buf) for d in dev._files.values())


async def table_world(partitions: int = 1, **cfg):
    w = TablesWorld(partitions, **cfg)
    db = await w.start()
    await db.create_table("m", SCHEMA)
    return w, db


async def fill(db, start: int = 0, step: int = 200) -> tuple[dict[int, float], int]:
    """Write batches of ``step`` keys until the device refuses one; the acknowledged ones."""
    acked, i = {}, start
    while True:
        try:
            await db.upsert("m", rows(range(i, i + step), v=float(i)))
        except NoSpaceError:
            return acked, i
        acked.update({k: float(i) for k in range(i, i + step)})
        i += step


async def values(db) -> dict[int, float]:
    t, _ = await db.query("m", columns=["id", "v"], limit=None)
    return dict(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


async def test_a_full_device_refuses_writes_serves_reads_and_resumes_once_space_is_back():
    w, db = await table_world(1, resume_free_bytes=64 << 10)
    w.block.capacity = used(w.block) + (400 << 10)
    acked, refused = await fill(db)
    assert acked and db.space()["writable"] is False
    for _ in range(3):  # refused again at once, nothing written
        with pytest.raises(NoSpaceError):
            await db.upsert("m", rows(range(refused, refused + 10), v=-1.0))
    assert await values(db) == acked  # reads go on
    with pytest.raises(NoSpaceError):
        await db.seal()  # sealing writes too: refused, the segment stays current
    assert await db.resume_writes() == {"stepped_down": 0, "revived": 0,
                                        "waiting_for_bytes": (64 << 10) - db.space()["free_bytes"]}
    w.block.capacity += 1 << 20  # the device grew (or offload freed space)
    assert (await db.resume_writes())["revived"] == 1
    assert db.space()["writable"] is True
    for i in range(refused + 1000, refused + 2000, 200):  # writes go on where the file really ends
        await db.upsert("m", rows(range(i, i + 200), v=float(i)))
        acked.update({k: float(i) for k in range(i, i + 200)})
    assert await values(db) == acked
    await db.seal()
    w.crash()  # power loss: nothing acknowledged lost, nothing refused appears
    db = await w.start()
    assert await values(db) == acked


async def test_a_refused_group_never_becomes_visible_after_a_restart():
    w, db = await table_world(1)
    w.block.capacity = used(w.block) + (200 << 10)
    acked, _ = await fill(db)
    w.block.capacity = None  # space is back, but the node dies before it revives anything
    w.crash()
    db = await w.start()
    assert await values(db) == acked


async def test_a_segment_born_on_a_full_device_takes_writes_once_space_is_back():
    """The device is full when a partition needs a new segment: its file exists, its header
    could not be written. Writes answer NoSpaceError; once space is back the file is born again
    (nothing was ever appended to it) and writes go on; a restart then finds it whole."""
    w, db = await table_world(1, resume_free_bytes=1 << 10)
    await db.upsert("m", rows(range(100), v=1.0))
    await db.seal()  # the next write needs a new segment
    w.block.capacity = used(w.block)  # not one byte free
    with pytest.raises(NoSpaceError):
        await db.upsert("m", rows(range(100, 110), v=2.0))
    assert db.space()["writable"] is False
    w.block.capacity = None
    assert (await db.resume_writes())["revived"] == 1
    await db.upsert("m", rows(range(100, 110), v=2.0))
    want = {**{k: 1.0 for k in range(100)}, **{k: 2.0 for k in range(100, 110)}}
    assert await values(db) == want
    w.crash()
    db = await w.start()
    assert await values(db) == want


async def test_a_file_whose_header_never_became_durable_is_recreated_at_restart():
    w, db = await table_world(1)
    await db.upsert("m", rows(range(10), v=1.0))
    await db.seal()
    w.block.capacity = used(w.block)
    with pytest.raises(NoSpaceError):
        await db.upsert("m", rows(range(10, 20), v=2.0))
    w.block.capacity = None
    w.crash()  # killed before it revived anything: a catalog row whose file has no header
    db = await w.start()
    assert await values(db) == {k: 1.0 for k in range(10)}
    await db.upsert("m", rows(range(10, 20), v=2.0))
    assert len(await values(db)) == 20
