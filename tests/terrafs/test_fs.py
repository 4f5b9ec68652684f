"""TerrascaleFS namespace: inodes, create/seal/offload/read/delete, crash at every step."""
import asyncio
import os

import pytest

from catalog.abc import Check, Put
from catalog.memory import MemoryCatalog
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import CatalogConflictError, FileStateError, InodeNotFoundError, StorageIOError
from terrafs.failpoints import FailPointCrash, armed
from terrafs.faults import FaultyObjectStore, InjectedFault
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.ranges import DoubleFreeError, RangeAllocator
from terrafs.records import FileState, FileTier

CFG = FsConfig(node_id="n1", sealed_block_size=4096, flush=ActiveConfig(flush_ms=0.5))


class World:
    """Stores that outlive a 'process' (a TerrascaleFS instance), for crash tests."""

    def __init__(self, kek=None, objects=None):
        self.catalog = MemoryCatalog()
        self.block = MemoryBlockDevice()
        self.volatile = MemoryBlockDevice(durable=False)
        self.objects = objects or MemoryObjectStore()
        self.kek = kek

    async def start(self) -> TerrascaleFS:
        fs = TerrascaleFS(self.catalog, self.block, self.volatile, self.objects, kek=self.kek, config=CFG)
        self.report = await fs.open()
        return fs

    def crash(self):
        self.block.crash()
        self.volatile.crash()


@pytest.fixture
async def world():
    w = World()
    await w.catalog.open()
    return w


async def test_lifecycle(world):
    fs = await world.start()
    af = await fs.create()
    data = os.urandom(30_000)
    await af.append(data)
    rec = await fs.stat(af.inode)
    assert (rec.state, rec.tier, rec.owner) == (FileState.ACTIVE, FileTier.BLOCK, "n1")
    rec = await fs.seal(af.inode)
    assert rec.state == FileState.SEALED and rec.size == 30_000
    with pytest.raises(FileStateError):
        await af.append(b"more")
    assert await fs.read(af.inode, 100, 50) == data[100:150]
    rec = await fs.offload(af.inode)
    assert rec.tier == FileTier.OBJECT and rec.object_size > 0
    assert await world.block.list("files/") == []
    assert await fs.read(af.inode, 29_990, 100) == data[29_990:]
    await fs.delete(af.inode)
    with pytest.raises(InodeNotFoundError):
        await fs.stat(af.inode)
    assert await world.objects.list("files/") == []
    await fs.close()


async def test_offload_with_rewritten_content(world):
    fs = await world.start()
    af = await fs.create()
    await af.append(b"wal-bookkeeping|row1|row2")
    await fs.seal(af.inode)

    async def rows_only():
        yield b"row1"
        yield b"row2"

    rec = await fs.offload(af.inode, rows_only())
    assert rec.size == 8 and await fs.read(af.inode, 0, 100) == b"row1row2"


async def test_create_sealed_from_stream(world):
    fs = await world.start()

    async def gen():
        for i in range(100):
            yield b"%05d" % i

    rec = await fs.create_sealed(gen())
    assert rec.state == FileState.SEALED and rec.tier == FileTier.OBJECT and rec.size == 500
    assert await fs.read(rec.inode, 5, 5) == b"00001"


async def test_concurrent_allocators_never_share_an_inode(world):
    fs = await world.start()
    files = await asyncio.gather(*(fs.create() for _ in range(64)))
    inodes = [f.inode for f in files]
    assert len(set(inodes)) == 64
    # Free half, allocate again: recycled, still unique.
    await asyncio.gather(*(fs.delete(i) for i in inodes[:32]))
    more = await asyncio.gather(*(fs.create() for _ in range(64)))
    live = inodes[32:] + [f.inode for f in more]
    assert len(set(live)) == 96
    assert len(await fs.list()) == 96


async def test_two_filesystems_share_one_catalog(world):
    """Two nodes allocating concurrently through one catalog never collide."""
    a = await world.start()
    b = TerrascaleFS(world.catalog, MemoryBlockDevice(), MemoryBlockDevice(), world.objects,
                     config=FsConfig(node_id="n2"))
    await b.open()
    got = await asyncio.gather(*(x.create() for x in [a, b] * 40))
    assert len({f.inode for f in got}) == 80


async def test_free_ranges_merge_back(world):
    alloc = RangeAllocator(world.catalog, "t", 1, 1001, stripes=1)
    await alloc.init()
    ids = [await alloc.allocate() for _ in range(10)]
    assert ids == list(range(1, 11))
    for i in [3, 5, 4, 1, 2]:
        await alloc.free(i)
    assert await alloc.free_ranges() == [(1, 6), (11, 1001)]
    with pytest.raises(DoubleFreeError):
        await alloc.free(4)
    for i in [6, 8, 7, 10, 9]:
        await alloc.free(i)
    assert await alloc.free_ranges() == [(1, 1001)]


