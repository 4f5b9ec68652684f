"""Active segments (write-ahead, atomic batches, recovery) and sealed segments (B+ tree footer)."""
import asyncio

import numpy as np
import pyarrow as pa
import pytest

from catalog.memory import MemoryCatalog
from rowstore.segments.active import ActiveSegment
from rowstore.rowids import split_rowids
from rowstore.errors import RowCorruptionError
from rowstore.segments.sealed import key_columns_schema, FOOTER_LEN, LEAF_CAP, Footer, SealedSegment, sealed_bytes
from rowstore.schema import parse_schema
from rowstore.segments.wal import RecordKind, U64
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

S1 = parse_schema("id int64 primary key, lat float64, name string")
S2 = S1.add_column("alt", "float32")
SCHEMAS = {1: S1, 2: S2}
KEYS = key_columns_schema(S1)


def batch(lo, hi, schema=S1):
    d = {"id": pa.array(range(lo, hi), pa.int64()), "lat": pa.array([i * 0.5 for i in range(lo, hi)]),
         "name": pa.array([f"n{i}" * (i % 7) for i in range(lo, hi)])}
    if schema is S2:
        d["alt"] = pa.array([float(i) for i in range(lo, hi)], pa.float32())
    return pa.record_batch(d, schema=schema.arrow())


async def new_world():
    w = type("W", (), {})()
    w.cat, w.block, w.objects = MemoryCatalog(), MemoryBlockDevice(), MemoryObjectStore()
    w.fs = TerrascaleFS(w.cat, w.block, MemoryBlockDevice(durable=False), w.objects,
                        config=FsConfig(sealed_block_size=4096, flush=ActiveConfig(flush_ms=0.5)))
    await w.fs.open()
    return w


async def test_append_get_and_recover():
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(5, af, af.where)
    ids = await asyncio.gather(*(seg.append(batch(i * 100, i * 100 + 100), S1, 1000 + i) for i in range(10)))
    all_ids = np.concatenate(ids)
    segs, locs = split_rowids(all_ids)
    assert (segs == 5).all() and sorted(locs.tolist()) == list(range(1000))
    await seg.append_record(RecordKind.PROGRESS, U64.pack(2000))
    await seg.append_record(RecordKind.OPAQUE, b"bookkeeping")
    got = await seg.get(locs[[0, 150, 999]], SCHEMAS.__getitem__, S1)
    want = pa.Table.from_batches([batch(i * 100, i * 100 + 100) for i in range(10)])
    by_id = {r["id"]: r for r in want.to_pylist()}
    for row in got.batch.to_pylist():
        assert row == by_id[row["id"]]
    before = {loc: await seg.get_raw(loc) for loc in [0, 500, 999]}
    w.block.crash()
    await w.fs.close()
    fs2 = TerrascaleFS(w.cat, w.block, MemoryBlockDevice(durable=False), w.objects, config=w.fs.cfg)
    await fs2.open()
    seg2 = await ActiveSegment.recover(5, await fs2.open_active(af.inode))
    assert seg2.durable_rows == 1000 and seg2.wal.closed_ts == 2000 and (seg2.min_ts, seg2.max_ts) == (1000, 1009)
    for loc, raw in before.items():
        assert await seg2.get_raw(loc) == raw
    ids = await seg2.append(batch(5000, 5001), S1, 3000)
    assert split_rowids(ids)[1].tolist() == [1000]


@pytest.mark.parametrize("decision", [True, False, None])
async def test_a_batch_prepared_in_pieces_recovers_whole_or_not_at_all(decision):
    """Log version 2: a prepared batch written as three ``PIECE`` records; after a crash,
    recovery asks the decision (None: committed before the crash) and replays every piece or
    none, with localids in file order; a batch after it takes the next localid."""
    from rowstore.codec.rows import encode_rows
    from rowstore.segments.wal import DECIDED
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(5, af, af.where)
    await seg.append(batch(0, 10), S1, 100)
    txn = DECIDED | 77
    pieces = [await seg.append_encoded(encode_rows(batch(lo, lo + 4), S1, 101), 101, txn, piece=True)
              for lo in (10, 14, 18)]
    assert split_rowids(np.concatenate(pieces))[1].tolist() == list(range(10, 22))
    if decision is None:
        await seg.commit_prepared(txn)
    w.block.crash()
    await w.fs.close()
    fs2 = TerrascaleFS(w.cat, w.block, MemoryBlockDevice(durable=False), w.objects, config=w.fs.cfg)
    await fs2.open()
    asked = []

    async def decide(t):
        asked.append(t)
        return bool(decision)
    seg2 = await ActiveSegment.recover(5, await fs2.open_active(af.inode), decide)
    kept = decision is not False
    assert asked == ([] if decision is None else [txn])
    assert seg2.durable_rows == (22 if kept else 10) and seg2.wal.dropped == (0 if kept else 1)
    if kept:
        got = await seg2.get(np.arange(10, 22), SCHEMAS.__getitem__, S1)
        assert got.batch.column("id").to_pylist() == list(range(10, 22))
    ids = await seg2.append(batch(50, 51), S1, 200)
    assert split_rowids(ids)[1].tolist() == [22 if kept else 10]
    replayed = [b.txn async for b in seg2.batches()]
    assert replayed == ([1, txn, txn, txn, 2] if kept else [1, 2])


