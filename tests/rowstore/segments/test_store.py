"""The segment table: create/append/seal/offload/get with one transaction per switch, crashes."""
import asyncio

import numpy as np
import pyarrow as pa
import pytest

from catalog.memory import MemoryCatalog
from rowstore.errors import DanglingRowidError
from rowstore.rowids import split_rowids
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegState, SegmentStore
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.failpoints import FailPointCrash, armed
from terrafs.fs import FsConfig, TerrascaleFS
from tests.rowstore.segments.test_segments import KEYS, S1, SCHEMAS, batch


class World:
    def __init__(self):
        self.cat, self.block, self.objects = MemoryCatalog(), MemoryBlockDevice(), MemoryObjectStore()

    async def start(self):
        fs = TerrascaleFS(self.cat, self.block, MemoryBlockDevice(durable=False), self.objects,
                          config=FsConfig(sealed_block_size=4096, flush=ActiveConfig(flush_ms=0.5)))
        await fs.open()
        store = SegmentStore(fs, SCHEMAS.__getitem__)
        self.pending = await store.open()
        return store


async def test_lifecycle_and_reads():
    w = World()
    st = await w.start()
    segs = await asyncio.gather(*(st.create("t", p) for p in range(8)))
    assert len({s.segid for s in segs}) == 8
    seg = segs[0]
    ids = await seg.append(batch(0, 300), S1, 10)
    rec = await st.seal(seg.segid)
    assert (rec.state, rec.rows, rec.min_ts, rec.max_ts) == (SegState.SEALED, 300, 10, 10)
    got = await st.get(ids[[5, 299]], S1)
    assert got.batch.column("id").to_pylist() == [5, 299]
    rec = await st.offload(seg.segid, KEYS)
    assert rec.state == SegState.OFFLOADED and rec.location.endswith(".tfs")
    got = await st.get(ids[[0, 150]], S1)
    assert got.batch.column("id").to_pylist() == [0, 150]
    assert [r.state for r in await st.list(table="t")].count(SegState.ACTIVE) == 7


@pytest.mark.parametrize("point", ["offload.before_upload", "offload.after_upload", "offload.after_catalog"])
async def test_crash_during_segment_offload(point):
    w = World()
    st = await w.start()
    seg = await st.create("t", 0)
    ids = await seg.append(batch(0, 100), S1, 5)
    await st.seal(seg.segid)
    with armed(point), pytest.raises(FailPointCrash):
        await st.offload(seg.segid, KEYS)
    w.block.crash()
    st2 = await w.start()
    rec, _ = await st2.record(seg.segid)
    if point == "offload.after_catalog":
        assert rec.state == SegState.OFFLOADED and w.pending == []
    else:
        assert rec.state == SegState.SEALED and w.pending == [seg.segid]
        rec = await st2.offload(seg.segid, KEYS)
    got = await st2.get(ids, S1)
    assert got.batch.column("id").to_pylist() == list(range(100))


async def test_acknowledged_rows_survive_a_crash():
    w = World()
    st = await w.start()
    seg = await st.create("t", 0)
    acked = await asyncio.gather(*(seg.append(batch(i * 10, i * 10 + 10), S1, 100 + i) for i in range(20)))
    w.block.crash()
    st2 = await w.start()
    seg2 = st2.active[seg.segid]
    assert seg2.durable_rows == 200
    got = await st2.get(np.concatenate(acked), S1)
    assert sorted(got.batch.column("id").to_pylist()) == list(range(200))
    assert split_rowids(np.concatenate(acked))[0].tolist() == [seg.segid] * 200


async def test_rollover_at_seal_bytes():
    w = World()
    st = await w.start()
    st.seal_bytes = 20_000
    ids = []
    for i in range(12):
        ids.append(await st.append("t", 3, batch(i * 100, i * 100 + 100), S1, 10 + i))
    recs = await st.list(table="t")
    states = sorted(r.state.value for r in recs)
    assert states.count("active") == 1 and states.count("sealed") >= 2
    for segid in await st.pending_offload():
        await st.offload(segid, KEYS)
    for i, part in enumerate(ids):
        got = await st.get(part, S1)
        assert got.batch.column("id").to_pylist() == list(range(i * 100, i * 100 + 100))
    w.block.crash()
    st2 = await w.start()
    assert (await st2.current("t", 3)).segid == (await st.current("t", 3)).segid


