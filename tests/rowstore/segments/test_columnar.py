"""Columnar sealed segments (version 2, docs/format/segment.md §7) against row-wise ones of
the same rows: scans, rows by localid, row bytes, statistics and group skipping, schema
versions mixed in one segment, deletions, an empty segment; damage named by segment and
column; the collector's input from either format."""
import struct
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rowstore.segments.columnar as columnar
from rowstore.errors import ColumnCorruptionError, RowCorruptionError
from rowstore.reads.predicates import parse_bbox, parse_where
from rowstore.reads.zones import group_keep, group_mask
from rowstore.schema import parse_schema
from rowstore.segments.active import ActiveSegment
from rowstore.segments.columnar import ColumnarSegment, open_segment
from rowstore.segments.columnar_layout import BLOCK_SIZE, COL_MAGIC, GROUP_ROWS, KIND_CODES, TRAILER_LEN
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.fsck import check_sealed_segment
from rowstore.segments.relocate import read_live
from rowstore.segments.sealed import SealedSegment, key_columns_schema, sealed_bytes
from rowstore.types import Kind
from terrafs.cache import BlockCache
from terrafs.sealed import SealedFile
from tests.rowstore.segments.test_segments import KEYS, S1, S2, SCHEMAS, batch, new_world

S3 = S2.drop_column("name").add_column("name", "string")  # the name re-added: a new column id
ALL_SCHEMAS = {x.version: x for x in (S1, S2, S3)}


def _batch(lo, hi, s):
    if s is S3:
        b = batch(lo, hi, S2)
        return pa.record_batch({"id": b.column("id"), "lat": b.column("lat"), "alt": b.column("alt"),
                                "name": pa.array([f"new{i}" if i % 5 else None for i in range(lo, hi)])},
                               schema=S3.arrow())
    return batch(lo, hi, s)


