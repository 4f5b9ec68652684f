"""Reading sealed segments without a node: what external readers (the Spark bridge's
executors) need, straight from object storage (docs/rfcs/0006-external-reads.md).

A node plans a read (``Database.read_plan``): for each offloaded segment of the table,
its object and a roaring bitmap of the localids visible at the read's timestamp. This
module turns one such entry into Arrow record batches: open the sealed object (footer,
block map; blocks checksummed, decrypted with the node's key if the data is encrypted),
scan its rows sequentially, keep the visible ones, apply the exact predicates.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import AsyncIterator

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.schema import SchemaVersion
from rowstore.segments.sealed import SealedSegment
from terrafs.cache import BlockCache
from terrafs.crypto import KeyEncryptionKey
from terrafs.sealed import SealedFile
from terrafs.uri import open_object_store


@dataclass(frozen=True)
class SegmentSlice:
    """One offloaded segment of a read plan."""

    segid: int
    key: str  # object key
    object_size: int
    rows: int
    visible: bytes  # portable roaring bitmap of visible localids

    def to_json(self) -> dict:
        return {"segid": self.segid, "key": self.key, "object_size": self.object_size, "rows": self.rows,
                "visible": base64.b64encode(self.visible).decode()}

    @classmethod
    def from_json(cls, d: dict) -> "SegmentSlice":
        return cls(d["segid"], d["key"], d["object_size"], d["rows"], base64.b64decode(d["visible"]))


def visible_bitmap(localids: np.ndarray) -> bytes:
    return BitMap(np.asarray(localids, np.uint32)).serialize()


def schemas_lookup(versions: list[SchemaVersion]):
    by = {v.version: v for v in versions}
    return by.__getitem__


async def read_segment(objects_uri: str, part: SegmentSlice, schemas, target: SchemaVersion,
                       terms: list[Term] = (), bbox: BBox | None = None, kek: KeyEncryptionKey | None = None,
                       store=None) -> AsyncIterator[pa.RecordBatch]:
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
