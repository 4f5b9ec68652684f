"""The key index's reads at T, mixed into :class:`rowstore.index.key_index.PartitionIndex`:
the rowid of one key (from the memtables alone, without I/O, or reading runs), of many keys,
whether row versions are superseded, every rowid visible at T, and scans in rounds — newest
level first: the memtable, the frozen memtables, then the runs (RFC 0001)."""
from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from rowstore.index.key_manifest import Manifest
from rowstore.index.key_memtable import MemTable, Run, merge_runs, newest_versions, visible
from rowstore.index.key_picks import picks as pick_runs, runs_best
from rowstore.index.key_run import IndexRun
from rowstore.index.key_visible import RunsView, overlay
from rowstore.rowids import TOMBSTONE
from rowstore.tables.keys import KeyRange

_TOMB = int(TOMBSTONE)
_MERGE_ON_LOOP = 1 << 16  # entries a full scan merges and filters on the event loop


class KeyReads:
    """Lookups and scans at T (state: the index's ``mem``, ``_frozen``, ``runs``, ``manifest``,
    ``_view``, ``_visible``)."""

    # the index's state read and set here (rowstore.index.key_index.PartitionIndex)
    mem: MemTable
    _frozen: list[MemTable]  # being checkpointed; still read
    runs: list[tuple[int, IndexRun]]  # (level, run), newest first
    manifest: Manifest
    _view: RunsView | None  # the runs' part of visible_rowids
    # the last visible_rowids answer and what it depended on: (view, memtable runs, as_of, rowids)
    _visible: tuple[RunsView, tuple[Run, ...], int, np.ndarray] | None

    def get_mem(self, key: int | bytes, as_of: int) -> int | None:
        """``get`` from the memtables alone (no await): the rowid, 0 for a deletion, None when
        the runs must be asked."""
        r = self.mem.get_one(key, as_of)
        if not r:
            for mt in reversed(self._frozen):
                r = mt.get_one(key, as_of)
                if r:
                    break
        if r:
            return 0 if r == _TOMB else r
        return None if self.runs else 0

    def get_cached(self, key: int | bytes, as_of: int) -> int | None:
        """``get`` without I/O (memtables, then runs whose pages are parsed already); None when
        a run's page must be read first."""
        r = self.get_mem(key, as_of)
        if r is not None:
            return r
        for _, run in self.runs:
            r = run.get_cached(key, as_of)
            if r is None:
                return None
            if r:
                return 0 if r == _TOMB else r
        return 0

    async def get(self, key: int | bytes, as_of: int) -> int:
        """The rowid visible at ``as_of`` for one encoded key (int or bytes); 0 if none."""
        r = self.get_mem(key, as_of)
        if r is not None:
            return r
        for _, run in self.runs:
            r = await run.get_one(key, as_of)
            if r:
                return 0 if r == _TOMB else r
        return 0

    async def get_many(self, keys: np.ndarray, as_of: int) -> np.ndarray:
        """Per encoded key: the rowid visible at ``as_of``; 0 if absent or deleted."""
        out = np.zeros(len(keys), np.uint64)
        todo = np.arange(len(keys))
        levels: list[MemTable | IndexRun] = [self.mem, *reversed(self._frozen)]
        for lv in [*levels, *(r for _, r in self.runs)]:
            if len(todo) == 0:
                break
            got = lv.get(keys[todo], as_of) if isinstance(lv, MemTable) else await lv.get_many(keys[todo], as_of)
            hit = got != 0
            out[todo[hit]] = got[hit]
            todo = todo[~hit]
        out[out == TOMBSTONE] = 0
        return out

    async def superseded(self, keys: np.ndarray, ts: np.ndarray, source: np.ndarray, as_of: int) -> np.ndarray:
        """For row versions (key, ts) whose index entry lives in ``source`` (a run's inode; 0:
        the memtables): whether a newer version with ts <= as_of exists. Only levels that can
        hold one are searched: memtables always; a run only if its ts range reaches above
        the version's ts and not past ``as_of``, and never the version's own run when that
        run keeps one version per key."""
        out = np.zeros(len(keys), bool)
        t = np.asarray(ts, np.uint64)
        for mt in [self.mem, *self._frozen]:
            _, found = mt.lookup(keys, as_of)
            out |= found > t
        own_unique = {m["inode"] for m in self.manifest.runs if m.get("unique")}
        for m, (_, run) in zip(self.manifest.runs, self.runs):
            if run.min_ts > as_of:
                continue
            need = ~out & (source != 0) & (t < np.uint64(run.max_ts))
            if m["inode"] in own_unique:
                need &= source != m["inode"]
            idx = np.flatnonzero(need)
            if len(idx):
                _, found = await run.lookup(keys[idx], as_of)
                out[idx] |= found > t[idx]
        return out

    async def visible_rowids(self, as_of: int) -> np.ndarray:
        """Sorted rowids of every row visible at ``as_of`` (aggregates, RFC 0012). The runs'
        part is kept until a publish changes the runs, the memtables are laid over it on each
        read (:mod:`rowstore.index.key_visible`); while neither changed, the same array comes
        back (callers key their own caches on it)."""
        mem = tuple(mt.consolidated() for mt in [self.mem, *self._frozen])  # one instant with the runs
        view = await self._runs_view(as_of)
        c = self._visible
        mem_newest = max([int(m.ts.max()) for m in mem if len(m)] + [0])
        if c is not None and c[0] is view and len(c[1]) == len(mem) and all(a is b for a, b in zip(c[1], mem)) \
                and (as_of == c[2] or mem_newest <= min(as_of, c[2])):
            return c[3]
        if sum(len(m) for m in mem) > 20_000:
            ids = await asyncio.to_thread(overlay, view, list(mem), as_of)
        else:
            ids = overlay(view, list(mem), as_of)
        self._visible = (view, mem, as_of, ids)
        return ids

    async def _runs_view(self, as_of: int) -> RunsView:
        """The runs' newest entries at ``as_of`` (kept while the runs and the answer stay)."""
        runs = tuple(r for _, r in self.runs)
        view = self._view
        if view is None or not view.serves(runs, as_of):
            newest = max([r.max_ts for r in runs] + [0])
            added = view.added(runs, as_of) if view is not None else None
            read = runs if added is None else added  # after a checkpoint: its new runs alone
            entries = [await r.range(None, None) if r.min_ts <= as_of else None for r in read]
            got = [e for e in entries if e is not None]
            view = await asyncio.to_thread(RunsView.of, runs, got, as_of, newest) if view is None or added is None \
                else await asyncio.to_thread(view.with_runs, runs, got, as_of, newest)
            self._view = view
        return view

    async def picks(self, as_of: int, components: int, last: bool) -> Run:
        """Each key prefix's (its first ``components``) greatest (``last``) or least key visible at ``as_of``
        with its ts and rowid, sorted by key (:mod:`rowstore.index.key_picks`)."""
        mem = [mt.consolidated() for mt in [self.mem, *self._frozen]]  # one instant with the runs
        view = await self._runs_view(as_of)
        parts = [r for r in mem if len(r)]

        def work() -> Run:
            best = view.memo.get(("picks", components, last))
            if best is None:
                best = view.memo[("picks", components, last)] = runs_best(view.latest, components, last)
            m = newest_versions(merge_runs(parts), as_of) if parts else \
                Run(np.zeros(0, view.latest.keys.dtype), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
            heads, at = best
            return pick_runs(view.latest, heads, at, m, components, last)
        return await asyncio.to_thread(work)

    async def scan_chunk(self, rng: KeyRange[int] | KeyRange[bytes], as_of: int,
                         entries: int) -> tuple[Run, KeyRange[int] | KeyRange[bytes] | None]:
        """A scan's round (docs/rfcs/0013): the entries visible at ``as_of`` in a first part of
        ``rng``, in key order, read from about ``entries`` entries of each source (memtables and
        runs); and the rest of ``rng`` (None: nothing left). Entries below the smallest last key
        of a source cut short are complete — every version of those keys is in the round —
        so the round ends there; memory is bounded by ``entries``, not by the range."""
        sources: list[tuple[Run, bool]] = []
        for mt in [self.mem, *self._frozen]:
            run = mt.consolidated()
            a, b = rng.slice_of(run.keys)
            end = min(b, a + entries)
            sources.append((Run(run.keys[a:end], run.ts[a:end], run.rowids[a:end]), end < b))
        for _, irun in self.runs:
            if irun.min_ts <= as_of:  # a run made only of later versions holds nothing visible at T
                sources.append(await irun.chunk(rng, entries))
        cut: Any = None
        for r, more in sources:
            if more and len(r) and (cut is None or r.keys[-1] < cut):
                cut = r.keys[-1]
        parts = [r for r, _ in sources if len(r)]
        merged = merge_runs(parts) if parts else sources[0][0]
        if cut is None:
            return visible(merged, as_of), None
        k = int(np.searchsorted(merged.keys, cut, "left"))
        bound: Any = int(cut) if merged.keys.dtype == np.uint64 else bytes(cut)  # the range's own key type
        rest = rng.starting_at(bound)
        return visible(Run(merged.keys[:k], merged.ts[:k], merged.rowids[:k]), as_of), rest

    async def scan(self, as_of: int, rng: KeyRange[int] | KeyRange[bytes] | None = None) -> Run:
        """Visible (key, ts, rowid) in ``rng`` (None: every key), in key order: all of it at
        once (read plans, a query without an index); a scan by pages uses ``scan_chunk``."""
        if rng is None:
            parts = [mt.consolidated() for mt in [self.mem, *self._frozen]]
            for _, run in self.runs:
                if run.min_ts <= as_of:  # a run made only of later versions holds nothing visible at T
                    parts.append(await run.range())
            parts = [p for p in parts if len(p)] or parts[:1]
            if sum(len(p) for p in parts) > _MERGE_ON_LOOP:  # a merge and two passes over millions: off the loop
                return await asyncio.to_thread(lambda: visible(merge_runs(parts), as_of))
            return visible(merge_runs(parts), as_of)
        got: list[Run] = []
        rest: KeyRange[int] | KeyRange[bytes] | None = rng
        while rest is not None:
            vis, rest = await self.scan_chunk(rest, as_of, 1 << 20)
            got.append(vis)
        return merge_runs(got) if len(got) > 1 and any(len(g) for g in got) else got[0]
