"""Segment invariants: a clean segment passes; inconsistent footers and indexes are named."""
import struct

import pytest

from rowstore.errors import RowCorruptionError
from rowstore.segments.fsck import check_segments, check_sealed_segment
from rowstore.segments.sealed import FOOTER, FOOTER_LEN, SealedSegment, sealed_bytes
from tests.rowstore.segments.test_store import World
from tests.rowstore.segments.test_segments import KEYS, S1, SCHEMAS, batch
from crc32c import crc32c


async def _segment_bytes(st, n=2500):
    seg = await st.create("t", 0)
    for lo in range(0, n, 500):
        await seg.append(batch(lo, lo + 500), S1, 10 + lo)
    await st.seal(seg.segid)
    return seg, b"".join([c async for c in sealed_bytes(seg.segid, seg.batches(), SCHEMAS.__getitem__, KEYS)])


def _refoot(raw: bytes, **change) -> bytes:
    f = list(FOOTER.unpack(raw[-FOOTER_LEN:]))
    idx = {"rows": 4, "min_ts": 9, "versions0": 12}
    for k, v in change.items():
        f[idx[k]] = v
    body = FOOTER.pack(*f)
    return raw[:-FOOTER_LEN] + body[:-4] + struct.pack("<I", crc32c(body[:-4]))


async def _open(st, raw):
    async def gen():
        yield raw

    rec = await st.fs.create_sealed(gen())
    return await SealedSegment.open(await st.fs.open_sealed(rec.inode))


async def test_clean_segments_pass():
    w = World()
    st = await w.start()
    seg, raw = await _segment_bytes(st)
    await check_sealed_segment(await _open(st, raw))
    await st.offload(seg.segid, KEYS)
    await st.create("t", 1)  # an active one too
    assert await check_segments(st.fs) == []


@pytest.mark.parametrize("change,msg", [
    ({"rows": 2499}, "index holds 2500 rows"),
    ({"min_ts": 100}, "outside the footer's range"),
    ({"versions0": 7}, "schema version"),
])
async def test_inconsistent_footer_is_named(change, msg):
    w = World()
    st = await w.start()
    _, raw = await _segment_bytes(st)
    seg = await _open(st, _refoot(raw, **change))
    with pytest.raises(RowCorruptionError, match=msg):
        await check_sealed_segment(seg)


async def test_index_crc_is_checked():
    """A child's first localid in the root (a byte only point reads follow) changed in an
    otherwise consistent object: only index_crc can tell, and fsck names it."""
    from rowstore.segments.sealed import LEAF_CAP, Footer

    w = World()
    st = await w.start()
    _, raw = await _segment_bytes(st, n=LEAF_CAP + 100)
    f = Footer.unpack(raw[-FOOTER_LEN:], "t", 0)
    assert f.height == 2
    bad = bytearray(raw)
    at = f.root_off + 4 + 8  # second child's first localid
    assert int.from_bytes(bad[at : at + 4], "little") == LEAF_CAP
    bad[at : at + 4] = (LEAF_CAP + 5).to_bytes(4, "little")
    with pytest.raises(RowCorruptionError, match="index_crc"):
        await check_sealed_segment(await _open(st, bytes(bad)))


@pytest.mark.parametrize("columnar", [False, True], ids=["row-wise", "columnar"])
async def test_a_damaged_offloaded_segment_is_a_problem_named_not_a_crash(columnar):
    """A flipped byte in an offloaded object: a problem naming the object (the columnar
    reader's page error, a RowCorruptionError, ended `terrascale fsck` as an error instead —
    test_fsck_raft's damaged object, once columnar became the default)."""
    w = World()
    st = await w.start()
    st.columnar = columnar
    seg, _ = await _segment_bytes(st)
    rec = await st.offload(seg.segid, KEYS)
    (key, raw), = w.objects._objs.items()
    bad = bytearray(raw)
    bad[len(bad) // 3] ^= 0x01
    w.objects._objs[key] = bytes(bad)
    fresh = await w.start()  # nothing of the object in its caches
    problems = await check_segments(fresh.fs)
    assert len(problems) == 1 and f"segment {rec.segid}" in problems[0].reason, problems
    assert key in problems[0].where