async def _both(w, n, step=7000, segid=9):
    """The same rows offloaded row-wise and columnar: (row-wise, columnar, the active segment)."""
    af = await w.fs.create()
    seg = ActiveSegment(segid, af, af.where)
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        s = (S1, S2, S3)[(lo // step) % 3]
        await seg.append(_batch(lo, hi, s), s, 100 + lo, np.arange(lo, hi) % 11 == 3)
    await w.fs.seal(af.inode)
    raw_rows = b"".join([c async for c in sealed_bytes(segid, seg.batches(), ALL_SCHEMAS.__getitem__, KEYS)])
    stats = {}
    chunks = [c async for c in columnar_bytes(segid, seg.batches(), ALL_SCHEMAS.__getitem__, KEYS, stats)]
    v1 = await w.fs.create_sealed(_gen(raw_rows))
    v2 = await w.fs.create_sealed(_gen(*chunks), block_size=BLOCK_SIZE)
    return (await open_segment(await w.fs.open_sealed(v1.inode)),
            await open_segment(await w.fs.open_sealed(v2.inode)), seg, stats, v2)


async def _gen(*parts):
    for p in parts:
        yield p


async def test_same_rows_as_row_wise():
    w = await new_world()
    n = 2 * GROUP_ROWS + 1234
    rows, cols, active, stats, _ = await _both(w, n)
    assert isinstance(rows, SealedSegment) and isinstance(cols, ColumnarSegment)
    assert (cols.footer.rows, cols.groups, cols.footer.versions) == (n, 3, (1, 2, S3.version))
    assert (cols.footer.min_ts, cols.footer.max_ts) == (rows.footer.min_ts, rows.footer.max_ts)
    assert (cols.footer.min_key, cols.footer.max_key)[0][:8] == rows.footer.min_key
    assert stats["deletions"] == int((np.arange(n) % 11 == 3).sum()) and stats["format"] == 2
    for target in (S1, S2, S3):
        want = [d async for d in rows.scan(ALL_SCHEMAS.__getitem__, target)]
        got = [d async for d in cols.scan(None, target)]
        w_t = pa.Table.from_batches([d.batch for d in want])
        g_t = pa.Table.from_batches([d.batch for d in got])
        assert g_t.to_pylist() == w_t.to_pylist()
        for f in ("commit_ts", "deleted", "schema_ver"):
            assert np.concatenate([getattr(d, f) for d in got]).tolist() == \
                np.concatenate([getattr(d, f) for d in want]).tolist()
    locs = np.sort(np.random.default_rng(1).choice(n, 300, replace=False))
    got = await cols.take(locs, S3)
    want = await rows.get(locs, ALL_SCHEMAS.__getitem__, S3)
    assert got.batch.to_pylist() == want.batch.to_pylist()
    assert got.commit_ts.tolist() == want.commit_ts.tolist() and got.deleted.tolist() == want.deleted.tolist()
    for loc in [0, 3, GROUP_ROWS - 1, GROUP_ROWS, n - 1, *locs[:20].tolist()]:
        raw = await active.get_raw(int(loc))
        assert await cols.row_bytes(int(loc)) == raw == await rows.get_raw(int(loc))
        assert cols.row_bytes_cached(int(loc)) == raw  # its pages are in the memory cache now
    await check_sealed_segment(cols)


async def test_a_take_across_many_groups_reads_a_batch_of_groups_at_a_time():
    """Rows spread over every group (a sparse query touches every page): the pages are read a
    batch of groups at a time, so a take holds a bounded share of the segment; the answer is
    the one read at once."""
    w = await new_world()
    n = 2 * GROUP_ROWS + 1234
    rows, cols, _, _, _ = await _both(w, n)
    locs = np.sort(np.random.default_rng(2).choice(n, 900, replace=False))
    want = await rows.get(locs, ALL_SCHEMAS.__getitem__, S3)
    spans: list[list[tuple[int, int]]] = []
    real = cols.sf.read_spans

    async def spy(s):
        spans.append(s)
        return await real(s)
    for budget, calls in ((1 << 40, 1), (1, 3)):
        spans.clear()
        columnar.DECODED.clear()
        with mock.patch.object(columnar, "_TAKE_BYTES", budget), mock.patch.object(cols.sf, "read_spans", spy):
            got = await cols.take(locs, S3)
        assert got.batch.to_pylist() == want.batch.to_pylist()
        assert (got.commit_ts.tolist(), got.deleted.tolist()) == (want.commit_ts.tolist(), want.deleted.tolist())
        assert len(spans) == calls
        firsts = cols.meta.pages["off"][cols.meta.chunks["first"][:, 0]].tolist()  # where each group starts
        for s in spans if calls > 1 else []:  # each call reads the pages of one group
            assert len({int(np.searchsorted(firsts, off, "right")) for off, _ in s}) == 1


async def test_an_empty_segment():
    w = await new_world()
    chunks = [c async for c in columnar_bytes(4, _gen(), SCHEMAS.__getitem__, KEYS)]
    rec = await w.fs.create_sealed(_gen(*chunks), block_size=BLOCK_SIZE)
    seg = await open_segment(await w.fs.open_sealed(rec.inode))
    assert isinstance(seg, ColumnarSegment) and seg.footer.rows == 0 and seg.groups == 0
    assert [d async for d in seg.scan(None, S1)] == []
    assert (await seg.take(np.zeros(0, np.int64), S1)).batch.num_rows == 0
    await check_sealed_segment(seg)


def test_format_constants():
    assert COL_MAGIC == b"TRSEGCL2" and TRAILER_LEN == 128 and GROUP_ROWS == 65536
    assert [KIND_CODES[k] for k in (Kind.INT8, Kind.UINT64, Kind.FLOAT64, Kind.BOOL, Kind.STRING, Kind.TIMESTAMP,
                                    Kind.UUID, Kind.JSON, Kind.POINT, Kind.BOX, Kind.RANGE)] == \
        [1, 8, 10, 11, 12, 14, 16, 17, 18, 19, 20]


async def test_statistics_skip_only_groups_that_cannot_match():
    w = await new_world()
    n = 3 * GROUP_ROWS
    _, cols, _, _, _ = await _both(w, n, step=GROUP_ROWS // 2)
    decoded = pa.Table.from_batches([d.batch async for d in cols.scan(None, S3)])
    for where in (["id", "<", 1000], ["id", ">=", 2 * GROUP_ROWS + 5], ["lat", ">", 1e9], ["alt", "=", 3.0],
                  ["alt", "!=", 3.0], ["name", "=", "new7"], ["name", "<", "a"], ["id", "=", n + 5]):
        terms = parse_where(S3, [where])
        mask = group_mask(cols, terms, None)
        for g in range(cols.groups):
            part = decoded.slice(g * GROUP_ROWS, GROUP_ROWS).to_batches()[0]
            from rowstore.reads.predicates import batch_mask
            hits = batch_mask(part, terms, None).any()
            assert mask[g] or not hits, (where, g)  # never skips a group holding a match
        if where[0] == "id" and where[1] == "<":
            assert mask.tolist() == [True, False, False]
        if where[0] == "lat" or where[2] == n + 5:
            assert not mask.any()
    ids = (np.uint64(9) << np.uint64(32)) | np.arange(n, dtype=np.uint64)
    keep = group_keep(ids, {9: cols}, parse_where(S3, [["id", ">=", 2 * GROUP_ROWS]]), None)
    assert keep is not None and keep.sum() == GROUP_ROWS and keep[-1] and not keep[0]


async def test_bbox_skips_by_the_extent_of_points():
    s = parse_schema("id int64 primary key, loc point")
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(5, af, af.where)
    n = 2 * GROUP_ROWS
    xs = np.where(np.arange(n) < GROUP_ROWS, 10.0, 50.0) + np.random.default_rng(2).random(n)
    await seg.append(pa.record_batch({"id": np.arange(n), "loc": pa.StructArray.from_arrays(
        [pa.array(xs), pa.array(xs)], ["x", "y"])}, schema=s.arrow()), s, 5)
    await w.fs.seal(af.inode)
    chunks = [c async for c in columnar_bytes(5, seg.batches(), lambda v: s, key_columns_schema(s))]
    rec = await w.fs.create_sealed(_gen(*chunks), block_size=BLOCK_SIZE)
    cols = await open_segment(await w.fs.open_sealed(rec.inode))
    box = parse_bbox(s, {"column": "loc", "xmin": 49, "ymin": 49, "xmax": 60, "ymax": 60})
    assert group_mask(cols, [], box).tolist() == [False, True]
    await check_sealed_segment(cols)


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 900), min_size=1, max_size=6),
       versions=st.lists(st.sampled_from(sorted(ALL_SCHEMAS)), min_size=6, max_size=6))
