"""One partition's primary-key index: memtable + checkpointed runs in levels (RFC 0001).

Newer data is always above older data: the memtable holds entries newer than
every run, L0 runs are newest-first and newer than L1, L1 newer than L2. A
lookup at T therefore stops at the first level that has a version of the key
with ``ts <= T``. The run list and the checkpoint mark live in one catalog row
(the manifest), swapped by compare-and-set, so a crash leaves the old or the
new manifest and recovery replays the write-ahead after the mark.

Here: the manifest claimed and opened, the memtable's own merges, the relocation of a
garbage-collection pass, publishing and collecting runs; reads are in ``key_reads.py``,
checkpoints and level merges in ``key_merges.py``.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import numpy as np

from catalog.abc import Check, Delete, Entry, Op, Put
from catalog.errors import CatalogError
from rowstore.errors import ConflictError, FencedError
from rowstore.index.column_index import PartitionColumns
from rowstore.index.key_manifest import Claim, Manifest
from rowstore.index.key_run import IndexRun, run_bytes
from rowstore.index.key_memtable import MemTable, Run, merge_runs, small
from rowstore.index.key_merges import KeyMerges, unique_keys
from rowstore.rowids import TOMBSTONE
from rowstore.index.key_purge import purge
from rowstore.index.key_reads import KeyReads
from rowstore.index.key_visible import RunsView
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError, InodeNotFoundError, TerrafsError
from terrafs.fs import Built, TerrascaleFS
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.index.key_index")


class PartitionIndex(KeyReads, KeyMerges):
    """One partition's key index; its reads (:class:`KeyReads`) and its checkpoints and merges
    (:class:`KeyMerges`) are its parts."""

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
        # one rewrite of the runs at a time — a level merge or a GC relocation — taken before
        # publish_lock: a merge reads and writes its runs without the publish lock, which it
        # takes only to swap the manifest (checkpoints go on meanwhile)
        self.rewrite_lock = asyncio.Lock()
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
            await self._drop_pending(e)

    async def _drop_pending(self, e: Entry) -> None:
        """One unpublished column run and its pending row (``_drop_unpublished``)."""
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
            entry = {"inode": rec.inode, "level": 2, "entries": len(run), "cols": cols, "unique": unique_keys(run)}
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
        return await self.columns.write_runs(pieces, run.rowids[run.rowids != TOMBSTONE])

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
        return await self._publish_built(await self._build(run, level), make_manifest, cols, more)

    async def _build(self, run: Run, level: int) -> Built:
        return await self.fs.build_sealed(run_bytes(run, self.kind, level))

    async def _publish_built(self, built: Built, make_manifest: Callable[[FileRecord], Manifest],
                             cols: dict[str, int] | None = None,
                             more: tuple[Sequence[Check], Sequence[Op]] = ([], [])) -> FileRecord:
        """``_publish`` of a run file built already (``_build``); a failed check discards it."""
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
            rec = await self.fs.publish_built(built, extra=extra)
        except CatalogConflictError as e:
            await self._discard(built)
            raise ConflictError(f"{self.key} changed under this partition's writer") from e
        self.manifest = box["m"]
        row = await self.fs.catalog.get(self.key)
        assert row is not None  # the transaction that created the run wrote it
        self._version = row.version
        return rec

    async def _discard(self, built: Built) -> None:
        """A built run that will not be published: gone now (else a restart rolls it back)."""
        try:
            await self.fs.discard_built(built)
        except (TerrafsError, CatalogError) as e:
            log.warning("event=index_run_discard_failed inode=%d error=%r", built.rec.inode, e)

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
