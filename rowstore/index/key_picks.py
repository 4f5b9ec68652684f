"""Each key prefix's greatest (or least) live key at T, from the key index alone (RFC 0016 §3,
"last by the key's time"): a measurement table keyed ``(sensor, ts)`` answers "the last
reading per sensor" with one entry per sensor instead of every row's ``ts``.

The runs' part is computed once per :class:`rowstore.index.key_visible.RunsView` (each prefix's
best live entry among the runs' newest entries at T) and kept on it; each read lays the
memtables' newest entries over it: a run entry a memtable entry supersedes (a newer version,
or a deletion) no longer counts — its prefix's best is looked for again below it, among the
entries not superseded — and a memtable entry that is live competes with the runs' best.
Prefixes are the keys' first components (``rowstore.tables.tuple_keys.prefix_heads``).
"""
from __future__ import annotations

import numpy as np

from rowstore.index.key_memtable import Run
from rowstore.rowids import TOMBSTONE
from rowstore.tables.tuple_keys import prefix_heads


def best_live(live: np.ndarray, heads: np.ndarray, last: bool) -> np.ndarray:
    """Per prefix (``heads``), the index of its last (``last``) or first live entry; -1: none."""
    n = len(live)
    if not len(heads):
        return np.zeros(0, np.int64)
    pos = np.arange(n, dtype=np.int64)
    if last:
        return np.maximum.reduceat(np.where(live, pos, -1), heads)
    got = np.minimum.reduceat(np.where(live, pos, n), heads)
    return np.where(got == n, -1, got)


def runs_best(latest: Run, components: int, last: bool) -> tuple[np.ndarray, np.ndarray]:
    """(heads, best index per prefix or -1) among the runs' newest entries ``latest``."""
    heads = prefix_heads(latest.keys, components)
    return heads, best_live(latest.rowids != TOMBSTONE, heads, last)


def picks(latest: Run, heads: np.ndarray, best: np.ndarray, mem: Run, components: int, last: bool) -> Run:
    """Each prefix's best live entry over the runs' ``latest`` (with ``heads``/``best`` from
    :func:`runs_best`) and the memtables' newest entries ``mem`` laid over them (a tie goes
    to the memtable, as the full merge orders it); sorted by key."""
    best = best.copy()
    ends = np.r_[heads[1:], len(latest)] if len(heads) else heads
    mine = np.ones(len(mem), bool)  # memtable entries that win over the runs' entry of their key
    if len(mem) and len(latest):
        pos = np.searchsorted(latest.keys, mem.keys)
        at = np.minimum(pos, len(latest) - 1)
        hit = (pos < len(latest)) & (latest.keys[at] == mem.keys)
        mine = ~hit | (mem.ts >= latest.ts[at])
        over = np.sort(at[hit & mine])  # run entries superseded by the memtables
        if len(over):
            _redo(latest, heads, ends, best, over, last)
    cands = [best[best >= 0]]
    ours = Run(latest.keys[cands[0]], latest.ts[cands[0]], latest.rowids[cands[0]])
    live = mine & (mem.rowids != TOMBSTONE) if len(mem) else mine
    m = Run(mem.keys[live], mem.ts[live], mem.rowids[live])
    if len(m):
        mh = prefix_heads(m.keys, components)
        take = (np.r_[mh[1:], len(m)] - 1) if last else mh
        ours = _concat(ours, Run(m.keys[take], m.ts[take], m.rowids[take]))
    if not len(ours):
        return ours
    order = np.argsort(ours.keys, kind="stable")
    ours = Run(ours.keys[order], ours.ts[order], ours.rowids[order])
    h = prefix_heads(ours.keys, components)
    take = (np.r_[h[1:], len(ours)] - 1) if last else h
    return Run(ours.keys[take], ours.ts[take], ours.rowids[take])


def _redo(latest: Run, heads: np.ndarray, ends: np.ndarray, best: np.ndarray, over: np.ndarray, last: bool) -> None:
    """``best`` again for the prefixes whose best run entry a memtable entry superseded: the
    next live entry of the prefix that is not superseded either (in place)."""
    g = np.searchsorted(heads, over, "right") - 1
    hit = np.flatnonzero(best[g] == over)  # superseded entries that were their prefix's best
    for grp in np.unique(g[hit]).tolist():
        a, b = int(heads[grp]), int(ends[grp])
        ok = latest.rowids[a:b] != TOMBSTONE
        gone = over[(over >= a) & (over < b)] - a
        ok[gone] = False
        idx = np.flatnonzero(ok)
        best[grp] = -1 if not len(idx) else a + int(idx[-1] if last else idx[0])


def _concat(a: Run, b: Run) -> Run:
    if not len(a):
        return b
    width = max(a.keys.dtype.itemsize, b.keys.dtype.itemsize)
    return Run(np.concatenate([a.keys.astype(f"S{width}"), b.keys.astype(f"S{width}")]),
               np.concatenate([a.ts, b.ts]), np.concatenate([a.rowids, b.rowids]))
