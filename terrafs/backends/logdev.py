"""The log device: a node's active files as extent chains of one preallocated file, so that one
``fdatasync`` makes every group written before it durable, whatever its file (RFC 0011).

Format, invariants and the reasoning behind each write's order: docs/format/logdev.md. Every
constant marked "format" is part of it; never change one, add a version.

Blocking work runs in the I/O threads (``terrafs.iopool``); the device's structures (chains,
the free list, the header counter) are guarded by one lock, and flushes are a group commit
at the device: a thread needing its writes durable waits for the flush in flight when that
one started after them, or starts the next.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import functools
import os
import threading
from typing import Callable, Sequence, TypeVar

from catalog.fsutil import fsync_dir
from terrafs.abc import BlockDevice, Buffer, DeviceFile, check_name
from terrafs.backends.logdev_format import (PAGE, MAX_NAME, ZERO_ENDED, Chain, Piece, chains_from, decode_superblock,
                                            encode_header, encode_superblock, parse_header)
from terrafs.errors import (AlreadyExistsError, ClosedError, DeviceError, FileCorruptionError,
                            FileNotFoundInDeviceError, StorageIOError, no_space)
from terrafs.iopool import run_io
from terrafs.rounds import DeviceRounds

EXTENT_SIZE = 1 << 20  # a new device's extent size (each device records its own)
GROW = 16  # extents added at a time
SPARE = GROW  # free extents kept written (zeros) for the next files; the rest go back to the host
_PUNCH = 0x01 | 0x02  # fallocate: FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (Linux)
_ZERO = memoryview(b"\0" * (1 << 20))
T = TypeVar("T")


class LogDevice(BlockDevice):
    """A durable ``BlockDevice`` whose files live in ``path`` (one preallocated file)."""

    durable = True

    def __init__(self, path: str, uri: str | None = None, extent_size: int = EXTENT_SIZE, read_only: bool = False,
                 exact_sizes: bool = True):
        if extent_size % PAGE or extent_size < 64 << 10:
            raise ValueError("extent_size must be a multiple of 4096 and at least 64 KiB")
        self.path = os.path.abspath(path)
        self.uri = uri or f"logdev://{self.path}"
        self._new_extent_size = extent_size
        self.read_only = read_only  # fsck beside a running node: nothing created, freed or written
        # A new device's mode (an existing one keeps its own, from its superblock): with exact
        # sizes each write that grows a file rewrites its last extent's ``used``; without, a
        # reopened file is whole extents, zero past what was written (active files find their
        # own end), and a group costs no header page.
        self.zero_ended = not exact_sizes
        self._fd = -1
        self.extent_size = self.payload = 0
        self._lock = threading.Lock()
        self._chains: dict[str, Chain] = {}
        self._free: list[int] = []  # zero on the disk: handed out in order
        self._holes: set[int] = set()  # free extents given back to the host file system (read as zeros)
        self._count = 0  # extents in the file
        self._seq = 0
        self._opening: asyncio.Future[None] | None = None
        # group commit at the device: writes completed / covered by a finished flush
        self._cv = threading.Condition()
        self._written = self._synced = 0
        self._syncing = False
        self._failed: BaseException | None = None  # the last failed flush's error
        self._suspect = 0  # writes up to this one were covered by a failed flush (see flush_sync)
        self.flushes = 0  # fdatasyncs of the device (tests and metrics count them)
        # every active file's group of a round written and flushed in one thread hop (RFC 0011)
        self.device_rounds = DeviceRounds(self.flush_sync)

    # -- opening -------------------------------------------------------------------

    async def _ready(self) -> None:
        if self._fd >= 0:
            return
        if self._opening is None:
            self._opening = asyncio.ensure_future(run_io(self._open_sync))
        await asyncio.shield(self._opening)

    def _open_sync(self) -> None:
        if not os.path.exists(self.path):
            if self.read_only:  # no device yet: no files (nothing is made by a reader)
                self.extent_size, self.payload = self._new_extent_size, self._new_extent_size - PAGE
                self._fd = os.open(os.devnull, os.O_RDONLY)
                return
            self._create_sync()
        fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        try:
            self._load(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _create_sync(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        tmp = self.path + ".new"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
        try:
            os.pwrite(fd, encode_superblock(ZERO_ENDED if self.zero_ended else 0, self._new_extent_size), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, self.path)
        fsync_dir(os.path.dirname(self.path))

    def _load(self, fd: int) -> None:
        flags, esize = decode_superblock(os.pread(fd, PAGE, 0), self.path)
        self.zero_ended = bool(flags & ZERO_ENDED)
        self.extent_size, self.payload = esize, esize - PAGE
        self._count = (os.fstat(fd).st_size - PAGE) // esize
        pieces: dict[int, dict[int, Piece]] = {}  # file_id -> index -> (extent, seq, used, name)
        for e in range(self._count):
            got = parse_header(os.pread(fd, 512, self._offset(e)), self._offset(e), self.payload, self.path)
            if got is None:
                self._free.append(e)
                continue
            index, file_id, seq, used, name = got
            self._seq = max(self._seq, seq)
            if index in pieces.setdefault(file_id, {}):
                raise FileCorruptionError(self.path, self._offset(e), f"file {file_id:x} has two extents {index}")
            pieces[file_id][index] = (e, seq, used, name)
        self._chains, stray = chains_from(pieces, self.payload, esize, self.path)
        if stray and not self.read_only:
            self._zero_sync(fd, stray)
            os.fdatasync(fd)
            self._free.extend(stray)
        self._free.sort()
        if not self.read_only:
            self._give_back(fd)

    # -- extents -------------------------------------------------------------------

    def _offset(self, extent: int) -> int:
        return PAGE + extent * self.extent_size

    def _write_header(self, chain: Chain, k: int) -> None:
        """Write extent ``k``'s header of ``chain`` as the chain is now (caller holds
        ``chain.lock``, so two writes of one file never put their headers down out of order)."""
        with self._lock:
            self._seq += 1
            seq = self._seq
        used = self.payload if k < len(chain.extents) - 1 or self.zero_ended else chain.used
        if k == 0:
            chain.seq = seq
        self._pwrite(encode_header(chain, k, seq, used), self._offset(chain.extents[k]))

    def _take(self) -> int:
        """A free extent (zero on the disk), growing the file when none is left. One given back
        to the host is written as zeros again first (and made durable): its first group then
        costs no metadata commit, as a grown extent's does not (docs/format/logdev.md)."""
        with self._lock:
            if not self._free:
                self._grow()
            e = self._free.pop(0)
            if e in self._holes:
                try:
                    _write_zeros(self._fd, self._offset(e), self.extent_size)
                    os.fsync(self._fd)
                except OSError:
                    self._free.insert(0, e)
                    raise
                self._holes.discard(e)
            return e

    def _give_back(self, fd: int | None = None) -> None:
        """Return the free extents beyond ``SPARE`` to the host file system: a free tail is cut
        off the file, others are punched out (they still read as zeros: free, as the format
        says). Called with the free list just grown; rare (a burst's files deleted)."""
        fd = self._fd if fd is None else fd
        with self._lock:
            extra = len(self._free) - SPARE
            if extra <= 0:
                return
            free = set(self._free)
            cut = self._count
            while cut > 0 and cut - 1 in free and self._count - cut < extra:
                cut -= 1
            if cut < self._count:
                os.ftruncate(fd, self._offset(cut))
                os.fsync(fd)
                self._free = [e for e in self._free if e < cut]
                self._holes = {e for e in self._holes if e < cut}
                self._count = cut
            for e in self._free[SPARE:]:  # the highest: handed out last
                if e not in self._holes and _punch(fd, self._offset(e), self.extent_size):
                    self._holes.add(e)

    def space(self) -> tuple[int, int]:
        """(bytes the device's file holds on the host file system, bytes of extents files use)."""
        st = os.fstat(self._fd) if self._fd >= 0 else None
        allocated = st.st_blocks * 512 if st is not None else 0
        with self._lock:
            used = sum(len(c.extents) for c in self._chains.values()) * self.extent_size
        return allocated, used

    def _grow(self) -> None:
        """Up to GROW more extents (fewer when the host file system is short of room), written
        as zeros and made durable with the file's new size: rare. ENOSPC when not one fits;
        a grow cut short by ENOSPC is cut back, so the file stays whole extents."""
        st = os.statvfs(os.path.dirname(self.path))
        n = min(GROW, st.f_bavail * st.f_frsize // self.extent_size)
        if n < 1:
            raise OSError(errno.ENOSPC, "no room for another extent of the log device", self.path)
        start = self._offset(self._count)
        try:
            _write_zeros(self._fd, start, n * self.extent_size)
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, start)
            raise
        self._free.extend(range(self._count, self._count + n))
        self._count += n

    def _zero_sync(self, fd: int, extents: list[int]) -> None:
        for e in extents:  # the header last would leave a named extent of zeros: harmless either way
            _write_zeros(fd, self._offset(e), self.extent_size)

    def _release(self, extents: list[int]) -> None:
        """Free ``extents``: zero them and flush before they are handed out again (L2)."""
        if not extents:
            return
        self._zero_sync(self._fd, extents)
        self.flush_sync(self._note_written())
        with self._lock:
            self._free.extend(extents)
            self._free.sort()
        self._give_back()

    # -- writes and the device flush ---------------------------------------------

    def _pwrite(self, data: Buffer, offset: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(self._fd, view, offset)
            view, offset = view[n:], offset + n

    def _note_written(self, chain: Chain | None = None) -> int:
        """Count a completed write (of ``chain``'s file); its number, for ``flush_sync``."""
        with self._cv:
            self._written += 1
            if chain is not None:
                chain.last_write = self._written
            return self._written

    def _writable(self) -> None:
        if self.read_only:
            raise StorageIOError(f"{self.path} is open read-only")

    def write_sync(self, chain: Chain, parts: Sequence[Buffer], offset: int) -> int:
        """Write ``parts`` at file ``offset``: the extents it reaches first are taken, and every
        header whose ``used`` changes is written before the data (a crash between leaves zeros
        or a torn write past the old end: never acknowledged). Not durable until a flush."""
        self._writable()
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        total = sum(len(v) for v in views)
        end = offset + total
        with chain.lock:
            old_n, old_size = len(chain.extents), chain.size(self.payload)
            while len(chain.extents) * self.payload < end or not chain.extents:
                chain.extents.append(self._take())
            grew = end > old_size or len(chain.extents) > old_n
            if end > old_size:
                chain.used = end - (len(chain.extents) - 1) * self.payload
            elif len(chain.extents) > old_n:
                chain.used = 0
            if grew:  # zero-ended: only the extents taken now (their header never changes)
                for k in range(old_n if self.zero_ended else max(old_n - 1, 0), len(chain.extents)):
                    self._write_header(chain, k)
            places: list[tuple[memoryview, int]] = []
            pos = offset
            for v in views:
                while v:
                    k, within = divmod(pos, self.payload)
                    n = min(len(v), self.payload - within)
                    places.append((v[:n], self._offset(chain.extents[k]) + PAGE + within))
                    v, pos = v[n:], pos + n
        for data, at in places:
            self._pwrite(data, at)
        self._note_written(chain)
        return total

    def flush_sync(self, upto: int | None = None) -> None:
        """Make durable every write up to number ``upto`` (default: every write completed
        before this call): one ``fdatasync`` of the device, shared with every thread that waits
        meanwhile. A write that a failed flush may have covered is never reported durable
        (after a failed fdatasync the kernel may have dropped its pages and a later one
        succeeds: the "fsyncgate" lesson): its file fails, is cut back to its last durable
        group and recovered from the disk (``TerrascaleFS.reopen_failed``); writes made after
        the failure flush normally."""
        with self._cv:
            target = self._written if upto is None else upto
            while True:
                if target <= self._suspect:
                    raise DeviceError(f"{self.path}: a flush of the log device covering this write failed: "
                                      f"{self._failed}")
                if self._synced >= target:
                    return
                if self._syncing:
                    self._cv.wait()
                    continue
                self._syncing, start = True, self._written
                self._cv.release()
                err = None
                try:
                    os.fdatasync(self._fd)
                except OSError as e:
                    err = e
                self._cv.acquire()
                self._syncing = False
                if err is None:
                    self._synced = max(self._synced, start)
                    self.flushes += 1
                else:
                    self._failed, self._suspect = err, self._written
                self._cv.notify_all()
                if err is not None and target <= self._suspect:
                    raise err

    # -- the BlockDevice interface -----------------------------------------------

    async def create(self, name: str) -> DeviceFile:
        check_name(name)
        if len(name) > MAX_NAME:
            raise StorageIOError(f"name {name!r} is longer than {MAX_NAME} bytes")
        await self._ready()
        self._writable()
        with self._lock:
            if name in self._chains:
                raise AlreadyExistsError(f"{self.uri}/{name} exists")
            chain = self._chains[name] = Chain(name, int.from_bytes(os.urandom(8), "little"))

        def run() -> None:
            self.write_sync(chain, [], 0)
            self.flush_sync(chain.last_write)

        try:
            await run_io(run)
        except BaseException as e:
            with self._lock:
                self._chains.pop(name, None)
            if chain.extents:
                await run_io(self._release, list(chain.extents))
            full = no_space(e)
            if full is not None:
                raise full from e
            raise
        return _LogFile(self, name, chain)

    async def open(self, name: str) -> DeviceFile:
        await self._ready()
        chain = self._chains.get(check_name(name))
        if chain is None:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        return _LogFile(self, name, chain)

    async def delete(self, name: str) -> None:
        await self._ready()
        self._writable()
        with self._lock:
            chain = self._chains.pop(check_name(name), None)
        if chain is None:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        await run_io(self._release, list(chain.extents))  # index 0 first: the name goes first

    async def rename(self, src: str, dst: str) -> None:
        await self._ready()
        self._writable()
        check_name(dst)
        with self._lock:
            chain = self._chains.get(check_name(src))
            if chain is None:
                raise FileNotFoundInDeviceError(f"{self.uri}/{src} not found")
            old = self._chains.get(dst)

        def run() -> None:
            with chain.lock:
                chain.name = dst
                self._write_header(chain, 0)  # the greater seq names dst after a crash
            self.flush_sync(self._note_written(chain))
            with self._lock:
                self._chains.pop(src, None)
                self._chains[dst] = chain
            if old is not None and old is not chain:
                self._release(list(old.extents))

        await run_io(run)

    async def list(self, prefix: str = "") -> list[str]:
        await self._ready()
        with self._lock:
            return sorted(n for n in self._chains if n.startswith(prefix))

    async def exists(self, name: str) -> bool:
        await self._ready()
        return check_name(name) in self._chains

    def free_bytes(self) -> int | None:
        st = os.statvfs(os.path.dirname(self.path))
        return st.f_bavail * st.f_frsize + (len(self._free) - len(self._holes)) * self.payload

    def rounds(self) -> tuple[int, int] | None:
        return self.device_rounds.hops, self.device_rounds.works

    async def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _LogFile(DeviceFile):
    """An open file of a log device (one writer; reads may be concurrent)."""

    preallocated = True  # bytes past the end read as zero already: no zeros written ahead

    def __init__(self, dev: LogDevice, name: str, chain: Chain):
        self.dev, self.name, self._chain = dev, name, chain
        self._closed = False

    def _check(self) -> None:
        if self._closed or self.dev._fd < 0:
            raise ClosedError(f"{self.dev.uri}/{self.name} is closed")

    async def append(self, data: Buffer) -> int:
        self._check()
        chain = self._chain
        off = max(chain.reserved, self.size())
        chain.reserved = off + len(data)  # before the thread runs: appends never overlap
        await run_io(self.dev.write_sync, chain, [data], off)
        return off

    async def pread(self, offset: int, length: int) -> bytes:
        self._check()
        dev, chain = self.dev, self._chain
        end = min(offset + length, chain.size(dev.payload))
        out: list[bytes] = []
        pos = offset

        def run() -> bytes:
            nonlocal pos
            while pos < end:
                k, within = divmod(pos, dev.payload)
                n = min(end - pos, dev.payload - within)
                out.append(os.pread(dev._fd, n, dev._offset(chain.extents[k]) + PAGE + within))
                pos += n
            return b"".join(out)

        return await asyncio.to_thread(run) if end > offset else b""

    async def truncate(self, size: int) -> None:
        self._check()
        await run_io(self._truncate_sync, size)

    def _truncate_sync(self, size: int) -> None:
        dev, chain = self.dev, self._chain
        dev._writable()
        with chain.lock:
            if size >= chain.size(dev.payload):
                return
            keep = max(-(-size // dev.payload), 1)
            cut, chain.extents = chain.extents[keep:], chain.extents[:keep]
            chain.used = size - (keep - 1) * dev.payload
            chain.reserved = size
            last = chain.extents[-1]
            _write_zeros(dev._fd, dev._offset(last) + PAGE + chain.used, dev.payload - chain.used)  # L2
            if not dev.zero_ended:
                dev._write_header(chain, keep - 1)
        dev._note_written(chain)
        dev._release(cut)

    async def sync(self) -> None:
        self._check()
        await run_io(self.dev.flush_sync, self._chain.last_write)

    def writev_sync(self, parts: Sequence[Buffer], offset: int) -> int:
        self._check()
        return self.dev.write_sync(self._chain, parts, offset)

    def fdatasync_sync(self) -> None:
        self._check()
        self.dev.flush_sync(self._chain.last_write)

    async def in_round(self, work: Callable[[], T]) -> T:
        """``work()`` (which writes through ``writev_sync``) in the device's next round; its
        result once the round's one flush covered the write (``terrafs/rounds.py``)."""
        self._check()
        return await self.dev.device_rounds.run(work)

    async def append_durable(self, build: Callable[[int], Sequence[Buffer]]) -> tuple[int, int]:
        self._check()

        def run() -> tuple[int, int]:
            off = self.size()
            n = self.dev.write_sync(self._chain, build(off), off)
            self.dev.flush_sync(self._chain.last_write)
            return off, n

        return await run_io(run)

    def size(self) -> int:
        return self._chain.size(self.dev.payload)

    async def close(self) -> None:
        self._closed = True


def _write_zeros(fd: int, offset: int, length: int) -> None:
    while length > 0:
        n = os.pwrite(fd, _ZERO[: min(length, len(_ZERO))], offset)
        offset, length = offset + n, length - n


def _punch(fd: int, offset: int, length: int) -> bool:
    """Deallocate ``[offset, offset + length)`` of the file, keeping its size (it reads as zeros);
    False where the host cannot (no fallocate, or a file system without holes)."""
    try:
        libc = _libc()
        if libc is None:
            return False
        return int(libc.fallocate(fd, _PUNCH, ctypes.c_long(offset), ctypes.c_long(length))) == 0
    except (AttributeError, OSError):
        return False


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None
