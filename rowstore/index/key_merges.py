"""The key index's checkpoints and leveled merges, mixed into
:class:`rowstore.index.key_index.PartitionIndex`: the memtable frozen and written as an L0 run,
L0 runs merged into L1 and L1 into L2 (purged at the horizon), each with its column runs and
published in one transaction with the manifest (docs/format/index-run.md)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from catalog.abc import Check, Op, Put
from rowstore.index.column_index import MemPiece, PartitionColumns
from rowstore.index.key_manifest import Manifest
from rowstore.index.key_memtable import MemTable, Run, merge_runs
from rowstore.index.key_purge import dropped_rowids, purged
from rowstore.index.key_run import IndexRun
from rowstore.errors import ConflictError
from rowstore.rowids import TOMBSTONE
from terrafs.catalog_ops import commit
from terrafs.fs import TerrascaleFS
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.index.key_index")
L0_LIMIT = 4  # the 5th L0 run triggers an L0 -> L1 merge
LEVEL_RATIO = 10  # L1 merges into L2 when it holds a tenth of L2's entries
# What begin_checkpoint froze: the key memtable and the column index's token (None: no columns).
CheckpointToken = tuple[MemTable, list[MemPiece] | None]


class KeyMerges:
    """Checkpoint and merge (state: the index's ``fs``, ``key``, ``kind``, ``columns``, ``mem``,
    ``_frozen``, ``runs``, ``manifest``, ``publish_lock``, ``moved``, ``on_purged``)."""

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
    moved: bool
    _version: int  # the manifest row's catalog version
    on_purged: Callable[[np.ndarray], Awaitable[None]] | None

    if TYPE_CHECKING:  # the index's methods used here
        async def _publish(self, run: Run, level: int, make_manifest: Callable[[FileRecord], Manifest],
                           cols: dict[str, int] | None = None,
                           more: tuple[Sequence[Check], Sequence[Op]] = ([], [])) -> FileRecord: ...

        async def _collect(self) -> None: ...

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
        into L2 — each merge rewrote the whole history)."""
        l0 = [r for lv, r in self.runs if lv == 0]
        if len(l0) > L0_LIMIT:
            await self.merge(0, horizon)
            return True
        l1 = sum(r.entries for lv, r in self.runs if lv == 1)
        if l1 and l1 * LEVEL_RATIO >= sum(r.entries for lv, r in self.runs if lv == 2):
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
        merged, dropped = await asyncio.to_thread(lambda: purged(merge_runs(parts), horizon, bottom))
        if len(src) == 1 and len(merged) == len(parts[0]):  # a lone run the purge leaves whole: moved as it is
            await self._move_down(src[0][0], level + 1)
            return
        cols = await self._merge_columns([m for m, _ in src], merged)
        gone = [m["inode"] for m, _ in src] + [i for m, _ in src for i in m.get("cols", {}).values()]
        rest = [m for m in self.manifest.runs if m["inode"] not in gone]

        def manifest(rec: FileRecord) -> Manifest:
            entry = {"inode": rec.inode, "level": level + 1, "entries": len(merged), "cols": cols,
                     "unique": unique_keys(merged)}
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
        if self.on_purged is not None and len(dropped):  # under the publish lock: ordered with a GC pass's count
            dead = await asyncio.to_thread(dropped_rowids, dropped, merged)  # a sort of the level: off the loop
            if len(dead):
                await self.on_purged(dead)

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