async def test_delete_never_returns_the_segid_and_a_stale_rowid_is_corruption():
    """docs/format/segment.md §6: a deleted segment's id stays taken; a rowid naming it (or a
    localid past a segment's end) reads as DanglingRowidError, never another segment's row."""
    w = World()
    st = await w.start()
    a = await st.create("t", 0)
    b = await st.create("t", 1)
    await a.append(batch(0, 2000), S1, 1)
    got = [d async for d in st.scan(a.segid, S1)]
    assert sum(d.batch.num_rows for d in got) == 2000
    await st.seal(a.segid)
    await st.offload(a.segid, KEYS)
    got = [d async for d in st.scan(a.segid, S1)]
    assert pa_ids(got) == list(range(2000))
    with pytest.raises(DanglingRowidError, match="localid 2000"):
        await fetch(st, np.array([(a.segid << 32) | 2000], np.uint64), lambda v: S1, S1, "table 't' partition 0")
    free_before = await st.segids.free_ranges()
    assert await st.delete(a.segid) and not await st.delete(a.segid)
    assert await w.objects.list("files/") == []
    assert await st.segids.free_ranges() == free_before  # the segid is not returned
    assert [r.segid for r in await st.list()] == [b.segid]
    with pytest.raises(DanglingRowidError, match="table 't' partition 0.*no such segment"):
        await fetch(st, np.array([(a.segid << 32) | 5], np.uint64), lambda v: S1, S1, "table 't' partition 0")
    with pytest.raises(DanglingRowidError):
        await st.row_bytes((a.segid << 32) | 5, "table 't' partition 0")
    made = {(await st.create("t", 2 + i)).segid for i in range(50)}
    assert a.segid not in made and b.segid not in made


def pa_ids(decoded):
    return [i for d in decoded for i in d.batch.column("id").to_pylist()]


async def test_flipped_byte_in_sealed_segment_is_never_served():
    from terrafs.errors import FileCorruptionError

    w = World()
    st = await w.start()
    seg = await st.create("t", 0)
    ids = await seg.append(batch(0, 3000), S1, 1)
    await st.seal(seg.segid)
    rec = await st.offload(seg.segid, KEYS)
    raw = bytearray(await w.objects.get(rec.location))
    raw[5000] ^= 0x04  # inside the row section
    await w.objects.put(rec.location, bytes(raw))
    st2 = await w.start()
    with pytest.raises(FileCorruptionError) as ei:
        async for _ in st2.scan(seg.segid, S1):
            pass
    assert ei.value.where.endswith(rec.location) and ei.value.offset is not None
    with pytest.raises(FileCorruptionError):
        for part in np.array_split(ids, 30):
            await st2.get(part[:1], S1)


async def test_segments_on_s3_through_moto(s3_bucket_uri):
    """Seal and offload to S3 (a moto_server process), then page rows in from another node."""
    from terrafs.uri import open_object_store

    store = open_object_store(s3_bucket_uri)
    await store.open_store()
    w = World()
    w.objects = store
    st = await w.start()
    seg = await st.create("t", 0)
    ids = await seg.append(batch(0, 5000), S1, 42)
    await st.seal(seg.segid)
    rec = await st.offload(seg.segid, KEYS)
    assert (await store.head(rec.location)).size > 0
    other = SegmentStore(TerrascaleFS(w.cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), store,
                                      config=FsConfig(node_id="n2")), st.schemas)
    await other.fs.open()
    await other.open()
    got = await other.get(ids[[0, 2500, 4999]], S1)
    assert got.batch.column("id").to_pylist() == [0, 2500, 4999]
    assert pa_ids([d async for d in other.scan(seg.segid, S1)]) == list(range(5000))
    await store.close()


@pytest.mark.parametrize("job", ["seal", "offload"])
async def test_a_seal_or_offload_of_a_segment_released_on_its_way_is_unavailable(job):
    """The partition moved to another leader while the job read the segment's row: this node
    released the segment, and the job answers 503 (retry elsewhere), not a KeyError (a 500 that
    the nemesis suite's logs showed as ``job_failed job=seal error=KeyError``)."""
    from rowstore.errors import UnavailableError

    st = await World().start()
    seg = await st.create("t", 0)
    await seg.append(batch(0, 10), S1, 10)
    if job == "offload":
        await st.seal(seg.segid)
    real = st.record

    async def released_meanwhile(segid):
        got = await real(segid)
        st.release_local("t", 0)  # the demotion lands while the row is being read
        return got
    st.record = released_meanwhile
    with pytest.raises(UnavailableError, match="no longer open here"):
        await (st.seal(seg.segid) if job == "seal" else st.offload(seg.segid, KEYS))


async def test_a_scan_of_a_segment_released_and_closed_midway_is_unavailable(monkeypatch):
    import rowstore.segments.store_reads
    import terrafs.active
    from rowstore.errors import UnavailableError

    monkeypatch.setattr(terrafs.active, "_SCAN_RUN", 1)  # a read per block: the next one finds the file closed
    monkeypatch.setattr(rowstore.segments.store_reads, "_SCAN_ROWS", 1)  # and a decode per commit
    st = await World().start()
    seg = await st.create("t", 0)
    for i in range(3):
        await seg.append(batch(i * 10, 10), S1, 10 + i)
    rows = st.scan(seg.segid, S1)
    first = await rows.__anext__()  # the first batch read; then the partition moves
    assert first.batch.num_rows == 10
    st.release_local("t", 0)
    await seg.file.close()
    with pytest.raises(UnavailableError, match="no longer open here"):
        async for _ in rows:
            pass