async def test_batches_of_any_size_and_version(sizes, versions):
    """Property: whatever the batches' sizes (empty ones too) and versions, the columnar
    segment decodes to exactly the rows a row-wise segment of them decodes to."""
    w = await new_world()
    af = await w.fs.create()
    seg = ActiveSegment(7, af, af.where)
    lo = 0
    for size, v in zip(sizes, versions):
        s = ALL_SCHEMAS[v]
        if size:
            await seg.append(_batch(lo, lo + size, s), s, 10 + lo)
        lo += size
    await w.fs.seal(af.inode)
    raw = b"".join([c async for c in sealed_bytes(7, seg.batches(), ALL_SCHEMAS.__getitem__, KEYS)])
    chunks = [c async for c in columnar_bytes(7, seg.batches(), ALL_SCHEMAS.__getitem__, KEYS)]
    r1 = await open_segment(await w.fs.open_sealed((await w.fs.create_sealed(_gen(raw))).inode))
    rec = await w.fs.create_sealed(_gen(*chunks), block_size=BLOCK_SIZE)
    r2 = await open_segment(await w.fs.open_sealed(rec.inode))
    for target in (S1, S3):
        a = [d.batch async for d in r1.scan(ALL_SCHEMAS.__getitem__, target)]
        b = [d.batch async for d in r2.scan(None, target)]
        assert sum(x.num_rows for x in a) == sum(x.num_rows for x in b) == lo
        if lo:
            assert pa.Table.from_batches(b).to_pylist() == pa.Table.from_batches(a).to_pylist()
    await check_sealed_segment(r2)


async def _object_bytes(w, rec):
    return bytearray(await w.objects.get(rec.location))


async def _reopen(w, rec, data):
    """The object replaced by ``data``, opened with an empty block cache."""
    await w.objects.put(rec.location, bytes(data))
    return await open_segment(await SealedFile.open(w.objects, rec.location, cache=BlockCache(1 << 20)))


