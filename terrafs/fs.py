"""TerrascaleFS: files named by inodes, tiered from block device to object store.

The namespace lives in the catalog (``terrafs.records``, ``terrafs.ranges``);
bytes live in active files (``terrafs.active``) and sealed objects
(``terrafs.sealed``). Every state change is one catalog transaction, ordered
against storage writes so that a crash at any step leaves either the old or
the new state and :meth:`TerrascaleFS.open` finishes or rolls back the rest
(docs/format/terrafs.md §5). Named fail points mark each step for tests.
"""
from __future__ import annotations

import asyncio
import builtins
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import AsyncIterable, AsyncIterator, Callable, Sequence

from catalog.abc import Catalog, Check, Delete, Entry, Op, Put
from terrafs.abc import BlockDevice, DeviceFile, ObjectStore
from terrafs.active import ActiveConfig, ActiveFile
from terrafs.active_layout import encode_active_header
from terrafs.blocks import Codec
from terrafs.cache import BlockCache
from terrafs.catalog_ops import commit
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import (
    FileCorruptionError,
    CatalogConflictError,
    FileNotFoundInDeviceError,
    FileStateError,
    InodeNotFoundError,
    MirrorError,
    TerrafsError,
)
from terrafs.failpoints import failpoint
from terrafs.params import new_params
from terrafs.entropy import SYSTEM, Entropy
from terrafs.ranges import RangeAllocator
from terrafs.records import (
    FILE_PREFIX,
    FileRecord,
    FileState,
    FileTier,
    active_name,
    file_key,
    object_key,
    parse_name,
)
from terrafs.sealed import SealedFile, SealedWriter

log = logging.getLogger("terrafs.fs")
Extra = Callable[["FileRecord"], tuple[Sequence[Check], Sequence[Op]]]
STAGING = "staging"
_UPLOAD_CHUNK = 8 << 20


@dataclass(frozen=True)
class Built:
    """A sealed file built and uploaded but not yet published (``TerrascaleFS.build_sealed``)."""

    rec: FileRecord  # as it will be published (SEALED)
    entry: Entry  # its BUILDING row, checked by the publish


@dataclass(frozen=True)
class FsConfig:
    node_id: str = "n1"
    active_block_size: int = 64 * 1024
    sealed_block_size: int = 32 * 1024
    page_size: int = 4096  # flush groups end on a device-page boundary
    active_codec: Codec = Codec.NONE  # zstd runs ~160 MB/s here: too slow for the WAL path
    sealed_codec: Codec = Codec.ZSTD  # compressed in the background while offloading
    flush: ActiveConfig = ActiveConfig()
    cache_memory_bytes: int = 64 << 20
    cache_volatile_bytes: int = 1 << 30


@dataclass
class RecoveryReport:
    reopened: list[int] = field(default_factory=list)
    recreated: list[int] = field(default_factory=list)
    rolled_back: list[int] = field(default_factory=list)
    local_deleted: list[str] = field(default_factory=list)
    pending_offload: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # sealed local files gone (a lost disk), not opened


