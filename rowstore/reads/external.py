"""Reading sealed segments without a node: what external readers (the Spark bridge's
executors) need, straight from object storage (docs/rfcs/0006-external-reads.md).

A node plans a read (``Database.read_plan``, a :class:`rowstore.reads.plan.ReadPlan`): for
each offloaded segment of the table, its object and a roaring bitmap of the localids visible
at the read's timestamp. This module turns one such entry into Arrow record batches: open the sealed object (footer,
block map; blocks checksummed, decrypted with the node's key if the data is encrypted),
scan its rows sequentially, keep the visible ones, apply the exact predicates.
"""
from __future__ import annotations

from typing import AsyncIterator, Callable, Sequence

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from rowstore.reads.plan import SegmentSlice
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.schema import SchemaVersion
from rowstore.segments.sealed import SealedSegment
from terrafs.cache import BlockCache
from terrafs.abc import ObjectStore
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
        seg = await SealedSegment.open(sf)
        want = np.zeros(seg.footer.rows, bool)
        vis = np.frombuffer(BitMap.deserialize(part.visible).to_array(), np.uint32)
        want[vis[vis < len(want)]] = True
        base = 0
        async for d in seg.scan(schemas, target):
            n = d.batch.num_rows
            m = want[base : base + n] & ~d.deleted
            base += n
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
