"""Index runs: memtable -> sealed run -> lookups equal the memtable's, for every key kind."""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from catalog.memory import MemoryCatalog
from rowstore.errors import RowCorruptionError
from rowstore.index.key_run import IndexRun, _fixed_width, run_bytes
from rowstore.index.key_memtable import MemTable
from rowstore.tables.keys import encode_keys, encode_one
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS


async def new_fs():
    fs = TerrascaleFS(MemoryCatalog(), MemoryBlockDevice(), MemoryBlockDevice(durable=False), MemoryObjectStore(),
                      config=FsConfig(sealed_block_size=4096))
    await fs.open()
    return fs


async def write_run(fs, mt, kind, raw_mutator=None):
    data = b"".join([c async for c in run_bytes(mt.consolidated(), kind, 0)])
    if raw_mutator:
        data = raw_mutator(bytearray(data))

    async def gen():
        yield bytes(data)

    rec = await fs.create_sealed(gen())
    return await IndexRun.open(await fs.open_sealed(rec.inode))


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(st.lists(st.integers(-300, 300), min_size=1, max_size=80, unique=True),
                        min_size=1, max_size=12))
async def test_run_matches_memtable_int64(batches):
    fs = await new_fs()
    mt = MemTable("int64")
    rowid = 1 << 32
    for i, keys in enumerate(batches):
        rowids = np.arange(rowid, rowid + len(keys), dtype=np.uint64)
        rowid += len(keys)
        mt.insert(encode_keys(pa.array(keys, pa.int64()), "int64"), 1000 + i, rowids)
    run = await write_run(fs, mt, "int64")
    full = mt.consolidated()
    got = await run.all()
    assert np.array_equal(got.keys, full.keys) and np.array_equal(got.ts, full.ts)
    assert np.array_equal(got.rowids, full.rowids)
    for k in np.unique(full.keys)[:25]:
        v = await run.versions(int(k))
        m = full.keys == k
        assert v.ts.tolist() == full.ts[m].tolist() and v.rowids.tolist() == full.rowids[m].tolist()
    assert len((await run.versions(int(encode_keys(pa.array([999], pa.int64()), "int64")[0]))).ts) == 0
    await _scalar_gets_match(run, full, [int(k) for k in full.keys[:40]] + [encode_one(999, "int64")])


async def _scalar_gets_match(run, full, keys):
    """``get_one`` and ``get_cached`` (None until the pages are parsed) equal the vectorized lookup,
    with pages parsed one by one and with the whole run parsed."""
    arr = np.array(keys, full.keys.dtype if full.keys.dtype.kind != "S" else "S")
    want = {as_of: (await run.get_many(arr, as_of)).tolist() for as_of in (0, 1000, 1003, 2000)}
    for whole in (False, True):
        run._pages.clear()
        run._whole = None
        assert {run.get_cached(k, 2000) for k in keys} == {None}
        if whole:
            await run._parse_whole()
        for as_of, w in want.items():
            assert [await run.get_one(k, as_of) for k in keys] == w
            assert [run.get_cached(k, as_of) for k in keys] == w
            assert (await run.get_many(arr, as_of)).tolist() == w
        assert np.array_equal((await run.all()).keys, full.keys)
        for k in keys[:5]:
            v, m = await run.versions(k), full.keys == np.array([k], full.keys.dtype)[0]
            assert v.ts.tolist() == full.ts[m].tolist() and v.rowids.tolist() == full.rowids[m].tolist()


@pytest.mark.parametrize("kind", ["string", "uuid"])
async def test_run_byte_keys(kind):
    fs = await new_fs()
    mt = MemTable(kind)
    vals = [f"key-{i:04d}" for i in range(500)] if kind == "string" else [i.to_bytes(16, "big") for i in range(500)]
    arr = pa.array(vals, pa.string() if kind == "string" else pa.binary(16))
    for ts in (5, 6, 7):  # three versions of every key, spanning page boundaries
        mt.insert(encode_keys(arr, kind), ts, np.arange(500, dtype=np.uint64) + (ts << 32))
    run = await write_run(fs, mt, kind)
    assert run.entries == 1500
    for i in (0, 57, 58, 170, 499):
        k = encode_keys(arr.slice(i, 1), kind)[0]
        v = await run.versions(k)
        assert v.ts.tolist() == [7, 6, 5] and v.rowids.tolist() == [(t << 32) + i for t in (7, 6, 5)]
    probes = [encode_one(v, kind) for v in vals[::7]] + [b"\xff" * 20]
    await _scalar_gets_match(run, mt.consolidated(), probes)


