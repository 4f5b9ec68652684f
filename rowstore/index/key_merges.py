"""The key index's checkpoints and leveled merges, mixed into
:class:`rowstore.index.key_index.PartitionIndex`: the memtable frozen and written as an L0 run,
L0 runs merged into L1 and L1 into L2 (purged at the horizon), each with its column runs and
published in one transaction with the manifest (docs/format/index-run.md)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from catalog.abc import Check, Entry, Op, Put
from rowstore.index.column_index import MemPiece, PartitionColumns
from rowstore.index.key_manifest import Manifest
from rowstore.index.key_memtable import MemTable, Run, merge_runs
from rowstore.index.key_purge import dropped_rowids, purged
from rowstore.index.key_run import IndexRun
from catalog.errors import CatalogError
from rowstore.errors import ConflictError, RowstoreError
from rowstore.rowids import TOMBSTONE
from terrafs.catalog_ops import commit
from terrafs.errors import TerrafsError
from terrafs.fs import Built, TerrascaleFS
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.index.key_index")
L0_LIMIT = 4  # the 5th L0 run triggers an L0 -> L1 merge
LEVEL_RATIO = 10  # L1 merges into L2 when it holds a tenth of L2's entries
# What begin_checkpoint froze: the key memtable and the column index's token (None: no columns).
CheckpointToken = tuple[MemTable, list[MemPiece] | None]


@dataclass
class _Merged:
    """What a merge wrote before it publishes: the merged run, its file (None: the lone source
    run moves down as it is), its column runs (column id -> inode) and the dropped rowids."""

    run: Run
    built: Built | None
    cols: dict[str, int]
    dead: np.ndarray


class KeyMerges:
    """Checkpoint and merge (state: the index's ``fs``, ``key``, ``kind``, ``columns``, ``mem``,
    ``_frozen``, ``runs``, ``manifest``, ``publish_lock``, ``rewrite_lock``, ``moved``, ``on_purged``)."""

    # the index's state read and set here (rowstore.index.key_index.PartitionIndex)
    fs: TerrascaleFS
    key: str
    kind: str
    columns: PartitionColumns | None
    mem: MemTable
    _frozen: list[MemTable]
    runs: list[tuple[int, IndexRun]]
    manifest: Manifest
    publish_lock: asyncio.Lock
    rewrite_lock: asyncio.Lock
    moved: bool
    _version: int  # the manifest row's catalog version
    on_purged: Callable[[np.ndarray], Awaitable[None]] | None

    if TYPE_CHECKING:  # the index's methods used here
        async def _publish(self, run: Run, level: int, make_manifest: Callable[[FileRecord], Manifest],
                           cols: dict[str, int] | None = None,
                           more: tuple[Sequence[Check], Sequence[Op]] = ([], [])) -> FileRecord: ...

        async def _collect(self) -> None: ...

        async def _build(self, run: Run, level: int) -> Built: ...

        async def _publish_built(self, built: Built, make_manifest: Callable[[FileRecord], Manifest],
                                 cols: dict[str, int] | None = None,
                                 more: tuple[Sequence[Check], Sequence[Op]] = ([], [])) -> FileRecord: ...

        async def _discard(self, built: Built) -> None: ...

        async def _drop_pending(self, e: Entry) -> None: ...

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
                runs=[{"inode": r.inode, "level": 0, "entries": len(run), "cols": cols, "unique": unique_keys(run)}]
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

    async def advance_mark(self, mark: Sequence[int]) -> bool:
        """With empty memtables and no checkpoint in flight — every entry already in runs — move
        the replay mark to ``mark`` when it is ahead: the manifest row alone rewritten. Without
        it a partition whose writes stopped right after a checkpoint kept its mark inside its
        last segment, which the garbage collector then never takes (it takes only segments
        below the mark). Whether it moved."""
        async with self.publish_lock:
            old = list(self.manifest.mark) + [0] * (3 - len(self.manifest.mark))
            if self.moved or self._frozen or self.mem.entries or (mark[2], mark[1]) <= (old[2], old[1]):
                return False
            new = replace(self.manifest, mark=list(mark))
            res = await commit(self.fs.catalog, [Check(self.key, self._version)], [Put(self.key, new.to_bytes())])
            if not res.committed:
                raise ConflictError(f"{self.key} changed under this partition's writer")
            self.manifest, self._version = new, res.revision
            return True

    async def maybe_merge(self, horizon: int) -> bool:
        """Leveled policy: more than L0_LIMIT L0 runs -> merge into L1; L1 holding at least
        1/LEVEL_RATIO of L2's entries -> into L2. L2 is rewritten only once L1 has grown by a
        tenth of it, so the entries rewritten over a history stay a small multiple of it (RFC
        0001: the bound once followed L0's run size and, L0 just merged away, sent every L1
        into L2 — each merge rewrote the whole history). Decided under ``rewrite_lock``, so
        two callers do not both merge what one merge already took."""
        async with self.rewrite_lock:
            level = self._due()
            if level is None:
                return False
            await self._merge(level, horizon)
            return True

    def _due(self) -> int | None:
        """The level the policy merges down now, or None."""
        if sum(1 for lv, _ in self.runs if lv == 0) > L0_LIMIT:
            return 0
        l1 = sum(r.entries for lv, r in self.runs if lv == 1)
        if l1 and l1 * LEVEL_RATIO >= sum(r.entries for lv, r in self.runs if lv == 2):
            return 1
        return None

    async def merge(self, level: int, horizon: int) -> None:
        """Merge every run of ``level`` and ``level + 1`` into one run at ``level + 1``."""
        async with self.rewrite_lock:
            await self._merge(level, horizon)

    async def _merge(self, level: int, horizon: int) -> None:
        """The runs are read, merged, purged and written — key run and column runs — without
        ``publish_lock``: the runs it reads are immutable and ``rewrite_lock`` keeps every other
        rewrite of them out, so checkpoints (a stalled writer's among them) publish meanwhile; a
        merge of millions of entries held the lock for a minute and writers waited it out
        (RFC 0001, "Locks"). The lock is taken to swap the manifest only: the new L0 runs
        checkpoints published meanwhile stay above the merged run."""
        async with self.publish_lock:
            if self.moved:
                return
            src = [(m, r) for m, (lv, r) in zip(self.manifest.runs, self.runs) if lv in (level, level + 1)]
            bottom = not any(lv > level + 1 for lv, _ in self.runs)
        try:
            out = await self._merged(src, level, horizon, bottom)
        except (RowstoreError, TerrafsError, CatalogError):
            if self.moved:  # its runs are another node's now, which may have merged and deleted them
                log.info("event=index_merge_dropped manifest=%s level=%d reason=moved", self.key, level)
                return
            raise
        async with self.publish_lock:
            if self.moved or not self._holds([m for m, _ in src]):
                log.info("event=index_merge_dropped manifest=%s level=%d moved=%s", self.key, level, self.moved)
                await self._drop_outputs(out)
                return
            if out.built is None:  # a lone run the purge leaves whole: moved as it is
                await self._move_down(src[0][0], level + 1)
                return
            await self._swap(level, [m for m, _ in src], out)

    async def _merged(self, src: list[tuple[dict[str, Any], IndexRun]], level: int, horizon: int,
                      bottom: bool) -> _Merged:
        """The merge's work, no lock held: the merged run written (``BUILDING``, its column runs
        pending) and the rowids its purge dropped."""
        parts = [await r.all() for _, r in src]
        merged, dropped = await asyncio.to_thread(lambda: purged(merge_runs(parts), horizon, bottom))
        if len(src) == 1 and len(merged) == len(parts[0]):
            return _Merged(merged, None, {}, np.zeros(0, np.uint64))
        cols = await self._merge_columns([m for m, _ in src], merged)
        try:
            built = await self._build(merged, level + 1)
        except Exception:  # not on a cancel (the process ending): the next open drops them
            await self._drop_outputs(_Merged(merged, None, cols, dropped))
            raise
        dead = dropped
        if self.on_purged is not None and len(dropped):
            dead = await asyncio.to_thread(dropped_rowids, dropped, merged)  # a sort of the level: off the loop
        return _Merged(merged, built, cols, dead)

    def _holds(self, src: list[dict[str, Any]]) -> bool:
        """Whether the manifest still names every run a merge read, at its level."""
        now = {m["inode"]: m["level"] for m in self.manifest.runs}
        return all(now.get(m["inode"]) == m["level"] for m in src)

    async def _drop_outputs(self, out: _Merged) -> None:
        """A merge's files that will not be published: its run and its pending column runs."""
        if out.built is not None:
            await self._discard(out.built)
        for inode in out.cols.values():
            assert self.columns is not None  # column runs are written by self.columns
            e = await self.fs.catalog.get(self.columns.pending_key(inode))
            if e is not None:
                await self._drop_pending(e)

    async def _swap(self, level: int, src: list[dict[str, Any]], out: _Merged) -> None:
        """Publish a merge (under ``publish_lock``): the manifest names the merged run in place
        of ``src``; runs checkpointed since stay above it; the replaced runs are collected."""
        merged, cols = out.run, out.cols
        gone = [m["inode"] for m in src] + [i for m in src for i in m.get("cols", {}).values()]
        rest = [m for m in self.manifest.runs if m["inode"] not in gone]

        def manifest(rec: FileRecord) -> Manifest:
            entry = {"inode": rec.inode, "level": level + 1, "entries": len(merged), "cols": cols,
                     "unique": unique_keys(merged)}
            return replace(self.manifest, runs=[m for m in rest if m["level"] <= level] + [entry] +
                           [m for m in rest if m["level"] > level + 1], garbage=self.manifest.garbage + gone)

        by_inode = {m["inode"]: r for m, (_, r) in zip(self.manifest.runs, self.runs)}  # before the swap
        assert out.built is not None  # a merge that moved its run down publishes no file
        rec = await self._publish_built(out.built, manifest, cols)
        by_inode[rec.inode] = await IndexRun.open(await self.fs.open_sealed(rec.inode))
        self.runs = [(m["level"], by_inode[m["inode"]]) for m in self.manifest.runs]
        if self.columns is not None:
            await self.columns.attach(rec.inode, cols)
            for m in src:
                self.columns.detach(m["inode"])
        await self._collect()
        log.info("event=index_merge manifest=%s level=%d runs=%d entries=%d", self.key, level, len(src), len(merged))
        if self.on_purged is not None and len(out.dead):  # under the publish lock: ordered with a GC pass's count
            await self.on_purged(out.dead)

    async def _move_down(self, entry: dict[str, Any], level: int) -> None:
        """A run to ``level`` by the manifest alone (LevelDB's trivial move): its rewrite would
        hold the same entries and column runs (the first L1 run of a partition into an empty
        L2: millions of entries rewritten for nothing, a writer stalled behind it)."""
        new = replace(self.manifest, runs=[{**m, "level": level} if m["inode"] == entry["inode"] else m
                                           for m in self.manifest.runs])
        res = await commit(self.fs.catalog, [Check(self.key, self._version)], [Put(self.key, new.to_bytes())])
        if not res.committed:
            raise ConflictError(f"{self.key} changed under this partition's writer")
        self.manifest, self._version = new, res.revision
        self.runs = [(m["level"], r) for m, (_, r) in zip(self.manifest.runs, self.runs)]
        log.info("event=index_move manifest=%s level=%d entries=%s", self.key, level, entry.get("entries"))

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
        return await self.columns.write_runs(pieces, merged.rowids[merged.rowids != TOMBSTONE])


def _prepend(older: MemTable, newer: MemTable, kind: str) -> MemTable:
    """One memtable holding ``older``'s entries and then ``newer``'s."""
    out = MemTable(kind)
    for mt in (older, newer):
        run = mt.consolidated()
        if len(run):
            out.insert(run.keys, run.ts, run.rowids)
    return out


def unique_keys(run: Run) -> bool:
    """Whether the run holds at most one version per key (then a version found in it needs
    no check against the rest of it)."""
    return bool(len(run) < 2 or not (run.keys[1:] == run.keys[:-1]).any())