class TerrascaleFS:
    def __init__(self, catalog: Catalog, block: BlockDevice, volatile: BlockDevice,
                 objects: ObjectStore, *, kek: KeyEncryptionKey | None = None,
                 config: FsConfig = FsConfig(), entropy: Entropy = SYSTEM):
        """``entropy``: this node's ids and random draws (generations, staging names); the
        layers above draw theirs from it too (``rowstore.db.Database``)."""
        self.catalog, self.block, self.volatile, self.objects = catalog, block, volatile, objects
        self.kek, self.cfg, self.entropy = kek, config, entropy
        self.inodes = RangeAllocator(catalog, "fs", 1, 2**32 - 1, rng=entropy.jitter())
        self.cache = BlockCache(config.cache_memory_bytes, volatile, config.cache_volatile_bytes)
        self._active: dict[int, ActiveFile] = {}
        self._sealed: dict[int, SealedFile] = {}
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)

    # -- lifecycle ---------------------------------------------------------------

    async def open(self) -> RecoveryReport:
        """Initialise the inode table, empty the volatile areas, recover this node's files."""
        await self.inodes.init()
        await self.cache.open(self.entropy.token(8))
        await self.volatile.delete_files(await self.volatile.list(STAGING + "/"))
        return await self.recover()

    async def close(self) -> None:
        errors: list[Exception] = []
        for af in list(self._active.values()):
            try:
                await af.close()
            except Exception as e:  # noqa: BLE001 - report every failed close, not just the first
                errors.append(e)
        self._active.clear()
        self._sealed.clear()
        await self.cache.close()
        if errors:
            raise errors[0]

    # -- namespace ---------------------------------------------------------------

    async def stat(self, inode: int) -> FileRecord:
        e = await self.catalog.get(file_key(inode))
        if e is None:
            raise InodeNotFoundError(f"no file with inode {inode}")
        return FileRecord.from_bytes(e.value)

    async def list(self, owner: str | None = None) -> list[FileRecord]:
        recs = [FileRecord.from_bytes(e.value) for e in await self.catalog.scan(FILE_PREFIX)]
        return [r for r in recs if owner is None or r.owner == owner]

    def _new_record(self, inode: int, state: FileState, tier: FileTier, codec: Codec) -> FileRecord:
        gen = self.entropy.bits(63)
        loc = active_name(inode, gen) if tier == FileTier.BLOCK else object_key(inode, gen)
        return FileRecord(inode, gen, state, tier, self.cfg.node_id, loc, codec, self.kek is not None)

    async def _allocate(self, state: FileState, tier: FileTier, codec: Codec,
                        extra: Extra | None = None) -> FileRecord:
        made: dict[int, FileRecord] = {}

        def ops(inode: int) -> tuple[list[Check], list[Op]]:
            made[inode] = rec = self._new_record(inode, state, tier, codec)
            ec, eo = extra(rec) if extra else ((), ())
            return [Check(rec.key, 0), *ec], [Put(rec.key, rec.to_bytes()), *eo]

        return made[await self.inodes.allocate(ops)]

    async def create(self, codec: Codec | None = None, extra: Extra | None = None) -> ActiveFile:
        """A new active file owned by this node: catalog row first, then the local file.

        ``extra(record)`` adds checks/ops to the creating transaction (the row
        store names the file in its segment row this way, atomically).
        """
        codec = self.cfg.active_codec if codec is None else codec
        rec = await self._allocate(FileState.ACTIVE, FileTier.BLOCK, codec, extra)
        failpoint("create.after_catalog")
        af = await self._create_local(rec)
        self._active[rec.inode] = af
        return af

    async def _create_local(self, rec: FileRecord) -> ActiveFile:
        params = new_params(rec.inode, rec.gen, codec=rec.codec, block_size=self.cfg.active_block_size,
                            page_size=self.cfg.page_size, kek=self.kek)
        return await ActiveFile.create(self.block, rec.location, params, self.kek, self.cfg.flush, self.cache)

    async def open_active(self, inode: int) -> ActiveFile:
        """The open handle of a local (block-tier) file, recovering it on first use."""
        if inode in self._active:
            return self._active[inode]
        rec = await self.stat(inode)
        if rec.tier != FileTier.BLOCK or rec.owner != self.cfg.node_id:
            raise FileStateError(f"inode {inode} is not a local file of node {self.cfg.node_id}")
        try:
            af = await ActiveFile.recover(self.block, rec.location, self.kek, self.cfg.flush, cache=self.cache)
        except FileNotFoundInDeviceError:
            if rec.state != FileState.ACTIVE:
                raise
            # Its creation failed after the catalog row (a disk error, a full device): nothing
            # was ever appended to it — exactly as a restart finds it (``_recover_one``).
            log.warning("event=active_file_never_created inode=%d location=%s", inode, rec.location)
            self._active[inode] = af = await self._create_local(rec)
            return af
        except FileCorruptionError:
            if rec.state != FileState.ACTIVE or not await self._header_unwritten(rec):
                raise
            # Its header never became durable (a crash or a full device right after the file
            # was created): nothing was ever appended to it, so a new empty file is exact.
            log.warning("event=active_header_unwritten inode=%d location=%s", inode, rec.location)
            await self.block.delete(rec.location)
            self._active[inode] = af = await self._create_local(rec)
            return af
        if rec.state == FileState.SEALED:
            await af.seal()
        self._active[inode] = af
        return af

    async def _header_unwritten(self, rec: FileRecord) -> bool:
        """Whether ``rec``'s local file holds no header (appends come after it): shorter than
        one, or zeros where it goes (a log-device file is whole zeroed extents after a reopen)."""
        params = new_params(rec.inode, rec.gen, codec=rec.codec, block_size=self.cfg.active_block_size,
                            page_size=self.cfg.page_size, kek=self.kek)
        need = len(encode_active_header(params))
        f = await self.block.open(rec.location)
        try:
            got = await f.pread(0, need)
        finally:
            await f.close()
        return len(got) < need or not any(got)

    async def reopen_failed(self, af: ActiveFile) -> ActiveFile:
        """A file whose write group failed (at the device, or refused by its mirror), cut back
        to its last durable group and recovered from the device: what it holds is then exactly
        what was acknowledged, and it takes appends again. Raises, the file left as it is,
        while the device still fails. ``af`` may be closed already — an earlier reopen closed
        it and then failed (its catalog unreachable), or a close could not cut it back: it is
        cut back through a new handle then (simulation seed 136398: the cut through the closed
        handle failed at every promotion, and its partition never had a leader again)."""
        if af.closed:
            live = self._active.get(af.inode)
            if live is not None and not live.closed:  # reopened since: that handle recovered what is durable
                return live if live.failure is None else await self.reopen_failed(live)
            if live is not None:  # a closed handle still held for it (``af`` itself, say): forgotten, or it
                del self._active[af.inode]  # was reopened through itself for ever (simulation seed 979)
            f = await self.block.open((await self.stat(af.inode)).location)
            try:
                await af.cut_back(through=f)
            finally:
                await f.close()
            return await self.open_active(af.inode)
        await af.cut_back()
        await self.close_active(af.inode)
        return await self.open_active(af.inode)

    def failing(self) -> builtins.list[int]:
        """Inodes of open files whose last write failed at the device (full, or a disk error)."""
        return [i for i, af in self._active.items()
                if af.failure is not None and not isinstance(af.failure, MirrorError)]

    async def close_active(self, inode: int) -> None:
        """Close a local file's open handle (its bytes stay); the next ``open_active`` recovers
        it from the device — after a failed flush, what is durable there is what counts."""
        af = self._active.pop(inode, None)
        if af is not None:
            try:
                await af.close()
            except TerrafsError as e:  # a failed file: closing cannot flush; its bytes are what they are
                log.info("event=close_failed_file inode=%d error=%r", inode, e)

    # -- seal and offload --------------------------------------------------------

    async def seal(self, inode: int, extra: Extra | None = None) -> FileRecord:
        """Make an active file immutable (it stays on the block device until offload).

        ``extra(new_record)`` adds checks/ops to the same catalog transaction.
        """
        async with self._locks[inode]:
            e = await self._entry(inode)
            rec = FileRecord.from_bytes(e.value)
            if rec.state == FileState.SEALED:
                return rec
            if rec.state != FileState.ACTIVE:
                raise FileStateError(f"inode {inode} is {rec.state.value}; cannot seal")
            af = await self.open_active(inode)
            await af.seal()
            new = rec.evolve(state=FileState.SEALED, size=af.durable_size)
            await self._switch(e, new, extra)
            return new

    async def offload(self, inode: int, content: AsyncIterable[bytes] | None = None,
                      extra: Extra | None = None, block_size: int | None = None) -> FileRecord:
        """Rewrite a sealed local file as an object, switch the catalog, drop the local file.

        ``content`` replaces the file's bytes in the object (the row store drops
        its write-ahead bookkeeping this way); by default the bytes are copied.
        ``extra(new_record)`` adds checks/ops to the switching transaction; ``block_size``
        replaces ``sealed_block_size`` for this object (a columnar segment's pages).
        """
        async with self._locks[inode]:
            e = await self._entry(inode)
            rec = FileRecord.from_bytes(e.value)
            if rec.tier == FileTier.OBJECT:
                return rec
            if rec.state != FileState.SEALED:
                raise FileStateError(f"inode {inode} is {rec.state.value}; seal it before offload")
            af = await self.open_active(inode)
            src = content if content is not None else _bytes_of(af.scan())
            key, size, logical = await self._build_and_upload(rec, src, block_size)
            new = rec.evolve(tier=FileTier.OBJECT, location=key, object_size=size, size=logical,
                             codec=self.cfg.sealed_codec)
            await self._switch(e, new, extra)
            failpoint("offload.after_catalog")
            await self._drop_local(inode, rec.location)
            log.info("event=offloaded inode=%d object=%s bytes=%d logical=%d", inode, key, size, logical)
            return new

    async def create_sealed(self, content: AsyncIterable[bytes], extra: Extra | None = None,
                            block_size: int | None = None) -> FileRecord:
        """Build a sealed file straight from a stream (no active phase).

        ``extra(record)`` joins the transaction that publishes the file, so a
        caller's reference to it (an index manifest, say) appears atomically with it.
        """
        return await self.publish_built(await self.build_sealed(content, block_size), extra)

    async def build_sealed(self, content: AsyncIterable[bytes], block_size: int | None = None) -> Built:
        """The first half of :meth:`create_sealed`: the object built and uploaded, its file row
        ``BUILDING`` (a restart rolls it back). A caller that must not hold a lock while the
        bytes go up (an index merge) builds first and publishes under its lock."""
        rec = await self._allocate(FileState.BUILDING, FileTier.OBJECT, self.cfg.sealed_codec)
        e = await self._entry(rec.inode)
        _, size, logical = await self._build_and_upload(rec, content, block_size)
        return Built(rec.evolve(state=FileState.SEALED, object_size=size, size=logical), e)

    async def publish_built(self, built: Built, extra: Extra | None = None) -> FileRecord:
        """The second half: the file row turns ``SEALED`` in one transaction with ``extra``'s.
        CatalogConflictError when a check of ``extra`` fails (the file is then still built)."""
        await self._switch(built.entry, built.rec, extra)
        return built.rec

    async def discard_built(self, built: Built) -> None:
        """A built file that will not be published: its row and object go, as a restart's
        recovery would roll them back."""
        await self.inodes.free(built.rec.inode, [Check(built.entry.key, built.entry.version)],
                               [Delete(built.entry.key)])
        await self.objects.delete(built.rec.location)

    async def _build_and_upload(self, rec: FileRecord, content: AsyncIterable[bytes],
                                block_size: int | None = None) -> tuple[str, int, int]:
        """Write the sealed object on the volatile device's staging area, then upload it."""
        params = new_params(rec.inode, rec.gen, codec=self.cfg.sealed_codec,
                            block_size=block_size or self.cfg.sealed_block_size, kek=self.kek)
        name = f"{STAGING}/{rec.inode:08x}-{self.entropy.token()}"
        out = await self.volatile.create(name)
        try:
            w = SealedWriter(out, params, self.kek)
            async for chunk in content:
                await w.write(chunk)
            size = await w.finish()
            failpoint("offload.before_upload")
            key = object_key(rec.inode, rec.gen)
            await self.objects.put_stream(key, _read_chunks(out, size))
            failpoint("offload.after_upload")
            return key, size, w.logical_size
        finally:
            await out.close()
            await self.volatile.delete(name)

    async def _entry(self, inode: int) -> Entry:
        e = await self.catalog.get(file_key(inode))
        if e is None:
            raise InodeNotFoundError(f"no file with inode {inode}")
        return e

    async def _switch(self, e: Entry, new: FileRecord, extra: Extra | None = None) -> None:
        ec, eo = extra(new) if extra else ((), ())
        res = await commit(self.catalog, [Check(e.key, e.version), *ec], [Put(e.key, new.to_bytes()), *eo])
        if not res.committed:
            raise CatalogConflictError(f"inode {new.inode} changed concurrently")

    async def _drop_local(self, inode: int, name: str) -> None:
        af = self._active.pop(inode, None)
        if af is not None:
            await af.close()
        try:
            await self.block.delete(name)
        except FileNotFoundInDeviceError:
            pass

    # -- reads -------------------------------------------------------------------

    async def open_sealed(self, inode: int) -> SealedFile:
        """The object of a sealed file. Inodes are reused once a file is deleted (by any node),
        so a cached object is returned only while the file row still names it."""
        rec = await self.stat(inode)
        sf = self._sealed.get(inode)
        if sf is not None and sf.key == rec.location:
            return sf
        if rec.tier != FileTier.OBJECT or rec.state != FileState.SEALED:
            raise FileStateError(f"inode {inode} is not an offloaded sealed file")
        sf = await SealedFile.open(self.objects, rec.location, object_size=rec.object_size,
                                   kek=self.kek, cache=self.cache)
        self._sealed[inode] = sf
        return sf

    async def read(self, inode: int, offset: int, length: int) -> bytes:
        """Read logical bytes from any file: local active/sealed, or an offloaded object."""
        if inode in self._active:
            return await self._active[inode].read(offset, length)
        if inode in self._sealed:
            return await self._sealed[inode].read(offset, length)
        rec = await self.stat(inode)
        if rec.tier == FileTier.BLOCK:
            return await (await self.open_active(inode)).read(offset, length)
        return await (await self.open_sealed(inode)).read(offset, length)

    # -- delete and recovery -----------------------------------------------------

    async def delete(self, inode: int, checks: Sequence[Check] = (), ops: Sequence[Op] = ()) -> int:
        """Remove the row and recycle the inode in one transaction (with the caller's
        checks/ops; CatalogConflictError when one of those fails), then the bytes. Returns the
        transaction's revision (the version of whatever the caller's ops wrote)."""
        async with self._locks[inode]:
            e = await self._entry(inode)
            rec = FileRecord.from_bytes(e.value)
            revision = await self.inodes.free(inode, [Check(e.key, e.version), *checks], [Delete(e.key), *ops])
            failpoint("delete.after_catalog")
            await self._remove_bytes(rec)
        self._locks.pop(inode, None)
        return revision

    async def _remove_bytes(self, rec: FileRecord) -> None:
        if rec.tier == FileTier.BLOCK:
            await self._drop_local(rec.inode, rec.location)
        else:
            self._sealed.pop(rec.inode, None)
            self.cache.forget_object(rec.location)
            await self.objects.delete(rec.location)

    async def recover(self) -> RecoveryReport:
        """Finish or roll back whatever a crash interrupted on this node."""
        rep = RecoveryReport()
        mine = await self.list(owner=self.cfg.node_id)
        wanted = {r.location for r in mine if r.tier == FileTier.BLOCK}
        for name in await self.block.list("files/"):
            if name not in wanted and parse_name(name) is not None:
                await self.block.delete(name)  # offloaded, deleted, or never recorded
                rep.local_deleted.append(name)
        for rec in mine:
            await self._recover_one(rec, rep)
        return rep

    async def _recover_one(self, rec: FileRecord, rep: RecoveryReport) -> None:
        if rec.state == FileState.BUILDING:  # the stream build never finished: roll back
            e = await self._entry(rec.inode)
            await self.inodes.free(rec.inode, [Check(e.key, e.version)], [Delete(e.key)])
            await self.objects.delete(rec.location)
            rep.rolled_back.append(rec.inode)
            return
        if rec.tier != FileTier.BLOCK:
            return
        if not await self.block.exists(rec.location):
            if rec.state != FileState.ACTIVE:
                # Lost with the block device. Fatal unless another node holds a copy of its
                # bytes (a replicated partition's segment): the caller decides (``missing``).
                log.warning("event=local_file_missing inode=%d location=%s", rec.inode, rec.location)
                rep.missing.append(rec.inode)
                return
            # Crash between the catalog row and the file's creation: nothing was
            # ever appended (appends need the open file), so an empty file is exact.
            self._active[rec.inode] = await self._create_local(rec)
            rep.recreated.append(rec.inode)
            return
        await self.open_active(rec.inode)
        rep.reopened.append(rec.inode)
        if rec.state == FileState.SEALED:
            rep.pending_offload.append(rec.inode)

async def _bytes_of(blocks: AsyncIterator[tuple[int, bytes]]) -> AsyncIterator[bytes]:
    async for _, data in blocks:
        yield data


async def _read_chunks(f: DeviceFile, size: int) -> AsyncIterator[bytes]:
    for off in range(0, size, _UPLOAD_CHUNK):
        yield await f.pread(off, min(_UPLOAD_CHUNK, size - off))
