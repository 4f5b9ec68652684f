"""Active files: group commit, recovery, torn tails, corruption, encryption, fsync failure."""
import asyncio
import os

import pytest

from terrafs.active import ActiveConfig, ActiveFile
from terrafs.backends.local import LocalBlockDevice
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.blocks import HEADER_LEN, Codec
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileCorruptionError, EncryptionKeyError, FileStateError
from terrafs.faults import FaultyBlockDevice
from terrafs.params import new_params

CFG = ActiveConfig(flush_bytes=64 * 1024, flush_ms=1.0)


def params(inode=1, codec=Codec.NONE, block_size=4096, page_size=0, kek=None):
    return new_params(inode, 42, codec=codec, block_size=block_size, page_size=page_size, kek=kek)


async def write_groups(af, groups):
    """Append each list of chunks concurrently, one group commit per list."""
    offs = []
    for g in groups:
        offs.append(await asyncio.gather(*(af.append(c) for c in g)))
        await af.flush()
    return offs


@pytest.mark.parametrize("page_size", [0, 4096])
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
async def test_group_commit_and_reads(page_size, codec):
    dev = MemoryBlockDevice()
    af = await ActiveFile.create(dev, "f", params(page_size=page_size, codec=codec), None, CFG)
    chunks = [os.urandom(100 + i * 37) for i in range(64)]
    offs = await asyncio.gather(*(af.append(c) for c in chunks))
    assert af.stats["flushes"] < 64  # many appends shared one flush
    whole = b"".join(chunks)
    assert sorted(offs) == offs and offs[0] == 0 and af.durable_size == len(whole)
    for off, c in zip(offs, chunks):
        assert await af.read(off, len(c)) == c
    assert b"".join([b async for _, b in af.scan()]) == whole
    assert b"".join([b async for _, b in af.scan(1000)]) == whole[1000:]
    if page_size:
        f = await dev.open("f")
        assert f.size() % page_size == 0
    await af.close()
    again = await ActiveFile.recover(dev, "f", None, CFG)
    assert await again.read(0, len(whole)) == whole


async def test_timer_flushes_a_lone_append():
    af = await ActiveFile.create(MemoryBlockDevice(), "f", params(), None,
                                 ActiveConfig(flush_bytes=1 << 20, flush_ms=1))
    assert await asyncio.wait_for(af.append(b"x"), 5) == 0
    assert af.durable_size == 1


async def test_crash_keeps_acknowledged_appends():
    dev = MemoryBlockDevice()
    af = await ActiveFile.create(dev, "f", params(), None, CFG)
    acked = await write_groups(af, [[b"a" * 10, b"b" * 5000], [b"c" * 300]])
    af._pending.append(b"never flushed")  # in the buffer, not acknowledged
    dev.crash()
    again = await ActiveFile.recover(dev, "f", None, CFG)
    assert again.durable_size == 5310
    assert await again.read(acked[1][0], 300) == b"c" * 300
    assert await again.append(b"next") == 5310


async def _file_with_groups(page_size=0, kek=None):
    dev = MemoryBlockDevice()
    af = await ActiveFile.create(dev, "f", params(page_size=page_size, kek=kek), kek, CFG)
    starts = []  # physical start of each group
    for g in [[b"one" * 500], [b"two" * 2000, b"2b" * 10], [b"three" * 1000]]:
        starts.append((await dev.open("f")).size())
        await write_groups(af, [g])
    raw = await (await dev.open("f")).pread(0, 1 << 20)
    await af.close()
    return dev, raw, starts


@pytest.mark.parametrize("page_size", [0, 4096])
async def test_torn_tail_at_every_offset(page_size):
    dev, raw, starts = await _file_with_groups(page_size)
    last_start = starts[-1]
    for cut in range(last_start, len(raw), 97):
        d = MemoryBlockDevice()
        f = await d.create("f")
        await f.append(raw[:cut])
        again = await ActiveFile.recover(d, "f", None, CFG)
        assert again.durable_size == 1500 + 6020, cut
        assert (await d.open("f")).size() == last_start
        assert await again.append(b"new") == 7520


async def test_flipped_byte_in_last_group_is_cut_earlier_is_error():
    dev, raw, starts = await _file_with_groups()
    last = starts[-1]
    for pos in (last + 3, last + 40, len(raw) - 1):
        d = MemoryBlockDevice()
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        await (await d.create("f")).append(bytes(bad))
        again = await ActiveFile.recover(d, "f", None, CFG)
        assert again.durable_size == 7520
    for pos in (starts[0] + 5, starts[1] + 50, starts[1] + 3000):
        d = MemoryBlockDevice()
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        await (await d.create("f")).append(bytes(bad))
        with pytest.raises(FileCorruptionError) as ei:
            await ActiveFile.recover(d, "f", None, CFG)
        assert ei.value.where.endswith("/f") and ei.value.offset is not None
        assert (await d.open("f")).size() == len(raw)  # nothing cut


