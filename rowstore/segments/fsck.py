"""Segment invariants for `terrascale fsck` (docs/format/segment.md §4), read-only.

Offloaded segments of version 2 (columnar): ``ColumnarSegment.verify``. Version 1:
footer, every index page (localids dense, counts sum to
the row count, offsets increasing inside the row section, ``index_crc``, the
leaf level packed where scans read it), every row header
(lengths chain exactly through the row section, schema version listed in the
footer, commit timestamp inside the footer's range). Local segments: the
write-ahead framing parses and every committed batch's rows add up.
"""
from __future__ import annotations

import numpy as np

from rowstore.codec.rows import row_versions
from rowstore.errors import RowCorruptionError
from rowstore.segments.columnar import ColumnarSegment, SealedReader, open_segment
from rowstore.segments.sealed import SealedSegment, walk_rows
from rowstore.segments.store import SEG_PREFIX, SegmentRecord, SegState
from rowstore.segments.wal import WalReader
from terrafs.active import ActiveFile
from terrafs.errors import FileCorruptionError, TerrafsError
from terrafs.fs import TerrascaleFS
from terrafs.fsck import Problem


async def check_segments(fs: TerrascaleFS) -> list[Problem]:
    out = []
    for e in await fs.catalog.scan(SEG_PREFIX):
        rec = SegmentRecord.from_bytes(e.value)
        try:
            if rec.state == SegState.OFFLOADED or (rec.state == SegState.RETIRED and rec.location):
                await check_sealed_segment(await open_segment(await fs.open_sealed(rec.inode)), rec)
            elif rec.state in (SegState.ACTIVE, SegState.SEALED):
                frec = await fs.stat(rec.inode)
                if frec.owner == fs.cfg.node_id:
                    af = await ActiveFile.recover(fs.block, frec.location, fs.kek, read_only=True)
                    try:
                        await check_wal(af)
                    finally:
                        await af.close()
        except (FileCorruptionError, RowCorruptionError) as err:  # a block, or a row or page invariant
            out.append(Problem(err.where, err.offset, f"segment {rec.segid}: {err.reason}"))
        except TerrafsError as err:
            out.append(Problem(f"segment {rec.segid}", None, f"segment {rec.segid}: {err}"))
    return out


async def check_wal(af: ActiveFile) -> None:
    reader = WalReader(af.where)
    async for _, data in af.scan():
        reader.feed(data)
    reader.finish()


async def check_sealed_segment(seg: SealedReader, rec: SegmentRecord | None = None) -> None:
    f, where = seg.footer, seg.where
    if rec is not None and f.segid != rec.segid:
        raise RowCorruptionError(where, None, f"footer names segment {f.segid}")
    if rec is not None and rec.cluster and (f.cluster is None or list(f.cluster) != list(rec.cluster)):
        raise RowCorruptionError(where, None, f"footer cluster range {f.cluster} is not the catalog's {rec.cluster}")
    if isinstance(seg, ColumnarSegment):
        await seg.verify()
        return
    f = seg.footer
    offsets = await _leaf_offsets(seg)
    if len(offsets) != f.rows:
        raise RowCorruptionError(where, f.root_off, f"index holds {len(offsets)} rows; footer says {f.rows}")
    if len(offsets) and (offsets[0] != 0 or np.any(np.diff(offsets) <= 0) or offsets[-1] >= f.rows_len):
        raise RowCorruptionError(where, f.root_off, "row offsets are not increasing inside the row section")
    # index_crc, and the leaf level where scans read it (packed from rows_len), agree with the tree
    if not np.array_equal(await seg.row_offsets(), offsets):
        raise RowCorruptionError(where, f.root_off, "the leaf level and the tree disagree")
    rows = np.frombuffer(await seg.sf.read_sequential(0, f.rows_len), np.uint8)
    starts, end = walk_rows(rows, rows.shape[0])
    if end != f.rows_len or not np.array_equal(starts, offsets):
        raise RowCorruptionError(where, int(end if end >= 0 else -end - 1), "row lengths do not chain to the index")
    if len(starts):
        vers = row_versions(rows, starts)
        ts = rows[starts[:, None] + np.arange(8, 16)].view("<u8").ravel()
        if not np.isin(vers, np.array(f.versions, np.uint32)).all():
            raise RowCorruptionError(where, None, "a row names a schema version the footer does not list")
        if ts.min() < f.min_ts or ts.max() > f.max_ts:
            raise RowCorruptionError(where, None, "a commit timestamp lies outside the footer's range")


async def _leaf_offsets(seg: SealedSegment) -> np.ndarray:
    """Walk the whole tree breadth-first; check first localids are dense; return all offsets."""
    level = [seg.footer.root_off]
    for _ in range(seg.footer.height - 1):
        nxt = []
        for off in level:
            node = await seg.page(off, leaf=False)
            nxt += node[2::2]
        level = nxt
    parts, expect = [], 0
    for off in level:
        leaf = await seg.page(off, leaf=True)
        if leaf[0] != expect:
            raise RowCorruptionError(seg.where, off, f"leaf starts at localid {leaf[0]}, expected {expect}")
        parts.append(np.array(leaf[2:], np.int64))
        expect += leaf[1]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)