async def test_a_new_leader_adopts_a_log_whose_empty_sealed_segment_it_has_no_copy_of():
    """A leader that adopted its own log sealed an active segment that never held a byte (an
    old one, rolled before a crash). No follower ever got a piece of it, so none has a copy;
    the adoption refused every follower ("has no copy here") and only the old leader could
    lead — which the elections, all logs being equal, did not choose (simulation seed 4332:
    a partition unled for a minute after healing). A segment without bytes needs no copy: its
    row goes, as an uncopied active one's does, and its owner keeps the file as a copy."""
    from rowstore.segments.position import ReplicaRecord, rep_key

    w = World()
    n1 = await w.start()
    empty = await n1.create("t", 0)
    rec = await n1.seal(empty.segid)
    assert (rec.state, rec.rows, rec.bytes) == (SegState.SEALED, 0, 0)
    n2 = SegmentStore(TerrascaleFS(w.cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), w.objects,
                                   config=FsConfig(node_id="n2")), SCHEMAS.__getitem__)
    await n2.fs.open()
    await n2.open()
    assert await n2.adopt("t", 0, 2, {}, {}, None, 0) == []
    assert [r for r in await n2.list(table="t") if r.partition == 0] == []
    e = await w.cat.get(rep_key("t", 0, "n1"))
    assert empty.segid in ReplicaRecord.from_bytes(e.value, e.key).segs  # the old owner's file, as a copy


class _Moving:
    """An active segment that stops being active during a read (sealed and offloaded under it)
    and then fails with ``error``."""

    def __init__(self, st, seg, error: Exception):
        self.st, self.seg, self.error = st, seg, error
        self.segid, self.where, self.durable_rows = seg.segid, seg.where, seg.durable_rows

    def _moved(self):
        self.st.active.pop(self.segid, None)
        raise self.error

    async def get_raw(self, loc):  # a point read (SegmentStore.row_bytes)
        self._moved()

    @property
    def file(self):  # many rows (segments/fetch.py): the file, closed or removed
        self._moved()


async def _offloaded_but_listed_active(error: Exception):
    w = World()
    st = await w.start()
    seg = await st.create("t", 0)
    ids = await seg.append(batch(0, 50), S1, 5)
    await st.seal(seg.segid)
    await st.offload(seg.segid, KEYS)
    st.active[seg.segid] = _Moving(st, seg, error)
    return st, ids


@pytest.mark.parametrize("read", ["row_bytes", "fetch"])
async def test_a_segment_sealed_under_a_read_is_read_from_its_object(read):
    from terrafs.errors import ClosedError

    st, ids = await _offloaded_but_listed_active(ClosedError("closed under the read"))
    if read == "row_bytes":
        raw, _ = await st.row_bytes(int(ids[7]))
        assert raw
    else:
        got = await fetch(st, ids[[3, 7]], SCHEMAS.__getitem__, S1)
        assert got.batch.column("id").to_pylist() == [3, 7]


@pytest.mark.parametrize("read", ["row_bytes", "fetch"])
async def test_a_failure_that_is_not_the_segment_moving_is_raised_not_read_around(read):
    """A bug in the active read (here a RuntimeError) is not taken for the segment being sealed
    meanwhile, even when it did move: the read fails instead of quietly reading elsewhere."""
    st, ids = await _offloaded_but_listed_active(RuntimeError("a bug in the active read"))
    with pytest.raises(RuntimeError, match="a bug"):
        if read == "row_bytes":
            await st.row_bytes(int(ids[7]))
        else:
            await fetch(st, ids[[3, 7]], SCHEMAS.__getitem__, S1)


async def test_a_scan_of_many_small_commits_decodes_them_together_and_equals_each_decoded():
    """An active segment's scan decodes runs of small commits in one call (a replay's cost):
    the rows, commit timestamps, deletions and schema versions equal each commit decoded on
    its own, across both schema versions and every chunk boundary."""
    import rowstore.segments.store_reads as store_reads
    from rowstore.codec.rows import decode_rows
    from tests.rowstore.segments.test_segments import S2

    st = await World().start()
    seg = await st.create("t", 0)
    rng = np.random.default_rng(3)
    for i in range(60):
        schema = S1 if i < 35 else S2
        n = int(rng.integers(1, 40))
        await seg.append(batch(i * 100, i * 100 + n, schema), schema, 10 + i, deleted=rng.random(n) < 0.2)
    want = [decode_rows(b.rows, b.starts, SCHEMAS.__getitem__, S2, seg.where) async for b in seg.batches()]
    for chunk in (1, 50, 8192):
        store_reads._SCAN_ROWS = chunk
        try:
            got = [d async for d in st.scan(seg.segid, S2)]
        finally:
            store_reads._SCAN_ROWS = 8192
        assert len(got) == (60 if chunk == 1 else 1 if chunk == 8192 else len(got)) and 1 <= len(got) <= 60
        for f in ("commit_ts", "deleted", "schema_ver"):
            assert np.concatenate([getattr(d, f) for d in got]).tolist() == \
                np.concatenate([getattr(d, f) for d in want]).tolist()
        assert pa.Table.from_batches([d.batch for d in got]).equals(pa.Table.from_batches([d.batch for d in want]))