async def test_seal_offload_and_paged_reads():
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(9, af, af.where)
    n = 3 * LEAF_CAP + 17  # several leaves and an internal level
    for lo in range(0, n, 700):
        hi = min(lo + 700, n)
        await seg.append(batch(lo, hi, S1 if lo < 1500 else S2), S1 if lo < 1500 else S2, 100 + lo)
    await seg.append_record(RecordKind.OPAQUE, b"x" * 5000)  # dropped by offload
    await w.fs.seal(af.inode)
    probes = [0, 1, LEAF_CAP - 1, LEAF_CAP, 2 * LEAF_CAP + 5, n - 1]
    before = {loc: await seg.get_raw(loc) for loc in probes}
    stats = {}
    rec = await w.fs.offload(af.inode, sealed_bytes(9, seg.batches(), SCHEMAS.__getitem__, KEYS, stats))
    assert stats["rows"] == n
    sseg = await SealedSegment.open(await w.fs.open_sealed(rec.inode))
    f = sseg.footer
    assert (f.segid, f.rows, f.height, f.versions) == (9, n, 2, (1, 2))
    assert (f.min_ts, f.max_ts) == (100, 100 + 2800)
    for loc, raw in before.items():
        assert await sseg.get_raw(loc) == raw
    rows = await sseg.get([0, n - 1], SCHEMAS.__getitem__, S2)
    assert rows.batch.to_pylist()[0]["alt"] is None and rows.batch.to_pylist()[1]["alt"] == float(n - 1)
    scanned = [d async for d in sseg.scan(SCHEMAS.__getitem__, S2)]
    ids = np.concatenate([d.batch.column("id").to_numpy() for d in scanned])
    assert ids.tolist() == list(range(n))
    with pytest.raises(RowCorruptionError):
        await sseg.locate(n)
    fresh = await SealedSegment.open(await w.fs.open_sealed(rec.inode))
    assert fresh.located(LEAF_CAP) is None and fresh.get_raw_cached(LEAF_CAP) is None  # nothing parsed yet
    for loc, raw in before.items():  # the no-I/O path equals the walk once the walk has run
        assert await fresh.get_raw(loc) == raw
        assert fresh.located(loc) == await fresh.locate(loc) and fresh.get_raw_cached(loc) == raw
    with pytest.raises(RowCorruptionError):
        fresh.located(n)


async def test_damaged_footer_and_page_detected():
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(3, af, af.where)
    await seg.append(batch(0, 50), S1, 7)
    await w.fs.seal(af.inode)
    chunks = [c async for c in sealed_bytes(3, seg.batches(), SCHEMAS.__getitem__, KEYS)]
    raw = b"".join(chunks)
    assert len(chunks[-1]) == FOOTER_LEN

    async def gen(data):
        yield data

    bad = bytearray(raw)
    bad[-50] ^= 1
    rec = await w.fs.create_sealed(gen(bytes(bad)))
    with pytest.raises(RowCorruptionError, match="footer checksum"):
        await SealedSegment.open(await w.fs.open_sealed(rec.inode))


async def test_footer_min_max_keys_for_string_and_int_keys():
    from rowstore.segments.sealed import Footer, FOOTER_LEN

    flip = lambda v: ((v + (1 << 64)) % (1 << 64) ^ (1 << 63)).to_bytes(8, "big")  # noqa: E731
    for text, vals, lo, hi in (
        ("id string primary key, v int64", ["pear", "apple", "zoo"], b"apple", b"zoo"),
        ("id int64 primary key, v int64", [5, -3, 9], flip(-3), flip(9)),
    ):
        s = parse_schema(text)
        keys_schema = key_columns_schema(s)
        w = await new_world()
        af = await w.fs.create()
        seg = ActiveSegment(4, af, af.where)
        await seg.append(pa.record_batch({"id": vals, "v": [1, 2, 3]}, schema=s.arrow()), s, 7)
        raw = b"".join([c async for c in sealed_bytes(4, seg.batches(), lambda v, s=s: s, keys_schema)])
        f = Footer.unpack(raw[-FOOTER_LEN:], "t", 0)
        assert (f.min_key, f.max_key) == (lo, hi)


