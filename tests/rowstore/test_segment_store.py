"""The segment table: create/append/seal/offload/get with one transaction per switch, crashes."""
import asyncio

import numpy as np
import pytest

from catalog.memory import MemoryCatalog
from rowstore.active_segment import split_rowids
from rowstore.segments import SegState, SegmentStore
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.failpoints import FailPointCrash, armed
from terrafs.fs import FsConfig, TerrascaleFS
from tests.rowstore.test_segments import KEYS, S1, SCHEMAS, batch


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
