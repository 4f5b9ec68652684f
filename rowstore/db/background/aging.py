"""Retention's space (docs/rfcs/0016-time-series-aggregates.md §5): which versions the garbage
collector's mark pass counts dead because no read at or after the horizon H can see them.

``floor`` is the lowest cutoff any read at or after H applies: the minimum over the table's
definitions valid in ``[H, now]`` of ``wall(max(H, v.ts)) − keep``; none when one of them has
no retention (or they age by different columns). A version committed at or below H whose
column is below ``floor`` is hidden from every such read. Its index entry is dropped from the
relocation's view, so the mark pass finds it dead, the copy-forward never copies it, and a
segment left with nothing live is retired without being read. A version above H is never
dropped: a read between H and it still sees the version it supersedes.

Which rows are below the floor is told by zone maps where they exist (a columnar segment's
per-group bounds), else by reading the column of the candidates — once per segment for its
range, which is remembered (an offloaded segment's rows never change), and again only for a
segment whose range straddles the floor."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from rowstore.hlc import ms_of
from rowstore.index.key_memtable import Run
from rowstore.reads.predicates import Term, numeric_values
from rowstore.reads.retention import DAY_US
from rowstore.reads.zones import group_keep
from rowstore.rowids import TOMBSTONE
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.fetch import fetch
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableDef
from rowstore.types import Kind


@dataclass(frozen=True)
class Floor:
    """Versions at or below ``H`` whose ``column`` is below ``value`` (the column's domain: µs,
    or days for a date) are dead."""

    column: Column
    value: int


def floor_of(history: list[TableDef], d: TableDef, H: int) -> Floor | None:
    """The floor of table ``d`` at horizon ``H`` from its name's definition ``history``."""
    mine = [v for v in history if v.table_id == d.table_id]
    at_h = [v for v in mine if v.ts <= H]
    valid = at_h[-1:] + [v for v in mine if v.ts > H]
    if not valid or any(v.retention is None for v in valid):
        return None
    if len({v.retention.column for v in valid if v.retention}) != 1 or d.schema is None:
        return None
    col = d.schema.by_id(valid[0].retention.column) if valid[0].retention else None
    if col is None:
        return None
    cut = min(ms_of(max(H, v.ts)) * 1000 - v.retention.keep_us for v in valid if v.retention)
    return Floor(col, cut // DAY_US if col.type.kind == Kind.DATE else cut)


@dataclass
class Aging:
    """The mark pass's retention step, with what it learned of segments' ranges."""

    store: SegmentStore
    # (table id, partition) -> (segid, column id) -> min, max: pruned per partition, to its own segments
    ranges: dict[tuple[str, int], dict[tuple[int, int], tuple[int, int]]] = field(default_factory=dict)

    async def without_aged(self, part: tuple[str, int], merged: Run, floor: Floor, H: int, counted: set[int],
                           schema: SchemaVersion,
                           schemas: Callable[[int], SchemaVersion]) -> tuple[Run, dict[int, int]]:
        """``merged`` (partition ``part``'s) without the entries of versions the floor hides, and
        how many were dropped per segment. Only offloaded segments (``counted``) are looked at."""
        ids = merged.rowids
        segs = (ids >> np.uint64(32)).astype(np.uint32)
        cand = (merged.ts <= np.uint64(H)) & (ids != TOMBSTONE) & np.isin(segs, np.fromiter(counted, np.uint32))
        at = np.flatnonzero(cand)
        if not len(at):
            return merged, {}
        aged = np.zeros(len(at), bool)
        unknown = np.ones(len(at), bool)
        cols = await self.store.columnar_segments(np.unique(segs[at]).tolist())
        if cols:
            newer = group_keep(ids[at], cols, [Term(floor.column, ">=", floor.value)], None)
            older = group_keep(ids[at], cols, [Term(floor.column, "<", floor.value)], None)
            if newer is not None:
                aged |= ~newer  # every row of its group is below the floor
            if older is not None:
                unknown &= older  # some row of its group may be below it
            unknown &= ~aged
        ranges = self.ranges.setdefault(part, {})
        for key in [k for k in ranges if k[0] not in counted]:
            del ranges[key]  # retired meanwhile
        for s in np.unique(segs[at][unknown]).tolist():
            rng = ranges.get((s, floor.column.id))
            sel = np.flatnonzero(unknown & (segs[at] == s))
            if rng is not None and rng[1] < floor.value:
                aged[sel] = True
            elif rng is None or rng[0] < floor.value:
                vals = await self._values(ids[at][sel], floor.column, schema, schemas)
                if rng is None and len(vals):
                    ranges[(s, floor.column.id)] = (int(vals.min()), int(vals.max()))
                aged[sel] = vals < floor.value
        if not aged.any():
            return merged, {}
        keep = np.ones(len(merged), bool)
        keep[at[aged]] = False
        gone_segs, n = np.unique(segs[at[aged]], return_counts=True)
        return Run(merged.keys[keep], merged.ts[keep], ids[keep]), dict(zip(gone_segs.tolist(), n.tolist()))

    async def _values(self, rowids: np.ndarray, col: Column, schema: SchemaVersion,
                      schemas: Callable[[int], SchemaVersion]) -> np.ndarray:
        """The column's values (µs or days) of ``rowids``, read from their segments."""
        keep = {col.id, *(c.id for c in schema.pk.columns)}
        target = replace(schema, columns=tuple(c for c in schema.columns if c.id in keep))
        order = np.argsort(rowids, kind="stable")  # fetch answers in rowid order
        rows = await fetch(self.store, rowids[order], schemas, target, "the retention's mark pass")
        vals = numeric_values(rows.batch.column(col.name), col.type.kind)
        out = np.empty_like(vals)
        out[order] = vals
        return out