async def test_corrupt_header_is_error():
    dev, raw, _ = await _file_with_groups()
    d = MemoryBlockDevice()
    bad = bytearray(raw)
    bad[13] ^= 1
    await (await d.create("f")).append(bytes(bad))
    with pytest.raises(FileCorruptionError, match="header"):
        await ActiveFile.recover(d, "f", None, CFG)


async def test_encryption_no_plaintext_and_key_errors():
    kek = KeyEncryptionKey(os.urandom(32))
    dev = MemoryBlockDevice()
    af = await ActiveFile.create(dev, "f", params(kek=kek), kek, CFG)
    secret = b"latitude=47.6062,longitude=-122.3321;" * 50
    await af.append(secret)
    await af.close()
    raw = await (await dev.open("f")).pread(0, 1 << 20)
    assert b"latitude" not in raw
    with pytest.raises(EncryptionKeyError):
        await ActiveFile.recover(dev, "f", KeyEncryptionKey(os.urandom(32)), CFG)
    with pytest.raises(EncryptionKeyError):
        await ActiveFile.recover(dev, "f", None, CFG)
    assert (await dev.open("f")).size() == len(raw)  # a wrong key never cuts data
    again = await ActiveFile.recover(dev, "f", kek, CFG)
    assert await again.read(0, len(secret)) == secret


async def test_failed_fsync_poisons_the_file():
    dev = FaultyBlockDevice(MemoryBlockDevice(), nth={"sync": 3})  # 1: header, 2: group 1
    af = await ActiveFile.create(dev, "f", params(), None, CFG)
    await af.append(b"ok")
    with pytest.raises(FileStateError, match="flush failed"):
        await af.append(b"fails")
    with pytest.raises(FileStateError):
        await af.append(b"refused")
    assert af.durable_size == 2


async def test_seal_refuses_appends():
    af = await ActiveFile.create(MemoryBlockDevice(), "f", params(), None, CFG)
    await af.append(b"x")
    await af.seal()
    with pytest.raises(FileStateError, match="sealed"):
        await af.append(b"y")


async def test_local_device_round_trip(tmp_path):
    dev = LocalBlockDevice(str(tmp_path))
    af = await ActiveFile.create(dev, "wal/f.act", params(page_size=4096), None, CFG)
    chunks = [os.urandom(5000) for _ in range(20)]
    offs = await asyncio.gather(*(af.append(c) for c in chunks))
    await af.close()
    assert os.path.getsize(tmp_path / "wal/f.act") % 4096 == 0
    again = await ActiveFile.recover(dev, "wal/f.act", None, CFG)
    for o, c in zip(offs, chunks):
        assert await again.read(o, 5000) == c


@pytest.mark.parametrize("run", [1, 4096, 4 << 20])
@pytest.mark.parametrize("codec,encrypted", [(Codec.NONE, False), (Codec.ZSTD, True)])
async def test_a_scan_reads_runs_of_blocks_at_once_and_names_a_damaged_one(monkeypatch, run, codec, encrypted):
    """A recovered file keeps no block: its scan reads runs of them (one read, decoded in one
    hop), equal to the bytes appended at any run size, from any start; a byte flipped under
    the open file is corruption naming that block's offset, never other bytes."""
    import terrafs.active as active

    monkeypatch.setattr(active, "_SCAN_RUN", run)
    kek = KeyEncryptionKey(os.urandom(32)) if encrypted else None
    dev = MemoryBlockDevice()
    af = await ActiveFile.create(dev, "f", params(codec=codec, block_size=1024, kek=kek), kek, CFG)
    chunks = [os.urandom(300 + 17 * i) for i in range(40)]
    await write_groups(af, [chunks[i : i + 3] for i in range(0, 40, 3)])
    whole = b"".join(chunks)
    await af.close()
    again = await ActiveFile.recover(dev, "f", kek, CFG)
    reads = []
    pread = again._f.pread

    async def counted(off, n):
        reads.append(n)
        return await pread(off, n)
    monkeypatch.setattr(again._f, "pread", counted)
    for start in (0, 1, 5000, len(whole) - 1):
        got = [(off, b) async for off, b in again.scan(start)]
        assert b"".join(b for _, b in got) == whole[start:] and got[0][0] == start
        if start == 0:
            assert len(reads) == (2 if run == 4 << 20 else again.index.n + 1 if run == 1 else len(reads))
    again = await ActiveFile.recover(dev, "f", kek, CFG)
    k = again.index.n // 2
    at = int(again.index.physical[k])
    raw = (await dev.open("f"))._d.buf
    raw[at + HEADER_LEN + 2] ^= 0x40  # the payload of block k, under the open file
    with pytest.raises(FileCorruptionError) as ei:
        async for _ in again.scan():
            pass
    assert ei.value.offset == at and ei.value.where.endswith("/f")