async def test_allocations_racing_for_one_range_row_both_get_an_id(world):
    """Two allocations that picked the same free range row before either committed: the second
    fails its check of that row and of the id's own row (which the first just wrote) — a race,
    retried, not the caller's checks failing (a GC pass on three nodes failed on it)."""
    class Yielding(MemoryCatalog):
        async def txn(self, *a, **k):
            await asyncio.sleep(0)  # both reserve before either commits
            return await super().txn(*a, **k)

    cat = Yielding()
    await cat.open()
    alloc = RangeAllocator(cat, "t", 1, 1001, stripes=1)
    await alloc.init()

    def row(i):
        return [Check(f"t/row/{i}", 0)], [Put(f"t/row/{i}", b"x")]

    got = await asyncio.gather(alloc.allocate(row), alloc.allocate(row))
    assert sorted(got) == [1, 2]
    with pytest.raises(CatalogConflictError):  # a check of the caller's that fails on its own still fails
        await alloc.allocate(lambda i: ([Check("t/row/1", 0)], []))


async def test_encrypted_fs_has_no_plaintext_anywhere(world):
    world.kek = KeyEncryptionKey(os.urandom(32))
    fs = await world.start()
    af = await fs.create()
    secret = b"sensor=thermo-42;celsius=21.5;" * 500
    await af.append(secret)
    await fs.seal(af.inode)
    raw_block = await world.block.read_file((await fs.stat(af.inode)).location)
    assert b"thermo-42" not in raw_block
    rec = await fs.offload(af.inode)
    assert b"thermo-42" not in await world.objects.get(rec.location)
    assert await fs.read(af.inode, 0, len(secret)) == secret
    await fs.cache.drain()
    for name in await world.volatile.list():
        assert b"thermo-42" not in await world.volatile.read_file(name)


@pytest.mark.parametrize("point", ["offload.before_upload", "offload.after_upload", "offload.after_catalog"])
async def test_crash_during_offload_recovers(world, point):
    fs = await world.start()
    af = await fs.create()
    data = os.urandom(20_000)
    await af.append(data)
    await fs.seal(af.inode)
    with armed(point), pytest.raises(FailPointCrash):
        await fs.offload(af.inode)
    world.crash()  # the process dies; a new one starts from the same stores
    fs2 = await world.start()
    rec = await fs2.stat(af.inode)
    if point == "offload.after_catalog":
        assert rec.tier == FileTier.OBJECT  # new state; leftover local file removed
        assert world.report.local_deleted
    else:
        assert rec.tier == FileTier.BLOCK and world.report.pending_offload == [af.inode]
        rec = await fs2.offload(af.inode)  # finishing it works
    assert await fs2.read(af.inode, 0, 20_000) == data
    assert await world.block.list("files/") == []
    assert [o.key for o in await world.objects.list()] == [rec.location]


async def test_crash_between_catalog_and_local_create(world):
    fs = await world.start()
    with armed("create.after_catalog"), pytest.raises(FailPointCrash):
        await fs.create()
    world.crash()
    fs2 = await world.start()
    assert len(world.report.recreated) == 1
    af = await fs2.open_active(world.report.recreated[0])
    assert await af.append(b"hello") == 0


async def test_a_file_whose_creation_failed_at_the_disk_opens_empty_without_a_restart(world):
    """The catalog row is written, then creating the local file fails (EIO): opening it later in
    the same process finds what a restart finds — an empty file (nothing was ever appended) —
    instead of FileNotFound, which made a replica discard its whole log and a leader fail every
    promotion (found by the simulation, seed 242)."""
    fs = await world.start()
    world.block.broken = True
    with pytest.raises(StorageIOError, match="cannot create the file"):  # a TerrafsError: a 503, not a 500
        await fs.create()
    world.block.broken = False
    (rec,) = await fs.list()
    af = await fs.open_active(rec.inode)
    assert af.durable_size == 0
    assert await af.append(b"hello") == 0


async def test_crash_after_delete_catalog_leaves_an_orphan_only(world):
    fs = await world.start()
    af = await fs.create()
    await af.append(b"x" * 100)
    await fs.seal(af.inode)
    rec = await fs.offload(af.inode)
    with armed("delete.after_catalog"), pytest.raises(FailPointCrash):
        await fs.delete(af.inode)
    world.crash()
    fs2 = await world.start()
    assert [o.key for o in await world.objects.list()] == [rec.location]  # fsck --repair removes it
    assert await fs2.list() == []


async def test_crash_during_stream_build_rolls_back(world):
    fs = await world.start()

    async def gen():
        yield b"abc"

    with armed("offload.after_upload"), pytest.raises(FailPointCrash):
        await fs.create_sealed(gen())
    world.crash()
    await world.start()
    assert len(world.report.rolled_back) == 1
    assert await fs.list() == [] and await world.objects.list() == []


