"""Reading sealed segments without a node: what external readers (the Spark bridge's
executors) need, straight from object storage (docs/rfcs/0006-external-reads.md).

A node plans a read (``Database.read_plan``, a :class:`rowstore.reads.plan.ReadPlan`): for
each offloaded segment of the table, its object and a roaring bitmap of the localids visible
at the read's timestamp. This module turns one such entry into Arrow record batches: open
the sealed object (footer, block map; blocks checksummed, decrypted with the node's key if
the data is encrypted), scan its rows sequentially, keep the visible ones, apply the exact
predicates. A columnar segment (docs/format/segment.md §7) is read only in ``target``'s
columns, and groups of rows whose statistics the predicates miss are not read.
"""
from __future__ import annotations

from typing import AsyncIterator, Callable, Sequence

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from rowstore.codec.rows import Decoded
from rowstore.reads.plan import SegmentSlice
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.reads.zones import group_mask
from rowstore.schema import SchemaVersion
from rowstore.segments.columnar import ColumnarSegment, open_segment
from terrafs.abc import ObjectStore
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.sealed import SealedFile
from terrafs.uri import open_object_store


def schemas_lookup(versions: list[SchemaVersion]) -> Callable[[int], SchemaVersion]:
    by = {v.version: v for v in versions}
    return by.__getitem__


async def read_segment(objects_uri: str, part: SegmentSlice, schemas: Callable[[int], SchemaVersion],
                       target: SchemaVersion, terms: Sequence[Term] = (), bbox: BBox | None = None,
                       kek: KeyEncryptionKey | None = None,
                       store: ObjectStore | None = None) -> AsyncIterator[pa.RecordBatch]:
    """The visible rows of one offloaded segment matching the predicates, in localid order."""
    own = store is None
    store = store or open_object_store(objects_uri)
    if own:
        await store.open_store()
    try:
        sf = await SealedFile.open(store, part.key, object_size=part.object_size, kek=kek, cache=BlockCache(8 << 20))
        seg = await open_segment(sf)
        want = np.zeros(seg.footer.rows, bool)
        vis = np.frombuffer(BitMap.deserialize(part.visible).to_array(), np.uint32)
        want[vis[vis < len(want)]] = True
        if isinstance(seg, ColumnarSegment):
            scan = _columnar_rows(seg, want, target, terms, bbox)
        else:
            scan = _all_rows(seg.scan(schemas, target))
        async for base, d in scan:
            n = d.batch.num_rows
            m = want[base : base + n] & ~d.deleted
            if not m.any():
                continue
            b = d.batch.filter(pa.array(m))
            if terms or bbox is not None:
                b = b.filter(pa.array(batch_mask(b, list(terms), bbox)))
            if b.num_rows:
                yield b
    finally:
        if own:
            await store.close()


async def _all_rows(scan: AsyncIterator[Decoded]) -> AsyncIterator[tuple[int, Decoded]]:
    base = 0
    async for d in scan:
        yield base, d
        base += d.batch.num_rows


async def _columnar_rows(seg: ColumnarSegment, want: np.ndarray, target: SchemaVersion, terms: Sequence[Term],
                         bbox: BBox | None) -> AsyncIterator[tuple[int, Decoded]]:
    """The groups holding visible rows that the predicates may match: (first localid, rows)."""
    g = seg.meta.group_rows
    keep = np.array([want[i * g : (i + 1) * g].any() for i in range(seg.groups)], bool)
    keep &= group_mask(seg, list(terms), bbox)
    async for i, d in seg.scan_groups(target, keep):
        yield i * g, d