async def test_damaged_run_is_detected():
    fs = await new_fs()
    mt = MemTable("int64")
    mt.insert(encode_keys(pa.array(range(1000), pa.int64()), "int64"), 1, np.arange(1000, dtype=np.uint64))

    def flip_fence(b):
        b[-70] ^= 1  # inside the fence (the footer is the last 64 bytes)
        return b

    with pytest.raises(RowCorruptionError, match="fence checksum"):
        await write_run(fs, mt, "int64", flip_fence)


async def test_pages_across_more_than_the_parsed_page_cache(monkeypatch):
    """A scan that spans more pages than the parsed-page cache holds, with some of them cached:
    reading the others evicts the cached ones meanwhile (this raised KeyError once)."""
    import rowstore.index.key_run as key_run

    monkeypatch.setattr(key_run, "PARSED_PAGES", 2)
    fs = await new_fs()
    mt = MemTable("int64")
    keys = np.arange(20_000, dtype=np.int64)
    mt.insert(encode_keys(pa.array(keys), "int64"), 1000, np.arange(1 << 32, (1 << 32) + len(keys), dtype=np.uint64))
    run = await write_run(fs, mt, "int64")
    n = len(run._offs)
    assert n > 4
    for i in (0, 2, n - 1):
        await run.page(i)
    got = await run.pages(list(range(n)))
    assert np.array_equal(np.concatenate([p.keys for p in got]), mt.consolidated().keys)
    assert len(run._pages) <= 2


@pytest.mark.parametrize("kind", ["int64", "string", "uuid"])
async def test_a_full_scan_reads_every_page_at_once_and_equals_the_pages(kind):
    """``range()`` without bounds (visible sets, merges, GC views) reads the pages' bytes in one
    read and parses them in a thread: the same entries as page by page, nothing left cached."""
    fs = await new_fs()
    mt = MemTable(kind)
    n = 3000
    vals = list(range(n)) if kind == "int64" else [f"k-{i:05d}" for i in range(n)] if kind == "string" \
        else [i.to_bytes(16, "big") for i in range(n)]
    arr = pa.array(vals, {"int64": pa.int64(), "string": pa.string(), "uuid": pa.binary(16)}[kind])
    for ts in (3, 9):
        mt.insert(encode_keys(arr, kind), ts, np.arange(n, dtype=np.uint64) + (ts << 32))
    run = await write_run(fs, mt, kind)
    assert len(run._offs) > 4
    whole = await run.range()
    want = mt.consolidated()
    assert np.array_equal(whole.keys, want.keys) and np.array_equal(whole.ts, want.ts) \
        and np.array_equal(whole.rowids, want.rowids)
    assert len(run._pages) == 0
    pages = await run.pages(list(range(len(run._offs))))
    assert np.array_equal(np.concatenate([p.rowids for p in pages]), whole.rowids)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: not b.endswith(b"\0")), max_size=60),
       st.binary(max_size=5))
def test_variable_length_keys_of_a_page_are_copied_whole(keys, before):
    """The page kernel gives every key back, whatever its length (against slicing one by one)."""
    raw = before + b"".join(keys)
    ends = np.cumsum([len(k) for k in keys], dtype=np.int64)
    got = _fixed_width(raw, len(before), ends, "w", 0)
    assert got.tolist() == keys


def test_key_offsets_out_of_order_or_past_the_page_are_corruption():
    with pytest.raises(RowCorruptionError, match="out of order"):
        _fixed_width(b"abcdef", 0, np.array([3, 2], np.int64), "w", 0)
    with pytest.raises(RowCorruptionError, match="past the page"):
        _fixed_width(b"abcdef", 2, np.array([3, 5], np.int64), "w", 0)