async def test_failing_store_during_offload_changes_nothing():
    w = World(objects=FaultyObjectStore(MemoryObjectStore(), nth={"put": 1}))
    fs = await w.start()
    af = await fs.create()
    await af.append(b"payload" * 1000)
    await fs.seal(af.inode)
    with pytest.raises(InjectedFault):
        await fs.offload(af.inode)
    rec = await fs.stat(af.inode)
    assert rec.tier == FileTier.BLOCK
    assert await w.volatile.list("staging/") == []
    rec = await fs.offload(af.inode)  # second put succeeds
    assert await fs.read(af.inode, 0, 7) == b"payload"


async def test_kill_after_acknowledged_appends_then_offload(world):
    fs = await world.start()
    af = await fs.create()
    offs = await asyncio.gather(*(af.append(b"%04d" % i) for i in range(500)))
    world.crash()
    fs2 = await world.start()
    assert world.report.reopened == [af.inode]
    for i, off in enumerate(offs):
        assert await fs2.read(af.inode, off, 4) == b"%04d" % i


async def test_an_active_file_whose_header_never_reached_the_log_device_opens_empty(tmp_path):
    """On the log device a file is whole zeroed extents after a reopen: a crash after the file's
    extent was taken but before its header became durable leaves zeros, not a short file. The
    restart finds it header-less and starts it empty (as a short local file is), instead of
    refusing it as corrupt."""
    from terrafs.backends.local import LocalBlockDevice
    from terrafs.backends.logged import LoggedBlockDevice

    catalog = MemoryCatalog()

    def start():
        return TerrascaleFS(catalog, LoggedBlockDevice(LocalBlockDevice(str(tmp_path / "block"))),
                            MemoryBlockDevice(durable=False), MemoryObjectStore(), config=CFG)

    fs = start()
    await fs.open()
    af = await fs.create()
    rec = await fs.stat(af.inode)
    raw = await fs.block.open(rec.location)
    raw.writev_sync([bytes(4096)], 0)  # the header's bytes as a crash before its flush leaves them
    raw.fdatasync_sync()
    fs2 = start()  # a restart: the device reopened from the disk
    await fs2.open()
    again = await fs2.open_active(af.inode)
    assert again.durable_size == 0
    assert await again.append(b"hello") == 0
    await fs2.close()


async def test_a_failed_file_already_closed_is_cut_back_through_a_new_handle(world, monkeypatch):
    """``reopen_failed`` of a file closed already: by an earlier reopen whose recovery then
    failed (its catalog unreachable), or by a close that could not cut it back (the device
    still failing). The cut goes through a new handle, so the retry works — through the closed
    one it failed at every promotion and the partition never had a leader again (simulation
    seed 136398) — and the group whose fdatasync failed is not counted either way."""
    import errno

    from catalog.errors import CatalogUnavailableError
    from terrafs.backends.memory import MemoryDeviceFile
    from terrafs.errors import TerrafsError

    fs = await world.start()

    async def failing_sync(self):
        raise OSError(errno.EIO, "Input/output error")

    async def failed_file():
        af = await fs.create()
        await af.append(b"a" * 1000)
        with monkeypatch.context() as m:
            m.setattr(MemoryDeviceFile, "sync", failing_sync)  # the group lands, its fdatasync fails
            with pytest.raises(TerrafsError):
                await af.append(b"b" * 500)
        assert af.failure is not None
        return af

    async def exact(af):
        assert af.failure is None and af.durable_size == 1000
        assert await fs.read(af.inode, 0, 2000) == b"a" * 1000
        await af.append(b"c" * 10)
        assert await fs.read(af.inode, 990, 100) == b"a" * 10 + b"c" * 10

    af = await failed_file()  # 1: a reopen closes it, then cannot recover it
    real = fs.open_active

    async def unreachable(inode):
        raise CatalogUnavailableError("injected: no catalog leader reachable")
    monkeypatch.setattr(fs, "open_active", unreachable)
    with pytest.raises(CatalogUnavailableError):
        await fs.reopen_failed(af)
    monkeypatch.setattr(fs, "open_active", real)
    assert af.closed
    await exact(await fs.reopen_failed(af))

    af = await failed_file()  # 2: a close cannot cut it back
    world.block.broken = True
    await fs.close_active(af.inode)
    world.block.broken = False
    assert af.closed
    again = await fs.reopen_failed(af)
    await exact(again)
    assert await fs.reopen_failed(af) is again  # reopened since: that handle

    af = await failed_file()  # 3: closed, and still the handle the file system holds for the file
    world.block.broken = True
    with pytest.raises(TerrafsError):
        await af.close()
    world.block.broken = False
    assert af.closed
    await exact(await fs.reopen_failed(af))  # it reopened itself through itself for ever (seed 979)