async def _offloaded(w, n, segid=11, deleted_every=0):
    """An offloaded segment of ``n`` rows in batches of 300, alternating versions S1/S2."""
    af = await w.fs.create()
    seg = ActiveSegment(segid, af, af.where)
    for lo in range(0, n, 300):
        hi, s = min(lo + 300, n), S1 if (lo // 300) % 2 == 0 else S2
        dels = (np.arange(lo, hi) % deleted_every == 0) if deleted_every else None
        await seg.append(batch(lo, hi, s), s, 1000 + lo, dels)
    await w.fs.seal(af.inode)
    rec = await w.fs.offload(af.inode, sealed_bytes(segid, seg.batches(), SCHEMAS.__getitem__, KEYS))
    return await SealedSegment.open(await w.fs.open_sealed(rec.inode))


async def test_scan_in_runs_equals_point_gets(monkeypatch):
    import rowstore.segments.sealed as ss

    monkeypatch.setattr(ss, "_SCAN_RUN", 5000)  # many runs, several in flight, rows cut across blocks
    monkeypatch.setattr(ss, "_SCAN_AHEAD", 3)
    w = await new_world()
    n = 4 * LEAF_CAP + 3
    sseg = await _offloaded(w, n, deleted_every=7)
    scanned = [d async for d in sseg.scan(SCHEMAS.__getitem__, S2)]
    assert len(scanned) > 5
    got = pa.Table.from_batches([d.batch for d in scanned])
    want = await sseg.get(np.arange(n), SCHEMAS.__getitem__, S2)
    assert got.to_pylist() == want.batch.to_pylist()
    assert got.column("id").to_pylist() == list(range(n))
    ts = np.concatenate([d.commit_ts for d in scanned])
    assert ts.tolist() == want.commit_ts.tolist() == [1000 + i // 300 * 300 for i in range(n)]
    assert np.concatenate([d.deleted for d in scanned]).tolist() == [i % 7 == 0 for i in range(n)]
    assert np.concatenate([d.schema_ver for d in scanned]).tolist() == [1 + (i // 300) % 2 for i in range(n)]


async def test_scan_stopped_early_leaves_nothing_running(monkeypatch):
    import rowstore.segments.sealed as ss

    monkeypatch.setattr(ss, "_SCAN_RUN", 2000)
    w = await new_world()
    sseg = await _offloaded(w, 3000)
    it = sseg.scan(SCHEMAS.__getitem__, S1)
    first = await it.__anext__()
    assert first.batch.column("id").to_pylist()[0] == 0
    await it.aclose()
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if others:  # the read-ahead, told to stop, ends by itself (cancelled or done) without a read
        await asyncio.wait(others, timeout=5)
    assert all(t.done() for t in others)


def _reindex(raw: bytes, at: int, value: int, fix_crc: bool) -> bytes:
    """``raw`` (a sealed segment) with the u32 at ``at`` replaced; optionally the footer's
    index_crc (and footer crc) recomputed so that only the tree's own invariants can tell."""
    from crc32c import crc32c

    from rowstore.segments.sealed import FOOTER

    out = bytearray(raw)
    out[at : at + 4] = value.to_bytes(4, "little")
    if fix_crc:
        f = list(FOOTER.unpack(bytes(out[-FOOTER_LEN:])))
        f[24] = crc32c(bytes(out[f[6] : len(out) - FOOTER_LEN]))  # index pages: rows_len .. footer
        body = FOOTER.pack(*f)
        out[-FOOTER_LEN:] = body[:-4] + crc32c(body[:-4]).to_bytes(4, "little")
    return bytes(out)


@pytest.mark.parametrize("fix_crc,msg", [(False, "index_crc"), (True, "leaf page")])
async def test_damaged_leaf_level_is_named(fix_crc, msg):
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(3, af, af.where)
    await seg.append(batch(0, 2 * LEAF_CAP + 5), S1, 7)
    await w.fs.seal(af.inode)
    raw = b"".join([c async for c in sealed_bytes(3, seg.batches(), SCHEMAS.__getitem__, KEYS)])
    f = Footer.unpack(raw[-FOOTER_LEN:], "t", 0)
    second_leaf = f.rows_len + 8 + 4 * LEAF_CAP
    bad = _reindex(raw, second_leaf, LEAF_CAP + 1, fix_crc)  # the second leaf's first localid

    async def gen():
        yield bad

    rec = await w.fs.create_sealed(gen())
    sseg = await SealedSegment.open(await w.fs.open_sealed(rec.inode))
    with pytest.raises(RowCorruptionError, match=msg) as ei:
        async for _ in sseg.scan(SCHEMAS.__getitem__, S1):
            pass
    assert ei.value.where == sseg.where and ei.value.offset is not None


async def test_row_offsets_that_do_not_chain_are_named():
    """A leaf offset moved inside the row section (index crc kept valid): the run's rows no
    longer chain and the scan names the row, instead of serving shifted bytes."""
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(3, af, af.where)
    await seg.append(batch(0, 100), S1, 7)
    await w.fs.seal(af.inode)
    raw = b"".join([c async for c in sealed_bytes(3, seg.batches(), SCHEMAS.__getitem__, KEYS)])
    f = Footer.unpack(raw[-FOOTER_LEN:], "t", 0)
    at = f.rows_len + 8 + 4 * 50  # offset of localid 50
    old = int.from_bytes(raw[at : at + 4], "little")
    bad = _reindex(raw, at, old + 1, fix_crc=True)

    async def gen():
        yield bad

    rec = await w.fs.create_sealed(gen())
    sseg = await SealedSegment.open(await w.fs.open_sealed(rec.inode))
    with pytest.raises(RowCorruptionError) as ei:
        async for _ in sseg.scan(SCHEMAS.__getitem__, S1):
            pass
    assert ei.value.offset is not None and ei.value.where == sseg.where
