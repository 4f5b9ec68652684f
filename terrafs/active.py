"""Active files: append-only, single writer, on a block device, with group commit.

Format: docs/format/terrafs.md §2. An append waits in a flush buffer; a flush
happens when the buffer holds ``flush_bytes`` or ``flush_ms`` after its first
waiter, and writes every waiting append as one write group with one write
and one fdatasync. Appends return only after that fdatasync.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from typing import AsyncIterator, Awaitable, Callable, TypedDict, cast

import numpy as np
import numpy.typing as npt

from terrafs.abc import BlockDevice, Buffer, DeviceFile, InPlaceFile
from terrafs.blocks import (
    HEADER_LEN,
    Codec,
    decode_payload,
    read_run,
    encode_block_parts,
    encode_pad,
    parse_header,
)
from terrafs.cache import BlockCache
from terrafs.crypto import DataCipher, KeyEncryptionKey
from terrafs.gather import read_ranges
from terrafs.errors import (ClosedError, FileStateError, MirrorError, NoSpaceError, StorageIOError, failed_error,
                            no_space)
from terrafs.iopool import run_io
from terrafs.params import FileParams
from terrafs.active_recovery import GroupRecovery
from terrafs.active_layout import (ActiveConfig as ActiveConfig, BlockIndex, cut_blocks,
                                   decode_active_header, encode_active_header)

log = logging.getLogger("terrafs.active")
# ``await mirror(logical, buffers)``: a group shipped to the followers (see ActiveFile.mirror)
Mirror = Callable[[int, list[bytes | memoryview]], Awaitable[None]]
DEFAULT_CONFIG = ActiveConfig()  # frozen: one shared default

_SCAN_RUN = 4 << 20  # bytes of blocks a scan reads at once
_RECENT_BLOCKS = 256  # decoded blocks kept per open active file (16 MiB at 64 KiB)
# Zero bytes kept ahead of the next group on local disks (docs/format/terrafs.md §2): a group
# that grows the file carries zeros up to the first multiple of PREALLOC at least PREALLOC
# past its end, so the groups after it are written in place and their fdatasync skips the
# metadata journal commit. Not part of the format: recovery accepts any amount of zeros.
PREALLOC = 1 << 20
PREALLOC_BELOW = 64 << 10  # only groups smaller than this carry zeros (see the format doc)
# b"\0" * n writes the zeros; bytes(n) would be calloc'd pages that fault on every read
# (a write from them ran 10x slower here).
_ZEROS = memoryview(b"\0" * (2 * PREALLOC))
# A lazy append (nobody waits on it) is flushed at the latest this long after it came, if
# no other flush took it along first; with the short timer the COMMIT records of a
# two-phase commit each cost an fdatasync of their own between the writer's batches.
LAZY_S = 0.05


class _BlockArgs(TypedDict):
    """The keywords every block of one group is encoded with (``encode_block_parts``)."""

    logical_off: int
    group: int
    codec: Codec
    cipher: DataCipher | None
    inode: int


class ActiveFile(GroupRecovery):
    """An open active file. Create with :meth:`create`, reopen with :meth:`recover`."""

    def __init__(self, f: DeviceFile, params: FileParams, cipher: DataCipher | None,
                 header_len: int, cfg: ActiveConfig, where: str, cache: BlockCache | None = None):
        self._f = f
        self.params = params
        self._cipher = cipher
        self._cfg = cfg
        self.where = where
        self.index = BlockIndex()
        self.durable_size = 0  # logical bytes made durable
        self._physical_end = header_len  # end of the last durable group
        self._alloc_end = header_len  # end of the file: groups, then preallocated zeros
        self._in_place = hasattr(f, "writev_sync") and hasattr(f, "fdatasync_sync")  # local disks
        self._group = 0  # last group written
        self._end = 0  # logical end including pending appends
        self._pending: list[bytes | memoryview] = []
        self._pending_bytes = 0
        self._futs: list[asyncio.Future[None]] = []
        self._timer: asyncio.Task[None] | None = None  # a flush due later (see _kick_after)
        self._timer_lazy = False  # the timer is the long one of lazy appends
        self._want_flush = False
        self._flush_task: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._sealed = False
        self._closed = False
        self._read_only = False
        self._recent: OrderedDict[int, bytes] = OrderedDict()  # decoded blocks, for point reads
        self.cache = cache  # a shared BlockCache (memory tier) replaces _recent when given
        self.torn_tail: tuple[int, int] | None = None  # (offset, bytes) cut or found at recovery
        self.mirror: Mirror | None = None  # the file's groups are shipped from ``mirror_to`` on
        # flush_s: time spent writing + fdatasyncing groups; wait_s: appenders' total wait
        self.stats = {"flushes": 0, "flushed_bytes": 0, "appends": 0, "flush_s": 0.0, "wait_s": 0.0}

    def mirror_to(self, mirror: Mirror) -> None:
        """Ship every later group to the followers (docs/format/replication.md): ``await
        mirror(logical, buffers)`` returns once a majority holds the group, which counts as
        durable (readable, its appends return) only when both that and the local write are
        done. A file starts being mirrored when its partition's leader registers it."""
        self.mirror = mirror

    @property
    def inode(self) -> int:
        return self.params.inode

    @classmethod
    async def create(cls, dev: BlockDevice, name: str, params: FileParams, kek: KeyEncryptionKey | None,
                     cfg: ActiveConfig = DEFAULT_CONFIG, cache: BlockCache | None = None) -> "ActiveFile":
        """Create the file with its header, durable (with the directory) on return."""
        where = f"{dev.uri}/{name}"
        cipher = params.cipher(kek, where)
        try:
            f = await dev.create(name)
        except OSError as e:
            raise no_space(e) or StorageIOError(f"{where}: cannot create the file: {e}") from e
        head = encode_active_header(params)
        af = cls(f, params, cipher, len(head), cfg, where, cache)
        try:
            await f.append(head)
            await f.sync()
        except BaseException as e:
            full = no_space(e)
            if full is None:
                await f.close()
                if isinstance(e, OSError):
                    raise StorageIOError(f"{where}: cannot write the file's header: {e}") from e
                raise
            # A full device: the file exists without its header. It fails like after a group
            # that hit the full device, and is born again when it is revived (open_active
            # recreates a file whose header never became durable).
            af._failed, af._physical_end = full, 0
        return af

    @classmethod
    async def recover(cls, dev: BlockDevice, name: str, kek: KeyEncryptionKey | None,
                      cfg: ActiveConfig = DEFAULT_CONFIG, *, read_only: bool = False,
                      cache: BlockCache | None = None) -> "ActiveFile":
        """Open after a restart: verify every group, cut a torn tail, build the index.

        ``read_only`` (fsck) reports a torn tail in ``torn_tail`` instead of cutting it.
        """
        where = f"{dev.uri}/{name}"
        f = await dev.open(name)
        try:
            params, hlen = decode_active_header(await f.pread(0, 64 * 1024), where)
            af = cls(f, params, params.cipher(kek, where), hlen, cfg, where, cache)
            af._read_only = read_only
            await af._recover_groups()
        except BaseException:
            await f.close()
            raise
        return af

    # -- appends -----------------------------------------------------------------

    async def append(self, data: Buffer | list[Buffer], lazy: bool = False) -> int:
        """Append ``data`` (bytes, or a list of buffers written one after the other, which
        the caller leaves unchanged); return its logical offset once it is durable.

        ``lazy``: do not start a flush for this append (it rides with the next one, or a
        flush ``LAZY_S`` later) — for records nobody waits on, such as a two-phase commit's
        COMMIT: a writer's next batch usually comes sooner and carries it for free."""
        self._check_writable()
        parts = [memoryview(b).cast("B") for b in data] if isinstance(data, list) else [bytes(data)]
        size = sum(len(b) for b in parts)
        if not size:
            await self.flush()
            return self._end
        off = self._end
        self._end += size
        self._pending.extend(parts)
        self._pending_bytes += size
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._futs.append(fut)
        self.stats["appends"] += 1
        idle = self._flush_task is None or self._flush_task.done()
        if self._pending_bytes >= self._cfg.flush_bytes or (self._cfg.eager and idle and not lazy):
            self._kick()
        elif not self._want_flush and (self._timer is None or (self._timer_lazy and not lazy)):
            if self._timer is not None:
                self._timer.cancel()
            wait = max(self._cfg.flush_ms / 1000, LAZY_S) if lazy else self._cfg.flush_ms / 1000
            self._timer, self._timer_lazy = asyncio.ensure_future(self._kick_after(wait)), lazy
        t0 = time.perf_counter()
        try:
            await fut
        finally:
            self.stats["wait_s"] += time.perf_counter() - t0
        return off

    async def flush(self) -> None:
        """Make every append so far durable now (raises once a group failed)."""
        while True:
            if isinstance(self._failed, NoSpaceError):
                raise NoSpaceError(f"{self.where}: {self._failed}")
            if self._failed is not None:
                raise failed_error(f"{self.where}: an earlier flush failed", self._failed)
            if self._pending:
                self._kick()
            task = self._flush_task
            if task is None or task.done():
                if not self._pending:
                    return
                continue
            await asyncio.shield(task)

    def _check_writable(self) -> None:
        if self._closed:
            raise ClosedError(f"{self.where} is closed")
        if self._sealed:
            raise FileStateError(f"{self.where} is sealed; appends are not allowed")
        if isinstance(self._failed, MirrorError):
            raise self._failed
        if isinstance(self._failed, NoSpaceError):
            raise NoSpaceError(f"{self.where}: {self._failed}")
        if self._failed is not None:
            # After a failed fdatasync the page cache can no longer be trusted
            # (the "fsyncgate" lesson): refuse further writes; reopen recovers.
            raise failed_error(f"{self.where}: an earlier flush failed", self._failed)

    async def _kick_after(self, wait: float) -> None:
        """A flush ``wait`` seconds from now. A sleeping task rather than a loop timer: when
        a loop shuts down with the file left open, asyncio cancels the task, while a timer
        firing during the shutdown would start a flush task that never runs."""
        await asyncio.sleep(wait)
        self._timer = None
        self._kick()

    def _kick(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._want_flush = True
        if self._flush_task is None or self._flush_task.done():
            self._flush_task = asyncio.ensure_future(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._want_flush and self._pending:
            self._want_flush = False
            batch, futs = self._pending, self._futs
            self._pending, self._futs, self._pending_bytes = [], [], 0
            try:
                await self._write_group(batch)
            except BaseException as e:  # noqa: BLE001 - the file can no longer be trusted: every later append fails with it
                e = no_space(e) or e
                self._failed = e
                for fu in futs + self._futs:
                    if not fu.done():
                        fu.set_exception(e if isinstance(e, (MirrorError, NoSpaceError)) else
                                         failed_error(f"{self.where}: flush failed", e))
                self._pending, self._futs = [], []
                return
            for fu in futs:
                if not fu.done():
                    fu.set_result(None)
            if self._pending and (self._cfg.eager or self._pending_bytes >= self._cfg.flush_bytes):
                self._want_flush = True  # the device is idle again: take what gathered

    async def _write_group(self, batch: list[bytes | memoryview]) -> None:
        group, logical = self._group + 1, self.durable_size
        entries: list[tuple[int, int, int]] = []
        t0 = time.perf_counter()
        mirrored = None if self.mirror is None else asyncio.ensure_future(self.mirror(logical, batch))
        try:
            # Encode, write and fdatasync in one worker-thread hop.
            if self._in_place:
                phys = self._physical_end
                args = (batch, group, phys, logical, entries)
                if hasattr(self._f, "in_round"):  # the log device: every file's group in one hop
                    n, self._alloc_end = await self._f.in_round(functools.partial(self._write_in_place, *args,
                                                                                   sync=False))
                else:
                    n, self._alloc_end = await run_io(self._write_in_place, *args)
            else:
                phys, n = await self._f.append_durable(
                    lambda phys: self._encode_group(batch, group, phys, logical, entries))
        except BaseException:
            if mirrored is not None:
                mirrored.cancel()
            raise
        if mirrored is not None:
            await mirrored  # a majority holds the group (or MirrorError: this node was fenced)
        for e in entries:
            self.index.add(*e)
        self._group = group
        self._physical_end = phys + n
        self.durable_size += sum(len(b) for b in batch)
        self.stats["flushes"] += 1
        self.stats["flushed_bytes"] += n
        self.stats["flush_s"] += time.perf_counter() - t0

    def _write_in_place(self, batch: list[bytes | memoryview], group: int, phys: int, logical: int,
                        entries: list[tuple[int, int, int]], sync: bool = True) -> tuple[int, int]:
        """Worker thread: write the group at ``phys`` (with zeros ahead when it grows the file)
        and fdatasync (unless the device's round flushes it); returns (group bytes, new end of
        the file)."""
        parts = self._encode_group(batch, group, phys, logical, entries)
        n = sum(len(p) for p in parts)
        end, alloc = phys + n, self._alloc_end
        if end > alloc and n < PREALLOC_BELOW and not getattr(self._f, "preallocated", False):
            alloc = -(-(end + PREALLOC) // PREALLOC) * PREALLOC
            parts.append(_ZEROS[: alloc - end])
        f = cast(InPlaceFile, self._f)  # _in_place: it has both methods (see __init__)
        f.writev_sync(parts, phys)
        if sync:
            f.fdatasync_sync()
        return n, max(alloc, end)

    def _encode_group(self, batch: list[bytes | memoryview], group: int, phys: int, logical: int,
                      entries: list[tuple[int, int, int]]) -> list[Buffer]:
        """The buffers of one write group starting at physical ``phys`` (worker thread).

        Blocks are cut across append boundaries without joining the appends;
        ``entries`` receives (logical, physical, raw_len) of each data block.
        """
        p, pos = self.params, phys
        parts: list[Buffer] = []
        blocks = list(cut_blocks(batch, p.block_size))
        for i, (pieces, n) in enumerate(blocks):
            last = i == len(blocks) - 1
            kw: _BlockArgs = dict(logical_off=logical, group=group, codec=p.codec, cipher=self._cipher, inode=p.inode)
            mark = len(parts)
            rec = encode_block_parts(parts, pieces, n, end=last and p.page_size == 0, **kw)
            if last and p.page_size:
                gap = -(pos + rec) % p.page_size
                if gap == 0:  # lands on a page boundary: re-encode the last block with END
                    del parts[mark:]
                    rec = encode_block_parts(parts, pieces, n, end=True, **kw)
                else:
                    pad = bytearray()
                    encode_pad(pad, logical_off=logical + n, group=group,
                               pad_len=gap if gap >= HEADER_LEN else gap + p.page_size)
                    parts.append(pad)
            entries.append((logical, pos, n))
            pos += rec
            logical += n
        return parts

    # -- reads -------------------------------------------------------------------

    def read_cached(self, offset: int, length: int) -> bytes | None:
        """``read`` without I/O: the bytes if they lie in one block the memory cache holds,
        else None (a point read's fast path: no coroutine, no thread)."""
        if self._closed or self.cache is None or offset + length > self.durable_size:
            return None
        i = self.index.find(offset)
        if i < 0:
            return None
        block = self.cache.get_mem((self.where, i))
        lo = offset - self.index.starts[i]
        if block is None or lo + length > len(block):
            return None
        return block[lo : lo + length]

    async def read(self, offset: int, length: int) -> bytes:
        """Read durable logical bytes ``[offset, offset + length)`` (short at the end)."""
        if self._closed:
            raise ClosedError(f"{self.where} is closed")
        end = min(offset + length, self.durable_size)
        parts = []
        i = self.index.find(offset)
        while offset < end and i < self.index.n:
            block = await self._read_block(i)
            lo = offset - int(self.index.logical[i])
            take = block[lo : lo + (end - offset)]
            parts.append(take)
            offset += len(take)
            i += 1
        return b"".join(parts)

    async def read_ranges(self, offsets: np.ndarray,
                          lengths: np.ndarray) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """Many durable ranges at once (a row store's multi-row get): every block touched
        is fetched once, and the ranges come back inside one buffer with their starts."""
        if self._closed:
            raise ClosedError(f"{self.where} is closed")

        async def fetch(blocks: list[int]) -> dict[int, bytes]:
            got: dict[int, bytes] = {}
            if self.cache is not None:
                got = {i: b for (_, i), b in self.cache.get_mem_many([(self.where, i) for i in blocks]).items()}
            for i in set(blocks).difference(got):
                got[i] = await self._read_block(i)
            return got

        return await read_ranges(self.index.logical[: self.index.n], self.durable_size, offsets, lengths, fetch)

    async def _read_block(self, i: int) -> bytes:
        """Decoded block ``i``; blocks never change once durable, so recent ones are kept."""
        hit = self._kept(i)
        if hit is None:
            hit = await self._load_block(i)
            self._keep(i, hit)
        return hit

    def _kept(self, i: int) -> bytes | None:
        if self.cache is not None:
            return self.cache.get_mem((self.where, i))
        hit = self._recent.get(i)
        if hit is not None:
            self._recent.move_to_end(i)
        return hit

    def _keep(self, i: int, data: bytes) -> None:
        if self.cache is not None:
            self.cache.put_mem((self.where, i), data)
            return
        self._recent[i] = data
        if len(self._recent) > _RECENT_BLOCKS:
            self._recent.popitem(last=False)

    async def _load_block(self, i: int) -> bytes:
        phys = int(self.index.physical[i])
        head = await self._f.pread(phys, HEADER_LEN)
        h = parse_header(head, 0, self.where)
        payload = await self._f.pread(phys + HEADER_LEN, h.stored_len)
        return decode_payload(h, payload, cipher=self._cipher, inode=self.inode,
                              where=self.where, pos=phys)

    async def scan(self, start: int = 0) -> AsyncIterator[tuple[int, bytes]]:
        """Yield ``(logical_offset, bytes)`` per block from ``start`` to the durable end. Blocks
        not kept are read a run at a time (one read, decoded in one worker-thread hop): a
        recovery or a promotion replays a segment without two loop hops per block."""
        i, phys = max(self.index.find(start), 0), self.index.physical
        while i < self.index.n:
            j, hit = i + 1, self._kept(i)
            while hit is None and j < self.index.n and int(phys[j] - phys[i]) < _SCAN_RUN and self._kept(j) is None:
                j += 1  # a run of blocks not kept, starting within _SCAN_RUN bytes
            for k, data in zip(range(i, j), [hit] if hit is not None else await self._load_run(i, j)):
                lo = int(self.index.logical[k])
                if lo + len(data) > start:
                    cut = max(start - lo, 0)
                    yield lo + cut, data[cut:]
            i = j

    async def _load_run(self, i: int, j: int) -> list[bytes]:
        got = await read_run(self._f, self.index.physical[i:j], int(self.index.physical[j]) if j < self.index.n
                             else None, cipher=self._cipher, inode=self.inode, where=self.where)
        for k, data in zip(range(i, j), got):
            self._keep(k, data)
        return got

    # -- lifecycle ---------------------------------------------------------------

    async def seal(self) -> None:
        """Flush and refuse further appends (the catalog switch is the caller's)."""
        await self.flush()
        self._sealed = True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def unflushed(self) -> int:
        """Bytes appended and not (yet, or after a failed group: ever) durable."""
        return self._end - self.durable_size

    @property
    def failure(self) -> BaseException | None:
        """Why the file takes no more appends after a failed group, or None."""
        return self._failed

    async def close(self) -> None:
        """Flush what is pending, then close. A file whose group failed at the device (full,
        or a disk error) is first cut back to the end of its last durable group: whoever opens
        it next finds exactly what was acknowledged (a group written whole but not synced
        would otherwise look durable; after a failed fdatasync the page cache is not to be
        trusted either). Raises StorageIOError when the device still fails the cut."""
        if self._closed:
            return
        try:
            if self._failed is None and not self._sealed:
                await self.flush()
            elif self._failed is not None and not isinstance(self._failed, MirrorError):
                await self.cut_back()
        finally:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            await self._f.close()
