"""Deletes by predicate (docs/rfcs/0016-time-series-aggregates.md §6): every row that
matches the query's terms at T − 1 is deleted at one commit timestamp T, atomically across
partitions, as a cross-partition batch whose shares carry the terms instead of keys.

Each participant takes its partitions' writer locks at the reservation, as for any batch, so
nothing commits in them until the decision: the rows visible now are those visible at T − 1.
At the prepare it finds them partition by partition (``selection.selected_keys``, a piece of
at most ``PIECE_ROWS`` rows at a time) and appends each piece's deletions as a ``PIECE X``
record (docs/format/segment.md §2, log version 2), durable before the next is read. What it
keeps until the decision is each piece's encoded keys (for the key index at the commit) —
the rows themselves are never held beyond a piece — and, only while a subscription watches
the table, each piece's encoded deletions for its pump."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rowstore.codec.rows import Encoded, encode_rows
from rowstore.db.changes import CommitTail
from rowstore.db.partition import Partition
from rowstore.db.read.context import ReadContext
from rowstore.db.read.reader import Reader
from rowstore.db.read.selection import selected_keys
from rowstore.db.read.subscribe import parse_filter, prefix_partition
from rowstore.db.registry import Table
from rowstore.db.write.committer import tombstone_batch
from rowstore.db.write.two_phase import txn_key
from rowstore.errors import QueryError, UnavailableError
from rowstore.reads.predicates import BBox, Term
from rowstore.reads.retention import kept_terms
from rowstore.schema import SchemaVersion
from rowstore.segments.active import ActiveSegment
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import check_prefix
from rowstore.tables.keys import KeyRange, key_range

ENCODE_IN_THREAD = 4096  # deletions of a piece encoded in a worker thread beyond this


@dataclass(frozen=True)
class Selection:
    """A delete's terms, parsed as a query's (``prefix``: equality terms on the leading key
    columns, as a scan's); at least one term or a bounding box."""

    terms: list[Term]
    box: BBox | None
    prefix: object

    @classmethod
    def parse(cls, schema: SchemaVersion, where: object, bbox: object, prefix: object) -> Selection:
        if where is None and bbox is None and prefix is None:
            raise QueryError("a delete takes keys, or where, bbox or prefix (at least one)")
        f = parse_filter(schema, where, bbox, prefix, None)
        if not f.terms and f.box is None:
            raise QueryError("a delete by predicate needs at least one term (an empty where would delete every row)")
        return cls(f.terms, f.box, prefix)

    def key_range(self, schema: SchemaVersion) -> KeyRange[int] | KeyRange[bytes] | None:
        """The encoded keys a ``prefix`` covers (None without one): the only keys read."""
        if self.prefix is None:
            return None
        return key_range(schema.pk, check_prefix(self.prefix, schema.pk, "prefix", text=True))

    def partitions(self, schema: SchemaVersion, nparts: int, owned: set[int]) -> list[int]:
        """The partitions it can match among ``owned`` (a prefix covering the partition key: one)."""
        pick = prefix_partition(schema, self.prefix, nparts)
        return sorted(owned) if pick is None else [pick]


@dataclass
class Found:
    """One partition's share, as prepared: each piece's encoded keys, and its encoded
    deletions while a subscription watches the table."""

    keys: list[np.ndarray] = field(default_factory=list)
    encs: list[Encoded] = field(default_factory=list)


async def prepare_found(reader: Reader, tail: CommitTail, d: TableDef, table: Table, sel: Selection,
                        parts: list[Partition], segs: list[ActiveSegment], found: list[Found], ts: int, txn: int,
                        got: list[np.ndarray | BaseException], aborted: Callable[[], bool]) -> int:
    """Find and append every partition's deletions at ``ts`` as ``PIECE txn`` records (the
    writer locks held); ``got[i]``: the rowids of partition i's first piece. Returns the rows."""
    schema = d.schema
    assert schema is not None  # describe() refuses a dropped table
    T = ts - 1
    c = ReadContext(T, d, table, await reader.tables.schemas_of(d), tuple(kept_terms(d, T)))
    terms = sel.terms + list(c.kept)  # a row the retention hides is not there to delete
    watching = tail.watching(d.table_id)
    n, rng = 0, sel.key_range(schema)
    for i, (part, seg) in enumerate(zip(parts, segs)):
        await _leased(reader, d, part, ts)
        async for kb, keys in selected_keys(reader, c, part, terms, sel.box, rng=rng):
            if aborted():
                raise UnavailableError(f"transaction {txn_key(txn)} was aborted here while it was being prepared; "
                                       "retry")
            dead = tombstone_batch(schema, kb.columns)
            args = (dead, schema, ts, np.ones(dead.num_rows, bool))
            enc = await asyncio.to_thread(encode_rows, *args) if dead.num_rows > ENCODE_IN_THREAD \
                else encode_rows(*args)
            ids = await (await part.append(seg, enc, ts, txn, piece=True))
            if not found[i].keys:
                got[i] = ids
            found[i].keys.append(keys)
            if watching:
                found[i].encs.append(enc)
            n += len(keys)
        await _leased(reader, d, part, ts)
    return n


async def _leased(reader: Reader, d: TableDef, part: Partition, ts: int) -> None:
    """This node still leads ``part`` (the very object the reservation locked) with a lease, as a
    read of the present needs it, before and after the partition's rows are found: a deposed
    leader (the log fences its appends, but a partition where it finds nothing appends nothing)
    refuses rather than miss what its successor committed. And a majority of the replicas took
    this leader's clock up to ``ts``, so that no later leader commits below the delete in a
    partition it left unwritten."""
    if part.retired:  # demoted since the reservation (and perhaps led here again, by a new object)
        raise UnavailableError(f"partition {part.pid} is no longer led by this node; retry")
    wait = reader.leases_of(d.table_id, [part.pid], ts)
    if wait is not None:
        await wait
