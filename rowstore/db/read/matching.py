"""Which committed changes a subscription's filter selects (docs/rfcs/0015-subscriptions.md
§3): a change whose new or old version matches. Changes come in rounds — a pump's batches
taken at one closed timestamp, or a catch-up's interval read from the segments — every
change of a round above its lower bound ``base``; a change's old version is the same key's
previous change in the round, or else the version visible at ``base`` (the key index, one
vectorized lookup per partition, then the rows by rowid)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from rowstore.codec.rows import decode_rows
from rowstore.db.partition import Partition
from rowstore.db.changes import Committed
from rowstore.reads.predicates import BBox, Term, batch_mask
from rowstore.schema import SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegmentStore
from rowstore.tables.keys import encode_columns, key_arrays


@dataclass(frozen=True)
class Filter:
    """A subscription's filter, parsed against its table's schema; ``columns``: the columns its
    upserts carry (the key columns always among them)."""

    terms: list[Term]
    box: BBox | None
    columns: list[str]

    @property
    def narrows(self) -> bool:
        return bool(self.terms) or self.box is not None

    def mask(self, batch: pa.RecordBatch) -> np.ndarray:
        return batch_mask(batch, self.terms, self.box)


@dataclass
class Round:
    """Decoded changes in commit order, shared by every subscriber they go to: the rows (the
    table's columns; a delete's are its key and fillers), each one's commit timestamp and
    deletion flag. ``memo``: what consumers derive from the round once (JSON rows)."""

    batch: pa.RecordBatch
    ts: np.ndarray  # uint64
    deleted: np.ndarray  # bool
    memo: dict[Any, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.batch.num_rows)


def decode_round(got: Sequence[Committed], schemas: Callable[[int], SchemaVersion],
                 target: SchemaVersion) -> tuple[Round, np.ndarray]:
    """A pump's batches (each a partition's encoded rows) as one round in commit order, and
    each row's partition. One decode for all of them: the rows' bytes are joined once."""
    bufs: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    pids: list[np.ndarray] = []
    at = 0
    for c in got:
        size = 0
        for b in c.rows.bufs:
            bufs.append(b)
            size += int(b.shape[0])
        starts.append(np.asarray(c.rows.starts, np.int64) + at)
        pids.append(np.full(len(c.rows.starts), c.pid, np.int32))
        at += size
    buf = np.concatenate(bufs) if len(bufs) > 1 else bufs[0]
    dec = decode_rows(buf, np.concatenate(starts), schemas, target, "a committed batch")
    pid = np.concatenate(pids)
    order = np.argsort(dec.commit_ts, kind="stable")
    if (order != np.arange(len(order))).any():  # not yet in commit order: a group applied after a later batch
        idx = pa.array(order)
        return Round(dec.batch.take(idx), dec.commit_ts[order], dec.deleted[order]), pid[order]
    return Round(dec.batch, dec.commit_ts, dec.deleted), pid


def previous_in_round(keys: np.ndarray) -> np.ndarray:
    """For each row (in commit order) the row of the same key before it, or -1."""
    n = len(keys)
    prev = np.full(n, -1, np.int64)
    if n < 2:
        return prev
    _, inv = np.unique(keys, return_inverse=True)
    order = np.lexsort((np.arange(n), inv.reshape(-1)))
    same = inv.reshape(-1)[order[1:]] == inv.reshape(-1)[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


async def select(r: Round, pids: np.ndarray, filters: Sequence[Filter], schema: SchemaVersion,
                 parts: Sequence[Partition], store: SegmentStore, schemas: Callable[[int], SchemaVersion],
                 base: int) -> list[np.ndarray]:
    """Per filter, the rows of ``r`` it selects (positions in commit order): every row for a
    filter that narrows nothing; else the rows whose new version matches (never a delete's)
    or whose old version did. ``parts``: the table's partitions by pid (their key indexes
    answer the versions visible at ``base``)."""
    if not any(f.narrows for f in filters):
        return [np.arange(r.rows) for _ in filters]
    new = [f.mask(r.batch) & ~r.deleted if f.narrows else None for f in filters]
    unsure = np.zeros(r.rows, bool)  # rows some narrowing filter does not take by their new version
    for m in new:
        if m is not None:
            unsure |= ~m
    pk = schema.pk
    keys = encode_columns(pk, key_arrays(pk, r.batch))
    prev = previous_in_round(keys)
    old: list[np.ndarray] = [np.zeros(r.rows, bool) for _ in filters]
    inside = np.flatnonzero(unsure & (prev >= 0))
    for f_old, m in zip(old, new):
        if m is not None:
            f_old[inside] = m[prev[inside]]
    first = np.flatnonzero(unsure & (prev < 0))
    if len(first):
        at, before = await _versions_at(first, pids, keys, parts, store, schemas, schema, base)
        for f_old, f in zip(old, filters):
            if f.narrows and before.num_rows:
                f_old[at] = f.mask(before)
    return [np.arange(r.rows) if m is None else np.flatnonzero(m | o) for m, o in zip(new, old)]


async def _versions_at(rows: np.ndarray, pids: np.ndarray, keys: np.ndarray, parts: Sequence[Partition],
                       store: SegmentStore, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
                       T: int) -> tuple[np.ndarray, pa.RecordBatch]:
    """The versions of ``rows``' keys visible at T: (the rows that had one, those versions in
    the same order)."""
    rowids = np.zeros(len(rows), np.uint64)
    for pid in np.unique(pids[rows]).tolist():
        sel = pids[rows] == pid
        rowids[sel] = await parts[pid].index.get_many(keys[rows[sel]], T)
    had = rowids != 0
    if not had.any():
        return rows[:0], pa.RecordBatch.from_pylist([], schema=target.arrow())
    ids = rowids[had]
    dec = await fetch(store, ids, schemas, target, "the versions before a subscription's changes")
    # fetch answers in rowid order: put each version back at its row
    order = np.argsort(ids, kind="stable")
    back = np.empty(len(ids), np.int64)
    back[order] = np.arange(len(ids))
    return rows[had], dec.batch.take(pa.array(back))
