"""One partition's primary-key index: memtable + checkpointed runs in levels (RFC 0001).

Newer data is always above older data: the memtable holds entries newer than
every run, L0 runs are newest-first and newer than L1, L1 newer than L2. A
lookup at T therefore stops at the first level that has a version of the key
with ``ts <= T``. The run list and the checkpoint mark live in one catalog row
(the manifest), swapped by compare-and-set, so a crash leaves the old or the
new manifest and recovery replays the write-ahead after the mark.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from dataclasses import replace

import numpy as np

from catalog.abc import Check, Delete, Op, Put
from catalog.errors import CatalogError
from rowstore.errors import ConflictError, FencedError
from rowstore.index.column_index import MemPiece, PartitionColumns
from rowstore.index.key_manifest import Claim, Manifest
from rowstore.index.key_run import IndexRun, run_bytes
from rowstore.index.key_memtable import MemTable, Run, merge_runs, small, visible
from rowstore.rowids import TOMBSTONE
from rowstore.index.key_purge import dropped_rowids, purge
from rowstore.index.key_visible import RunsView, overlay
from rowstore.tables.keys import KeyRange
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError, InodeNotFoundError, TerrafsError
from terrafs.fs import TerrascaleFS
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.index.key_index")
_TOMB = int(TOMBSTONE)
L0_LIMIT = 4  # the 5th L0 run triggers an L0 -> L1 merge
LEVEL_RATIO = 10
# What begin_checkpoint froze: the key memtable and the column index's token (None: no columns).
CheckpointToken = tuple[MemTable, list[MemPiece] | None]


class PartitionIndex:
    def __init__(self, fs: TerrascaleFS, key: str, kind: str, columns: PartitionColumns | None = None,
                 on_purged: Callable[[np.ndarray], Awaitable[None]] | None = None) -> None:
        """``on_purged(rowids)``: told the row versions a merge's purge dropped (the segments'
        live counts move with them)."""
        self.fs, self.key, self.kind = fs, key, kind  # key: the manifest's catalog key
        self.columns = columns  # their runs are published with ours
        self.mem = MemTable(kind)
        self._frozen: list[MemTable] = []  # being checkpointed; still read
        self._view: RunsView | None = None  # the runs' part of visible_rowids
        # the last visible_rowids answer and what it depended on: (view, memtable runs, as_of, rowids)
        self._visible: tuple[RunsView, tuple[Run, ...], int, np.ndarray] | None = None
        self._merging = False  # a memtable merge is running in a worker thread
        self.runs: list[tuple[int, IndexRun]] = []  # (level, run), newest first
        self.manifest = Manifest()
        self._version = 0
        self.publish_lock = asyncio.Lock()  # one manifest change at a time: checkpoint, merge, GC
        self.moved = False  # set under publish_lock when another node took the partition: publish nothing more
        self.on_purged = on_purged

    async def open(self, claim: Claim | None = None) -> Manifest:
        """Claim the manifest for ``claim`` (the node now serving the partition), then load the
        runs it names; the caller replays the log from ``mark``. Without a claim (tests, tools)
        the manifest is only read."""
        self.manifest, self._version = await self._claim(claim)
        self.runs = [(r["level"], await IndexRun.open(await self.fs.open_sealed(r["inode"])))
                     for r in self.manifest.runs]
        await self._collect()  # a merge that crashed before deleting what it replaced
        await self._drop_unpublished()
        if self.columns is not None:
            for r in self.manifest.runs:
                await self.columns.attach(r["inode"], r.get("cols", {}))
        return self.manifest

    async def _claim(self, claim: Claim | None) -> tuple[Manifest, int]:
        """The manifest and its version once it names ``claim``: written by compare-and-set on
        the version read, so every publish of a node that served the partition before fails
        from now on (docs/format/index-run.md, "The claim"). FencedError when a newer server
        claimed it already."""
        for _ in range(100):
            e = await self.fs.catalog.get(self.key)
            m, version = (Manifest.from_bytes(e.value), e.version) if e is not None else (Manifest(), 0)
            if claim is None or (m.owner, m.epoch) == (claim.owner, claim.epoch):
                return m, version
            if claim.refuses(m):
                raise FencedError(f"{self.key} is claimed by {m.owner or '?'} at epoch {m.epoch}, not below "
                                  f"{claim.epoch}", m.epoch)
            new = replace(m, owner=claim.owner, epoch=claim.epoch)
            res = await commit(self.fs.catalog, [Check(self.key, version)], [Put(self.key, new.to_bytes())])
            if res.committed:
                log.info("event=manifest_claimed manifest=%s owner=%s epoch=%d was=%s/%d", self.key, claim.owner,
                         claim.epoch, m.owner, m.epoch)
                return new, res.revision
        raise ConflictError(f"{self.key} kept changing while this node claimed it")

    async def _drop_unpublished(self) -> None:
        """Column runs written for a checkpoint or merge that crashed before publishing: each
        file and its pending row go in one transaction. A file that is gone already leaves only
        its row to drop; any other failure keeps both (the next open tries again) — dropping
        the row then would leave the file with nothing that names it."""
        for e in await self.fs.catalog.scan(f"{self.key}/pending/"):
            inode = int(e.key.rsplit("/", 1)[1], 16)
            try:
                await self.fs.delete(inode, [Check(e.key, e.version)], [Delete(e.key)])
            except InodeNotFoundError:
                log.info("event=index_pending_gone inode=%d", inode)
                await commit(self.fs.catalog, [Check(e.key, e.version)], [Delete(e.key)])
            except (TerrafsError, CatalogError) as err:
                log.warning("event=index_pending_kept inode=%d error=%r", inode, err)
    def insert(self, keys: np.ndarray, ts: int | np.ndarray, rowids: np.ndarray) -> None:
        self.mem.insert(keys, ts, rowids)

    @property
    def merge_due(self) -> bool:
        """Whether :meth:`merge_memtable` has work (and is not already at it)."""
        return not self._merging and self.mem.merge_due() is not None

    @property
    def consolidation_due(self) -> bool:
        """A read searched more than two memtable runs (cheap: checked on every get)."""
        return self.mem.read_many and not self._merging

    def merge_small(self) -> bool:
        """The memtable's small due merges, run here (:meth:`MemTable.merge_small`); whether a
        bigger one is left for :meth:`merge_memtable`."""
        return not self._merging and self.mem.merge_small()

    async def merge_memtable(self) -> None:
        """Run the memtable's due merges in a worker thread, one pair at a time (the small ones
        here); a result is dropped if the memtable was frozen for a checkpoint meanwhile."""
        if self._merging:
            return
        self._merging = True
        try:
            mem = self.mem
            while self.mem is mem and (due := mem.merge_due()) is not None:
                merged = merge_runs(list(due)) if small(due) else await asyncio.to_thread(merge_runs, list(due))
                if self.mem is mem:
                    mem.replace(due, merged)
        finally:
            self._merging = False

    # -- reads -------------------------------------------------------------------------

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
        runs = tuple(r for _, r in self.runs)
        view = self._view
        if view is None or not view.serves(runs, as_of):
            entries = [await r.range(None, None) if r.min_ts <= as_of else None for r in runs]
            newest = max([r.max_ts for r in runs] + [0])
            view = await asyncio.to_thread(RunsView.of, runs, [e for e in entries if e is not None], as_of, newest)
            self._view = view
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
            merged = merge_runs([p for p in parts if len(p)]) if any(len(p) for p in parts) else parts[0]
            return visible(merged, as_of)
        got: list[Run] = []
        rest: KeyRange[int] | KeyRange[bytes] | None = rng
        while rest is not None:
            vis, rest = await self.scan_chunk(rest, as_of, 1 << 20)
            got.append(vis)
        return merge_runs(got) if len(got) > 1 and any(len(g) for g in got) else got[0]

    # -- checkpoint and merge -------------------------------------------------------------

    async def checkpoint(self, mark: Sequence[int]) -> bool:
        """Write the memtable as an L0 run (and the column runs of the same rows); the files
        and the manifest naming them (with the replay mark) are published in ONE transaction.

        The caller guarantees the memtable holds exactly the rows before ``mark``."""
        if self.mem.entries == 0:
            return False
        return await self.finish_checkpoint(self.begin_checkpoint(), mark)

    def begin_checkpoint(self) -> CheckpointToken:
        """Freeze the memtables (synchronously: nothing can slip in between key and column
        entries); reads still see the frozen ones until the runs are published."""
        frozen, self.mem = self.mem, MemTable(self.kind)
        self._frozen.append(frozen)
        return frozen, (self.columns.freeze() if self.columns is not None else None)

    async def finish_checkpoint(self, token: CheckpointToken, mark: Sequence[int]) -> bool:
        async with self.publish_lock:
            if self.moved:
                return False
            return await self._finish_checkpoint(token, mark)

    async def _finish_checkpoint(self, token: CheckpointToken, mark: Sequence[int]) -> bool:
        frozen, ctoken = token
        try:
            run = await asyncio.to_thread(frozen.consolidated)  # a sort of the whole memtable
            cols: dict[str, int] = {}
            if ctoken is not None:
                assert self.columns is not None  # a column token comes from self.columns (begin_checkpoint)
                cols = await self.columns.write_runs(ctoken)
            rec = await self._publish(run, 0, lambda r: replace(
                self.manifest,
                runs=[{"inode": r.inode, "level": 0, "entries": len(run), "cols": cols, "unique": _unique(run)}]
                + self.manifest.runs, mark=list(mark), checkpoints=self.manifest.checkpoints + 1), cols)
            self.runs.insert(0, (0, await IndexRun.open(await self.fs.open_sealed(rec.inode))))
            if ctoken is not None:
                assert self.columns is not None  # as above
                await self.columns.attach(rec.inode, cols)
                self.columns.release(ctoken)
                ctoken = None
        except BaseException:
            self.mem = _prepend(frozen, self.mem, self.kind)  # still readable; a later checkpoint retries
            if ctoken is not None:
                assert self.columns is not None  # as above
                self.columns.thaw(ctoken)
            raise
        finally:
            self._frozen.remove(frozen)
        log.info("event=index_checkpoint manifest=%s entries=%d", self.key, frozen.entries)
        return True

    async def maybe_merge(self, horizon: int) -> bool:
        """Leveled policy: more than L0_LIMIT L0 runs -> merge into L1; L1 too big -> into L2."""
        l0 = [r for lv, r in self.runs if lv == 0]
        if len(l0) > L0_LIMIT:
            await self.merge(0, horizon)
            return True
        l1 = sum(r.entries for lv, r in self.runs if lv == 1)
        if l1 > LEVEL_RATIO * L0_LIMIT * max([r.entries for r in l0] or [1]):
            await self.merge(1, horizon)
            return True
        return False

    async def merge(self, level: int, horizon: int) -> None:
        """Merge every run of ``level`` and ``level + 1`` into one run at ``level + 1``."""
        async with self.publish_lock:
            if not self.moved:
                await self._merge(level, horizon)

    async def _merge(self, level: int, horizon: int) -> None:
        src = [(m, lr) for m, lr in zip(self.manifest.runs, self.runs) if lr[0] in (level, level + 1)]
        bottom = not any(lv > level + 1 for lv, _ in self.runs)
        parts = [await r.all() for _, (_, r) in src]
        merged = await asyncio.to_thread(lambda: purge(merge_runs(parts), horizon, bottom))
        cols = await self._merge_columns([m for m, _ in src], merged)
        gone = [m["inode"] for m, _ in src] + [i for m, _ in src for i in m.get("cols", {}).values()]
        rest = [m for m in self.manifest.runs if m["inode"] not in gone]

        def manifest(rec: FileRecord) -> Manifest:
            entry = {"inode": rec.inode, "level": level + 1, "entries": len(merged), "cols": cols,
                     "unique": _unique(merged)}
            return replace(self.manifest, runs=[m for m in rest if m["level"] < level] + [entry] +
                           [m for m in rest if m["level"] > level + 1], garbage=self.manifest.garbage + gone)

        by_inode = {m["inode"]: r for m, (_, r) in zip(self.manifest.runs, self.runs)}  # before the swap
        rec = await self._publish(merged, level + 1, manifest, cols)
        by_inode[rec.inode] = await IndexRun.open(await self.fs.open_sealed(rec.inode))
        self.runs = [(m["level"], by_inode[m["inode"]]) for m in self.manifest.runs]
        if self.columns is not None:
            await self.columns.attach(rec.inode, cols)
            for m, _ in src:
                self.columns.detach(m["inode"])
        await self._collect()
        log.info("event=index_merge manifest=%s level=%d runs=%d entries=%d", self.key, level, len(src), len(merged))
        if self.on_purged is not None:  # under the publish lock: ordered with a GC pass's own count
            dropped = await asyncio.to_thread(dropped_rowids, parts, merged)  # two sorts of the level: off the loop
            if len(dropped):
                await self.on_purged(dropped)

    async def _merge_columns(self, src: list[dict[str, Any]], merged: Run) -> dict[str, int]:
        """Column runs for a merged key run: the sources' pairs minus what the purge dropped."""
        if self.columns is None or not self.columns.columns:
            return {}
        pieces = []
        for m in src:
            for cid_s, inode in m.get("cols", {}).items():
                if int(cid_s) in self.columns.columns:
                    rowids, values = await self.columns.run_data(inode)
                    pieces.append((rowids, {int(cid_s): values}))
        keep = np.sort(merged.rowids[merged.rowids != TOMBSTONE])
        return await self.columns.write_runs(pieces, keep)

    # -- garbage collection (docs/rfcs/0009-gc.md) ------------------------------------------

    async def gc_view(self, horizon: int, with_memtable: bool = False) -> Run:
        """Every run merged and purged at ``horizon`` as at the bottom level, minus the entries
        at or below it that a memtable version at or below it supersedes: the entries a
        relocation keeps. The caller holds ``publish_lock``. ``with_memtable``: the memtables'
        entries merged in too (a dry run's view of liveness, without a checkpoint)."""
        parts = [mt.consolidated() for mt in [self.mem, *reversed(self._frozen)]] if with_memtable else []
        parts += [await r.all() for _, r in self.runs]
        parts = [p for p in parts if len(p)]
        if not parts:
            e = np.zeros(0, np.uint64 if self.kind == "int64" else "S1")
            return Run(e, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        merged = await asyncio.to_thread(lambda: purge(merge_runs(parts), horizon, True))
        old = np.flatnonzero(merged.ts <= np.uint64(horizon))
        if len(old):
            gone = np.zeros(len(old), bool)
            for mt in [self.mem, *self._frozen]:
                _, found = mt.lookup(merged.keys[old], horizon)
                gone |= found > merged.ts[old]
            if gone.any():
                keep = np.ones(len(merged), bool)
                keep[old[gone]] = False
                merged = Run(merged.keys[keep], merged.ts[keep], merged.rowids[keep])
        return merged

    async def publish_relocation(self, merged: Run, old: np.ndarray, new: np.ndarray, checks: list[Check],
                                 ops: list[Op]) -> None:
        """Replace every run by ``merged`` with rowids ``old`` (sorted) moved to ``new``, and the
        column runs likewise, in ONE transaction with the caller's ``checks``/``ops`` (the
        segments' rows). The caller holds ``publish_lock``; the swap is a compare-and-set
        on the manifest, so a manifest changed by anyone else fails the whole publish."""
        from rowstore.segments.relocate import remap

        run = Run(merged.keys, merged.ts, remap(merged.rowids, old, new))
        cols = await self._relocate_columns(run, old, new)
        gone = [m["inode"] for m in self.manifest.runs] + \
            [i for m in self.manifest.runs for i in m.get("cols", {}).values()]
        src = list(self.manifest.runs)

        def manifest(rec: FileRecord) -> Manifest:
            entry = {"inode": rec.inode, "level": 2, "entries": len(run), "cols": cols, "unique": _unique(run)}
            return replace(self.manifest, runs=[entry], garbage=self.manifest.garbage + gone)

        rec = await self._publish(run, 2, manifest, cols, (checks, ops))
        self.runs = [(2, await IndexRun.open(await self.fs.open_sealed(rec.inode)))]
        if self.columns is not None:
            await self.columns.attach(rec.inode, cols)
            for m in src:
                self.columns.detach(m["inode"])

    async def _relocate_columns(self, run: Run, old: np.ndarray, new: np.ndarray) -> dict[str, int]:
        from rowstore.segments.relocate import remap

        if self.columns is None or not self.columns.columns:
            return {}
        pieces = []
        for m in self.manifest.runs:
            for cid_s, inode in m.get("cols", {}).items():
                if int(cid_s) in self.columns.columns:
                    rowids, values = await self.columns.run_data(inode)
                    pieces.append((remap(rowids, old, new), {int(cid_s): values}))
        keep = np.sort(run.rowids[run.rowids != TOMBSTONE])
        return await self.columns.write_runs(pieces, keep)

    async def collect(self) -> None:
        """Delete the runs a merge or a relocation replaced (named in the manifest's garbage)."""
        async with self.publish_lock:
            if not self.moved:
                await self._collect()

    async def _publish(self, run: Run, level: int, make_manifest: Callable[[FileRecord], Manifest],
                       cols: dict[str, int] | None = None,
                       more: tuple[Sequence[Check], Sequence[Op]] = ([], [])) -> FileRecord:
        """Create the run's file; its publishing transaction also swaps the manifest (and
        clears the pending marks of the column runs it names), with ``more`` checks/ops."""
        box = {}
        pending: list[Op] = []
        if cols:
            assert self.columns is not None  # column runs are written by self.columns
            pending = [Delete(self.columns.pending_key(i)) for i in cols.values()]

        def extra(rec: FileRecord) -> tuple[list[Check], list[Op]]:
            box["m"] = make_manifest(rec)
            return [Check(self.key, self._version), *more[0]], [Put(self.key, box["m"].to_bytes()), *pending,
                                                              *more[1]]

        try:
            rec = await self.fs.create_sealed(run_bytes(run, self.kind, level), extra=extra)
        except CatalogConflictError as e:
            raise ConflictError(f"{self.key} changed under this partition's writer") from e
        self.manifest = box["m"]
        row = await self.fs.catalog.get(self.key)
        assert row is not None  # the transaction that created the run wrote it
        self._version = row.version
        return rec

    async def _collect(self) -> None:
        """Delete the replaced runs named in ``garbage``, each in ONE transaction with the
        manifest's version check and its removal from the list. A server whose manifest is
        stale (another claimed it, collected the same runs, and their inodes went back to the
        free ranges, where a new run can take one) deletes nothing: its check fails first."""
        while self.manifest.garbage:
            inode, rest = self.manifest.garbage[0], self.manifest.garbage[1:]
            new = replace(self.manifest, garbage=rest)
            checks, ops = [Check(self.key, self._version)], [Put(self.key, new.to_bytes())]
            revision: int | None
            try:
                revision = await self.fs.delete(inode, checks, ops)
            except InodeNotFoundError as e:  # gone already: a crash between its delete and the list's clear
                log.info("event=index_garbage_skip inode=%d reason=%r", inode, e)
                res = await commit(self.fs.catalog, checks, ops)
                revision = res.revision if res.committed else None
            except CatalogConflictError:
                revision = None
            if revision is None:
                raise ConflictError(f"{self.key} changed under this partition's writer")
            self.manifest, self._version = new, revision


def _prepend(older: MemTable, newer: MemTable, kind: str) -> MemTable:
    """One memtable holding ``older``'s entries and then ``newer``'s."""
    out = MemTable(kind)
    for mt in (older, newer):
        run = mt.consolidated()
        if len(run):
            out.insert(run.keys, run.ts, run.rowids)
    return out


def _unique(run: Run) -> bool:
    """Whether the run holds at most one version per key (then a version found in it needs
    no check against the rest of it)."""
    return bool(len(run) < 2 or not (run.keys[1:] == run.keys[:-1]).any())
