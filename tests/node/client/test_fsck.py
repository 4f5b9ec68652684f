"""`terrascale fsck DATA_DIR`: clean data passes; every injected fault is caught and named."""
import asyncio
import json
import os
import subprocess
import sys

from catalog.local import LocalCatalog
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

TERRASCALE = os.path.join(os.path.dirname(sys.executable), "terrascale")


async def _make_data(d):
    cat = LocalCatalog(str(d / "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(str(d / "block")), LocalBlockDevice(str(d / "cache"), durable=False),
                      LocalObjectStore(str(d / "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    sealed = await fs.create()
    await sealed.append(os.urandom(50_000))
    await fs.seal(sealed.inode)
    rec = await fs.offload(sealed.inode)
    active = await fs.create()
    for i in range(5):
        await active.append(b"row-%d;" % i * 2000)
    arec = await fs.stat(active.inode)
    await fs.close()
    await cat.close()
    return d / "objects" / rec.location, d / "block" / arec.location


def _fsck(d):
    return subprocess.run([TERRASCALE, "fsck", str(d)], capture_output=True, text=True, timeout=120)


def test_fsck_clean_then_damaged(tmp_path):
    d = tmp_path / "data"
    obj, act = asyncio.run(_make_data(d))
    r = _fsck(d)
    assert r.returncode == 0, r.stdout + r.stderr
    raw = bytearray(obj.read_bytes())
    raw[1000] ^= 0x01  # inside a block of the sealed object
    obj.write_bytes(raw)
    r = _fsck(d)
    assert r.returncode == 1 and str(obj) in r.stdout and "offset=" in r.stdout
    raw[1000] ^= 0x01
    obj.write_bytes(raw)
    a = bytearray(act.read_bytes())
    a[200] ^= 0x01  # inside the first write group of the active file, later groups follow
    act.write_bytes(a)
    r = _fsck(d)
    assert r.returncode == 1 and str(act) in r.stdout
    assert act.read_bytes() == bytes(a)  # fsck never repairs


def test_fsck_reports_torn_tail_as_notice_and_cuts_nothing(tmp_path):
    d = tmp_path / "data"
    _, act = asyncio.run(_make_data(d))
    with open(act, "ab") as f:
        f.write(b"TBLK" + b"\x00" * 10)  # a torn, unacknowledged write
    size = os.path.getsize(act)
    r = _fsck(d)
    assert r.returncode == 0 and "torn tail" in r.stdout
    assert os.path.getsize(act) == size


def test_fsck_catalog_corruption(tmp_path):
    d = tmp_path / "data"
    asyncio.run(_make_data(d))
    log = sorted((d / "catalog").glob("log-*"))[-1]
    raw = bytearray(log.read_bytes())
    raw[40] ^= 0x01
    log.write_bytes(raw)
    r = _fsck(d)
    assert r.returncode == 1 and str(log) in r.stdout


def test_fsck_usage(tmp_path):
    assert subprocess.run([TERRASCALE, "fsck"], capture_output=True).returncode == 2
    r = subprocess.run([TERRASCALE, "fsck", str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode == 1 and "not a directory" in r.stderr


async def _make_segments(d):
    from rowstore.segments.store import SegmentStore
    from tests.rowstore.segments.test_segments import KEYS, S1, SCHEMAS, batch

    cat = LocalCatalog(str(d / "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(str(d / "block")), LocalBlockDevice(str(d / "cache"), durable=False),
                      LocalObjectStore(str(d / "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    st = SegmentStore(fs, SCHEMAS.__getitem__)
    await st.open()
    seg = await st.create("t", 0)
    await seg.append(batch(0, 2000), S1, 5)
    await st.seal(seg.segid)
    rec = await st.offload(seg.segid, KEYS)
    live = await st.create("t", 1)
    await live.append(batch(0, 10), S1, 6)
    await fs.close()
    await cat.close()
    return d / "objects" / rec.location


def test_fsck_with_segments(tmp_path):
    d = tmp_path / "data"
    obj = asyncio.run(_make_segments(d))
    r = _fsck(d)
    assert r.returncode == 0, r.stdout + r.stderr
    raw = bytearray(obj.read_bytes())
    raw[len(raw) // 2] ^= 0x08
    obj.write_bytes(raw)
    r = _fsck(d)
    assert r.returncode == 1 and str(obj) in r.stdout


async def _make_bad_run(d):
    import numpy as np

    from catalog.abc import Put
    from rowstore.index.key_run import run_bytes
    from rowstore.index.key_memtable import Run

    cat = LocalCatalog(str(d / "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(str(d / "block")), LocalBlockDevice(str(d / "cache"), durable=False),
                      LocalObjectStore(str(d / "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    keys = np.array([5, 3, 9], np.uint64)  # not sorted: checksums fine, the format's order broken
    run = Run(keys, np.array([7, 7, 7], np.uint64), np.array([1, 2, 3], np.uint64))
    rec = await fs.create_sealed(run_bytes(run, "int64", 0))
    doc = {"runs": [{"inode": rec.inode, "level": 0, "entries": 3, "cols": {}}], "mark": [0, 0, 0],
           "checkpoints": 1, "garbage": []}
    await cat.txn([], [Put("idx/1/000/manifest", json.dumps(doc).encode())])
    await fs.close()
    await cat.close()


def test_fsck_checks_index_runs_entry_by_entry(tmp_path):
    d = tmp_path / "data"
    asyncio.run(_make_bad_run(d))
    r = _fsck(d)
    assert r.returncode == 1 and "out of (key asc, commit_ts desc) order" in r.stdout, r.stdout + r.stderr
    assert "idx/1/000/manifest" in r.stdout


async def _make_dangling(d):
    """What a cluster whose collectors ran on partitions they did not serve could leave: index entries naming a segment
    that was deleted (and a segment row whose count is below the localids named)."""
    import pyarrow as pa
    import pytest

    from catalog.abc import Put
    from rowstore.db.database import Database, TablesConfig
    from rowstore.errors import DanglingRowidError
    from rowstore.segments.store import SEG_PREFIX, SegmentRecord

    cat = LocalCatalog(str(d / "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(str(d / "block")), LocalBlockDevice(str(d / "cache"), durable=False),
                      LocalObjectStore(str(d / "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    db = Database(fs, TablesConfig(partitions=1))
    await db.open()
    await db.create_table("t", "id int64 primary key, v int64")
    await db.upsert("t", pa.table({"id": pa.array(range(100), pa.int64()), "v": pa.array(range(100), pa.int64())}))
    await db.seal()
    await db.upsert("t", pa.table({"id": pa.array(range(100, 150), pa.int64()), "v": pa.array([1] * 50, pa.int64())}))
    await db.seal()
    await db.offload()
    await db.checkpoint()
    first, second = sorted((r for r in await db.store.list()), key=lambda r: r.seq)[:2]
    await db.store.delete(first.segid)  # bypassing the collector: entries still name it
    e = await cat.get(f"{SEG_PREFIX}{second.segid:08x}")
    await cat.txn([], [Put(e.key, SegmentRecord.from_bytes(e.value).__class__(
        **{**SegmentRecord.from_bytes(e.value).__dict__, "rows": 10}).to_bytes())])
    with pytest.raises(DanglingRowidError, match="table 't' partition 0"):
        await db.get("t", 5)
    await db.close()
    await fs.close()
    await cat.close()
    return first.segid, second.segid


def test_fsck_finds_index_entries_naming_no_row(tmp_path):
    d = tmp_path / "data"
    gone, short = asyncio.run(_make_dangling(d))
    r = _fsck(d)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "names 100 rowids of no row (no such segment)" in r.stdout, r.stdout  # every entry of the deleted one
    assert f"(segment {gone}, localid" in r.stdout
    assert "names 40 rowids of no row (past the segment's end)" in r.stdout, r.stdout  # localids 10..49
    assert f"(segment {short}, localid 10, segment rows 10)" in r.stdout


def test_fsck_reads_active_files_on_the_log_device_and_names_a_flipped_byte_in_it(tmp_path):
    """A node's data folder as `terrascale node run` makes it (active files in the log device,
    docs/format/logdev.md): fsck passes it and changes nothing; a flipped byte inside an
    active file's first group, or in an extent header, is damage named with its offset."""
    from terrafs.backends.logdev_format import PAGE
    from terrafs.uri import open_block_device

    d = tmp_path / "data"

    async def make():
        cat = LocalCatalog(str(d / "catalog"))
        await cat.open()
        block = open_block_device(f"trfs://{d / 'block'}")
        fs = TerrascaleFS(cat, block, LocalBlockDevice(str(d / "cache"), durable=False),
                          LocalObjectStore(str(d / "objects")), config=FsConfig(sealed_block_size=4096))
        await fs.open()
        active = await fs.create()
        for i in range(5):
            await active.append(b"row-%d;" % i * 2000)
        await fs.close()
        await cat.close()
        return block.log.extent_size, block.log._chains[(await block.list("files/"))[0]].extents[0]

    esize, ext = asyncio.run(make())
    dev = d / "block" / "logdev"
    before = dev.read_bytes()
    r = _fsck(d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert dev.read_bytes() == before  # fsck never writes
    for at, what in ((PAGE + ext * esize + PAGE + 200, "files/"), (PAGE + ext * esize + 20, "extent header")):
        raw = bytearray(before)
        raw[at] ^= 0x01
        dev.write_bytes(raw)
        r = _fsck(d)
        assert r.returncode == 1 and what in r.stdout, r.stdout + r.stderr
        assert dev.read_bytes() == bytes(raw)
