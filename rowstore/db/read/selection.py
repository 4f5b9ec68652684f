"""The keys a predicate selects in one partition, piece by piece (a delete by predicate,
docs/rfcs/0016-time-series-aggregates.md §6): every key whose version visible at T matches
the terms and the bounding box. The rows are fetched ``piece`` rowids at a time — only the key
and the terms' columns — so what is held at once is one piece's rows, beside the rowids the
partition's index gives (8 bytes a candidate, as a query's plan holds)."""
from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pyarrow as pa

from rowstore.db.partition import Partition
from rowstore.db.read.context import ReadContext, where_of
from rowstore.db.read.reader import Reader, candidates, narrowed
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.segments.fetch import fetch
from rowstore.tables.keys import encode_columns, key_arrays

PIECE_ROWS = 65_536  # candidates fetched at a time (and keys per piece of a delete at most)


async def selected_keys(reader: Reader, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None,
                        piece: int | None = None) -> AsyncIterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The key columns of ``part``'s rows visible at ``c.T`` that match, with their encoded
    keys, in pieces of at most ``piece`` rows (none empty). The caller holds the partition's
    writer lock or reads a closed T: either way nothing commits at or below T meanwhile."""
    schema = c.d.schema
    assert schema is not None  # describe() refuses a dropped table
    piece = piece or PIECE_ROWS
    target = narrowed(schema, [], terms, box)
    cands, srcs = candidates(part, terms + ([box] if box is not None else []))
    if cands is None:  # no index applies: every visible rowid (each the newest version of its key)
        ids = (await part.index.scan(c.T)).rowids
        srcs = None
    else:
        ids = cands
    keep = await reader.zone_mask(c, ids, terms, box)
    if keep is not None:
        ids = ids[keep]
        srcs = srcs[keep] if srcs is not None else None
    if srcs is None:
        ids = np.sort(ids)  # fetch answers in rowid order: pieces of nearby rows
    for at in range(0, len(ids), piece):
        chunk = ids[at : at + piece]
        rows = await fetch(reader.store, chunk, c.schemas, target, where_of(c, part))  # rowid order, as chunk
        keys = encode_columns(schema.pk, key_arrays(schema.pk, rows.batch))
        match = batch_mask(rows.batch, terms, box)
        if srcs is not None:  # candidates of the column index: older versions among them
            match &= (rows.commit_ts <= np.uint64(c.T)) & ~rows.deleted
            idx = np.flatnonzero(match)
            match[idx] = ~await part.index.superseded(keys[idx], rows.commit_ts[idx], srcs[at : at + piece][idx], c.T)
        idx = np.flatnonzero(match)
        if len(idx):
            got = rows.batch.select(schema.pk.names).take(pa.array(idx))
            yield got, keys[idx]
