"""Sealed files: build from a stream, paged reads through the cache, corruption, faults."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terrafs.backends.local import LocalBlockDevice
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.blocks import Codec
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileCorruptionError, EncryptionKeyError
from terrafs.faults import FaultyObjectStore, InjectedFault
from terrafs.params import new_params
from terrafs.sealed import FOOTER_LEN, SealedFile, SealedWriter


async def build(data: bytes, *, codec=Codec.ZSTD, block_size=1024, kek=None, pieces=7):
    dev, store = MemoryBlockDevice(), MemoryObjectStore()
    out = await dev.create("stage")
    w = SealedWriter(out, new_params(11, 5, codec=codec, block_size=block_size, kek=kek), kek)
    step = max(len(data) // pieces, 1)
    for i in range(0, len(data), step):
        await w.write(data[i : i + step])
    size = await w.finish()
    await store.put("obj", await out.pread(0, size))
    return store, size


def sample(n=50_000):
    return b"".join(b"sensor-%06d,%f;" % (i, i * 0.5) for i in range(n // 20))[:n]


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=20_000), codec=st.sampled_from(list(Codec)),
       bs=st.sampled_from([512, 1024, 4096]),
       reads=st.lists(st.tuples(st.integers(0, 21_000), st.integers(0, 5000)), max_size=8))
async def test_round_trip_and_ranges(data, codec, bs, reads):
    store, size = await build(data, codec=codec, block_size=bs)
    sf = await SealedFile.open(store, "obj", object_size=size)
    assert sf.size == len(data)
    for off, n in reads:
        assert await sf.read(off, n) == data[off : off + n]
    assert b"".join([b async for _, b in sf.scan()]) == data


async def test_a_long_read_is_joined_off_the_loop_with_the_same_bytes():
    """A read of a whole run's bytes (at least ``_JOIN_OFF_LOOP``) is copied in a worker
    thread: the same bytes, from unaligned ends in the middle of blocks."""
    from terrafs.sealed import _JOIN_OFF_LOOP
    data = sample(_JOIN_OFF_LOOP + 300_000)
    store, size = await build(data, block_size=64 << 10)
    sf = await SealedFile.open(store, "obj", object_size=size)
    for off, n in ((0, _JOIN_OFF_LOOP), (12_345, _JOIN_OFF_LOOP + 1_000), (70_000, len(data))):
        assert await sf.read(off, n) == data[off : off + n]


async def test_paged_reads_fetch_only_needed_blocks():
    data = sample(200_000)
    store, size = await build(data, block_size=4096)

    class Counting(FaultyObjectStore):
        pass

    counted = Counting(store)
    cache = BlockCache(1 << 20)
    sf = await SealedFile.open(counted, "obj", object_size=size, cache=cache)
    opened = counted.plan.counts.get("get", 0)
    assert opened == 2  # footer, then key section + block map
    assert await sf.read(100_000, 100) == data[100_000:100_100]
    assert counted.plan.counts["get"] == 3
    assert await sf.read(100_010, 50) == data[100_010:100_060]  # cached block
    assert counted.plan.counts["get"] == 3 and cache.stats["mem_hits"] >= 1
    assert await sf.read(0, 20_000) == data[:20_000]  # 5 adjacent blocks, one ranged read
    assert counted.plan.counts["get"] == 4


async def test_flipped_byte_anywhere_is_detected_never_served():
    data = sample(20_000)
    store, size = await build(data, block_size=2048)
    raw = await store.get("obj")
    for pos in range(0, size, 131):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        s = MemoryObjectStore()
        await s.put("obj", bytes(bad))
        try:
            sf = await SealedFile.open(s, "obj", object_size=size)
            got = b"".join([b async for _, b in sf.scan()])
        except FileCorruptionError as e:
            assert e.where.endswith("/obj") and e.offset is not None
            continue
        pytest.fail(f"flip at {pos} went unnoticed (served {len(got)} bytes)")


async def test_volatile_cache_survives_memory_eviction_and_damage():
    data = sample(100_000)
    store, size = await build(data, block_size=4096)
    vol = MemoryBlockDevice(durable=False)
    cache = BlockCache(8192, vol, 1 << 20)
    await cache.open()
    faulty = FaultyObjectStore(store)
    sf = await SealedFile.open(faulty, "obj", object_size=size, cache=cache)
    for off in range(0, 100_000, 4096):
        assert await sf.read(off, 10) == data[off : off + 10]
    await cache.drain()
    gets = faulty.plan.counts["get"]
    assert len(await vol.list("cache/")) > 20
    assert await sf.read(0, 10) == data[:10]  # from the volatile device
    assert faulty.plan.counts["get"] == gets and cache.stats["disk_hits"] >= 1
    # Damage a cached record: detected by its checksum, dropped, refetched from the store.
    name = (await vol.list("cache/"))[3]
    f = await vol.open(name)
    buf = bytearray(await f.pread(0, f.size()))
    buf[40] ^= 0xFF
    await vol.write_file(name, bytes(buf))
    for off in range(0, 100_000, 4096):
        assert await sf.read(off, 10) == data[off : off + 10]
    assert cache.stats["disk_bad"] == 1


async def test_encrypted_object_has_no_plaintext():
    kek = KeyEncryptionKey(os.urandom(32))
    data = b"vehicle=truck-17;speed=88.5;" * 2000
    store, size = await build(data, kek=kek, codec=Codec.NONE)
    assert b"truck-17" not in await store.get("obj")
    sf = await SealedFile.open(store, "obj", object_size=size, kek=kek)
    assert await sf.read(500, 100) == data[500:600]
    with pytest.raises(EncryptionKeyError):
        await SealedFile.open(store, "obj", object_size=size, kek=KeyEncryptionKey(os.urandom(32)))
    with pytest.raises(EncryptionKeyError):
        await SealedFile.open(store, "obj", object_size=size)


async def test_failing_store_raises_and_recovers():
    data = sample(30_000)
    store, size = await build(data, block_size=4096)
    faulty = FaultyObjectStore(store, nth={"get": 3})
    sf = await SealedFile.open(faulty, "obj", object_size=size)
    with pytest.raises(InjectedFault):
        await sf.read(0, 100)
    assert await sf.read(0, 100) == data[:100]  # the next try goes through


async def test_empty_and_truncated_objects():
    store, size = await build(b"")
    sf = await SealedFile.open(store, "obj", object_size=size)
    assert sf.size == 0 and await sf.read(0, 10) == b""
    raw = await store.get("obj")
    s = MemoryObjectStore()
    await s.put("obj", raw[:-1])
    with pytest.raises(FileCorruptionError):
        await SealedFile.open(s, "obj")
    await s.put("obj", raw[: FOOTER_LEN - 1])
    with pytest.raises(FileCorruptionError, match="too short"):
        await SealedFile.open(s, "obj")


@pytest.mark.parametrize("device", ["memory", "local"])
async def test_read_spans_takes_the_volatile_cache_in_one_batch_and_refetches_damage(device, tmp_path):
    """A row's pages (several spans) from the volatile device with one ``read_files``: a
    damaged record is dropped and refetched, one gone from the device (deleted behind the
    cache's back) is fetched again; every span right either way."""
    data = sample(100_000)
    store, size = await build(data, block_size=4096)
    vol = MemoryBlockDevice(durable=False) if device == "memory" else LocalBlockDevice(str(tmp_path / "vol"),
                                                                                      durable=False)
    cache = BlockCache(8192, vol, 1 << 20)
    await cache.open()
    faulty = FaultyObjectStore(store)
    sf = await SealedFile.open(faulty, "obj", object_size=size, cache=cache)
    spans = [(off, 100) for off in range(0, 100_000, 9000)]
    assert await sf.read_spans(spans) == [data[o : o + n] for o, n in spans]
    await cache.drain()
    cache._mem = type(cache._mem)(cache._mem.capacity)  # memory tier evicted: the device answers
    gets, calls = faulty.plan.counts["get"], []
    real = vol.read_files

    async def counted(names):
        calls.append(len(names))
        return await real(names)
    vol.read_files = counted
    assert await sf.read_spans(spans) == [data[o : o + n] for o, n in spans]
    assert len(calls) == 1 and calls[0] >= len(spans) and faulty.plan.counts["get"] == gets  # one call, no fetch
    names = sorted(await vol.list("cache/"))
    f = await vol.open(names[1])
    buf = bytearray(await f.pread(0, f.size()))
    await f.close()
    buf[40] ^= 0xFF
    await vol.write_file(names[1], bytes(buf))
    await vol.delete(names[2])
    cache._mem = type(cache._mem)(cache._mem.capacity)
    assert await sf.read_spans(spans) == [data[o : o + n] for o, n in spans]
    assert cache.stats["disk_bad"] == 1