async def test_a_flipped_byte_in_a_chunk_names_segment_and_column():
    """A byte flipped inside the page of the ``alt`` column: reading that column fails naming
    the segment and the column; reading other columns works; fsck finds it."""
    w = await new_world()
    _, cols, _, _, rec = await _both(w, 20000)
    ci = cols.index_of(S2.by_name("alt"))
    a, _ = cols._page_span(0, ci)
    off = int(cols.meta.pages["off"][a])
    blk = int(np.searchsorted(cols.sf._logical, off))
    phys = int(cols.sf._blocks["physical"][blk])
    data = await _object_bytes(w, await w.fs.stat(rec.inode))
    data[phys + 40] ^= 0x10  # inside the block's payload
    seg = await _reopen(w, await w.fs.stat(rec.inode), data)
    ok = pa.Table.from_batches([d.batch async for d in seg.scan(None, S1)])  # S1 has no alt
    assert ok.num_rows == 20000
    with pytest.raises(ColumnCorruptionError) as ei:
        [d async for d in seg.scan(None, S2)]
    assert f"segment 9 column id {S2.by_name('alt').id}" in ei.value.where
    with pytest.raises(ColumnCorruptionError) as ei:
        await seg.take(np.array([5]), S2)
    assert "column id" in ei.value.where
    with pytest.raises(ColumnCorruptionError):
        await check_sealed_segment(seg)


async def test_damaged_metadata_and_trailer_are_refused():
    """A byte of the trailer or of the metadata changed (inside blocks whose own checksums
    hold): the segment does not open."""
    w = await new_world()
    _, cols, _, _, _ = await _both(w, 3000)
    size, meta_off = cols.sf.size, cols.footer.rows_len
    clean = bytearray(await cols.sf.read(0, size))
    for logical, match in ((size - 20, "trailer checksum"), (size - 3, "bad segment magic"),
                           (meta_off + 40, "metadata checksum")):
        bad = bytearray(clean)
        bad[logical] ^= 0x01
        rec = await w.fs.create_sealed(_gen(bytes(bad[:meta_off]), bytes(bad[meta_off:])), block_size=BLOCK_SIZE)
        with pytest.raises(RowCorruptionError, match=match):  # the magic gone: read as version 1, refused
            await open_segment(await w.fs.open_sealed(rec.inode))


async def test_statistics_that_lie_are_found_by_fsck():
    """Metadata rewritten with a wrong maximum (and a matching checksum): fsck compares the
    bounds with the decoded values."""
    w = await new_world()
    _, cols, _, _, _ = await _both(w, 3000)
    size = cols.sf.size
    seg_bytes = bytearray(await cols.sf.read(0, size))
    meta_off, meta_len = cols.footer.rows_len, size - TRAILER_LEN - cols.footer.rows_len
    meta = bytearray(seg_bytes[meta_off : meta_off + meta_len])
    ci = cols.index_of(S1.by_name("id"))
    chunks_at = bytes(meta).find(cols.meta.chunks.tobytes()[:84])
    entry = chunks_at + 84 * ci
    meta[entry + 52 : entry + 60] = struct.pack("<q", 5)  # max id 5: the rows go to 2999
    from catalog.checksum import crc32c
    trailer = bytearray(seg_bytes[-TRAILER_LEN:])
    trailer[28:32] = struct.pack("<I", crc32c(bytes(meta)))
    trailer[116:120] = struct.pack("<I", crc32c(bytes(trailer[:116])))
    bad = await w.fs.create_sealed(_gen(bytes(seg_bytes[:meta_off]), bytes(meta), bytes(trailer)),
                                   block_size=BLOCK_SIZE)
    seg = await open_segment(await w.fs.open_sealed(bad.inode))
    with pytest.raises(ColumnCorruptionError, match="outside the chunk's bounds") as ei:
        await check_sealed_segment(seg)
    assert f"column id {S1.by_name('id').id}" in ei.value.where


