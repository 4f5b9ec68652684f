"""The keys a predicate selects in one partition, piece by piece (a delete by predicate,
docs/rfcs/0016-time-series-aggregates.md §6): every key whose version visible at T matches
the terms and the bounding box. The rows are fetched ``piece`` rowids at a time — only the key
and the terms' columns — so what is held at once is one piece's rows: without a usable column
index the key index is read in rounds of about ``piece`` entries; with one, beside its
candidates' rowids (8 bytes each, as a query's plan holds)."""
from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pyarrow as pa

from rowstore.db.partition import Partition
from rowstore.db.read.context import ReadContext, where_of
from rowstore.db.read.reader import Reader, candidates, narrowed
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.schema import SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.tables.keys import KeyRange, encode_columns, key_arrays

PIECE_ROWS = 65_536  # candidates fetched at a time (and keys per piece of a delete at most)


async def selected_keys(reader: Reader, c: ReadContext, part: Partition, terms: list[Term], box: BBox | None,
                        piece: int | None = None, rng: KeyRange[int] | KeyRange[bytes] | None = None
                        ) -> AsyncIterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The key columns of ``part``'s rows visible at ``c.T`` that match, with their encoded
    keys, in pieces of about ``piece`` rows (none empty). ``rng``: the keys a prefix covers —
    only those are read, through the key index (the terms hold no key outside it). The caller
    holds the partition's writer lock or reads a closed T: either way nothing commits at or
    below T meanwhile."""
    schema = c.d.schema
    assert schema is not None  # describe() refuses a dropped table
    piece = piece or PIECE_ROWS
    target = narrowed(schema, [], terms, box)
    preds = terms + ([box] if box is not None else [])
    cands, srcs = (None, None) if rng is not None else await candidates(part, preds)
    if cands is None:  # no index applies (or a prefix's range): the key index's visible entries, a round at a time
        async for ids in _visible_rounds(part, c.T, 4 * piece, rng):  # fewer, bigger rounds: 24 B an entry
            keep = await reader.zone_mask(c, ids, terms, box)
            got = await _matching(reader, c, part, ids if keep is None else ids[keep], None, terms, box, target)
            if got is not None:
                yield got
        return
    assert srcs is not None  # set with cands
    keep = await reader.zone_mask(c, cands, terms, box)
    if keep is not None:
        cands, srcs = cands[keep], srcs[keep]
    for at in range(0, len(cands), piece):
        got = await _matching(reader, c, part, cands[at : at + piece], srcs[at : at + piece], terms, box, target)
        if got is not None:
            yield got


async def _visible_rounds(part: Partition, T: int, entries: int,
                          rng: KeyRange[int] | KeyRange[bytes] | None = None) -> AsyncIterator[np.ndarray]:
    """The rowids visible at T in ``rng`` (None: every key; each its key's newest version), in
    rounds of about ``entries`` entries of each index source (``scan_chunk``): memory bounded by
    a round, not the partition."""
    rest: KeyRange[int] | KeyRange[bytes] | None = KeyRange() if rng is None else rng
    while rest is not None:
        vis, nxt = await part.index.scan_chunk(rest, T, entries)
        if nxt is not None and not len(vis) and (nxt.lo, nxt.lo_inc) == (rest.lo, rest.lo_inc):
            entries *= 4  # one key's versions fill a round: read further
            continue
        rest = nxt
        if len(vis):
            yield vis.rowids


async def _matching(reader: Reader, c: ReadContext, part: Partition, ids: np.ndarray, srcs: np.ndarray | None,
                    terms: list[Term], box: BBox | None, target: SchemaVersion
                    ) -> tuple[pa.RecordBatch, np.ndarray] | None:
    """Of rowids ``ids`` (sorted when ``srcs``, the column index's candidates with their source
    runs; else visible versions in any order), the key columns and encoded keys of the rows
    visible at T that match; None if none does."""
    schema = c.d.schema
    assert schema is not None  # describe() refuses a dropped table
    if len(ids) == 0:
        return None
    if srcs is None:
        ids = np.sort(ids)  # fetch answers in rowid order
    rows = await fetch(reader.store, ids, c.schemas, target, where_of(c, part))
    keys = encode_columns(schema.pk, key_arrays(schema.pk, rows.batch))
    match = np.asarray(batch_mask(rows.batch, terms, box), bool)
    if srcs is not None:  # candidates of the column index: older versions among them
        match &= (rows.commit_ts <= np.uint64(c.T)) & ~rows.deleted
        idx = np.flatnonzero(match)
        match[idx] = ~await part.index.superseded(keys[idx], rows.commit_ts[idx], srcs[idx], c.T)
    idx = np.flatnonzero(match)
    if not len(idx):
        return None
    return rows.batch.select(schema.pk.names).take(pa.array(idx)), keys[idx]
