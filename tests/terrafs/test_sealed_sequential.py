"""SealedFile.read_sequential: the scan read path (memory-cached blocks used, the rest fetched and
verified, the cache never filled)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terrafs.blocks import Codec
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileCorruptionError
from terrafs.faults import FaultyObjectStore
from terrafs.sealed import SealedFile
from tests.terrafs.test_sealed import build, sample


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=20_000), codec=st.sampled_from(list(Codec)), bs=st.sampled_from([512, 4096]),
       reads=st.lists(st.tuples(st.integers(0, 21_000), st.integers(0, 9000)), max_size=8))
async def test_equals_read_and_leaves_the_cache_alone(data, codec, bs, reads):
    store, size = await build(data, codec=codec, block_size=bs)
    cache = BlockCache(1 << 20)
    sf = await SealedFile.open(store, "obj", object_size=size, cache=cache)
    for off, n in reads:
        assert bytes(await sf.read_sequential(off, n)) == data[off : off + n]
    assert cache.stats == {"mem_hits": 0, "disk_hits": 0, "misses": 0, "disk_bad": 0, "disk_skipped": 0}
    assert len(cache._mem) == 0


async def test_cached_blocks_are_used_not_refetched():
    data = sample(100_000)
    store, size = await build(data, block_size=4096)
    counted = FaultyObjectStore(store)
    cache = BlockCache(1 << 20)
    sf = await SealedFile.open(counted, "obj", object_size=size, cache=cache)
    assert await sf.read(20_000, 10) == data[20_000:20_010]  # block 4 now in the memory cache
    gets = counted.plan.counts["get"]
    assert bytes(await sf.read_sequential(16_384, 4096)) == data[16_384:20_480]  # exactly block 4
    assert counted.plan.counts["get"] == gets
    assert bytes(await sf.read_sequential(10_000, 30_000)) == data[10_000:40_000]
    assert counted.plan.counts["get"] == gets + 2  # the runs before and after block 4


async def test_one_ranged_read_and_encrypted_blocks():
    kek = KeyEncryptionKey(b"k" * 32)
    data = sample(100_000)
    store, size = await build(data, block_size=4096, kek=kek)
    counted = FaultyObjectStore(store)
    sf = await SealedFile.open(counted, "obj", object_size=size, kek=kek)
    before = counted.plan.counts["get"]
    assert bytes(await sf.read_sequential(5_000, 60_000)) == data[5_000:65_000]
    assert counted.plan.counts["get"] == before + 1


async def damaged(store, size):
    """The object opened with one byte flipped, every 997th byte in turn (damage that hits the
    block map or the footer fails the open and is skipped)."""
    raw = await store.get("obj")
    for pos in range(0, size - 200, 997):  # every part of every block record in the data section
        bad = bytearray(raw)
        bad[pos] ^= 0x10
        await store.put("obj", bytes(bad))
        try:
            sf = await SealedFile.open(store, "obj", object_size=size)
        except FileCorruptionError:
            continue  # the damage hit the map or the footer
        yield sf


@pytest.mark.parametrize("codec", list(Codec))
async def test_flipped_byte_is_never_returned(codec):
    data = sample(60_000)
    store, size = await build(data, codec=codec, block_size=4096)
    async for sf in damaged(store, size):
        with pytest.raises(FileCorruptionError) as ei:
            await sf.read_sequential(0, len(data))
        assert ei.value.where.endswith("obj") and ei.value.offset is not None


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=20_000), codec=st.sampled_from(list(Codec)), bs=st.sampled_from([512, 4096]),
       spans=st.lists(st.tuples(st.integers(0, 21_000), st.integers(0, 9000)), max_size=6),
       warm=st.lists(st.integers(0, 20_000), max_size=3))
async def test_spans_equal_reads_in_one_request_and_one_hop(data, codec, bs, spans, warm):
    """Several stretches (overlapping, empty, past the end, some blocks in the memory cache)
    read at once equal ``read``, with one request of ranged reads, and reach ``then`` as given."""
    store, size = await build(data, codec=codec, block_size=bs)

    class Requests(FaultyObjectStore):
        calls = 0

        async def get_ranges(self, key, ranges):
            self.calls += 1
            return await super().get_ranges(key, ranges)

    counted = Requests(store)
    sf = await SealedFile.open(counted, "obj", object_size=size, cache=BlockCache(1 << 20))
    for off in warm:
        await sf.read(off, 1)  # its block now in the memory cache
    gets = counted.plan.counts.get("get", 0)
    got = await sf.read_sequential_spans(spans, lambda views: [bytes(v) for v in views])
    assert got == [data[off : off + n] for off, n in spans]
    assert counted.calls <= 1 and (counted.calls == 1 or counted.plan.counts.get("get", 0) == gets)


async def test_a_flipped_byte_in_one_span_fails_the_read():
    data = sample(60_000)
    store, size = await build(data, block_size=4096)
    async for sf in damaged(store, size):
        with pytest.raises(FileCorruptionError):
            await sf.read_sequential_spans([(0, 100), (100, 30_000), (30_100, len(data))], lambda views: views)