async def test_the_collectors_input_is_the_same_from_either_format():
    w = await new_world()
    n = GROUP_ROWS + 500
    rows, cols, _, _, _ = await _both(w, n)
    live = np.random.default_rng(4).random(n) < 0.3
    a = await read_live(rows, live, 0, ALL_SCHEMAS.__getitem__, S3)
    b = await read_live(cols, live, 0, ALL_SCHEMAS.__getitem__, S3)
    assert a.rowids.tolist() == b.rowids.tolist() and a.lens.tolist() == b.lens.tolist()
    assert a.batch.to_pylist() == b.batch.to_pylist() and a.versions.tolist() == b.versions.tolist()
    ra = [a.buf[s : s + ln].tobytes() for s, ln in zip(a.starts, a.lens)]
    rb = [b.buf[s : s + ln].tobytes() for s, ln in zip(b.starts, b.lens)]
    assert ra == rb  # the same row bytes: a copy of either is the same copy


async def test_a_point_read_from_decoded_pages_equals_the_batch():
    """``row_cached`` (a point read's hot path: decoded pages, no batch) gives exactly the row
    the vectorized read gives, for every target version; None before its pages were read."""
    w = await new_world()
    _, cols, _, _, _ = await _both(w, 30000)
    locs = [0, 6999, 7000, 14001, 29999]
    with mock.patch.object(columnar, "DECODED", columnar.DecodedPages(1 << 20)):
        fresh = await ColumnarSegment.open(await SealedFile.open(w.objects, cols.sf.key, cache=BlockCache(1 << 20)))
        assert fresh.row_cached(locs[1], S3) is None  # its pages are neither decoded nor cached
        for target in (S1, S2, S3):
            batch = (await fresh.take(np.array(locs), target)).batch.to_pylist()
            for loc, want in zip(locs, batch):
                assert fresh.row_cached(loc, target) == want == await fresh.row(loc, target)


async def _offloaded_store():
    """A columnar store holding one offloaded segment of 500 rows: (world, store, segment, record)."""
    from rowstore.segments.store import SegmentStore

    w = await new_world()
    st = SegmentStore(w.fs, ALL_SCHEMAS.__getitem__, columnar=True)
    await st.open()
    seg = await st.create("t", 0)
    await seg.append(_batch(0, 500, S2), S2, 7)
    await st.seal(seg.segid)
    return w, st, seg, await st.offload(seg.segid, KEYS)


async def test_the_store_gives_rows_of_a_columnar_segment_in_the_order_asked():
    _, st, seg, rec = await _offloaded_store()
    assert rec.format == 2
    ids = (np.uint64(seg.segid) << np.uint64(32)) | np.array([400, 3, 250, 3 + 1], np.uint64)
    got = await st.get(ids, S2)
    assert got.batch.column("id").to_pylist() == [400, 3, 250, 4]


async def test_a_segment_collected_during_a_read_is_a_retry_and_a_lost_object_an_error():
    """A read that opened a segment whose object then goes: when the collector retired or
    deleted the segment meanwhile (``gc.grace`` 0 s deletes at once) the read answers
    "unavailable, retry" (the index names its copies by then); while the segment's row still
    names the object it is an error, not a retry (a lost object)."""
    from catalog.abc import Check, Delete
    from terrafs.catalog_ops import commit
    from rowstore.errors import UnavailableError
    from rowstore.segments.fetch import fetch
    from terrafs.errors import ObjectNotFoundError

    w, st, seg, _ = await _offloaded_store()
    ids = (np.uint64(seg.segid) << np.uint64(32)) | np.arange(0, 500, 7).astype(np.uint64)
    assert (await st.get(ids, S2)).batch.num_rows == len(ids)  # opened
    key = (await w.fs.stat((await st.record(seg.segid))[0].inode)).location
    await w.objects.delete(key)  # the object lost, its segment row still there

    async def cold():  # no block of it in either tier of the cache, no decoded page
        await w.fs.cache.drain()
        await w.fs.cache.open()
        w.fs.cache.forget_object(key)
        columnar.DECODED.clear()
    await cold()
    with pytest.raises(ObjectNotFoundError):
        await fetch(st, ids, ALL_SCHEMAS.__getitem__, S2)
    _, e = await st.record(seg.segid)
    await commit(w.cat, [Check(e.key, e.version)], [Delete(e.key)])  # as the collector's delete leaves it
    await cold()
    with pytest.raises(UnavailableError, match="collected during the read"):
        await fetch(st, ids, ALL_SCHEMAS.__getitem__, S2)
