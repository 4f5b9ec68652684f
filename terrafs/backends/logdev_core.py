"""The log device's state and its blocking work, everything below the ``BlockDevice``
interface (:mod:`terrafs.backends.logdev`) and the open file (:mod:`terrafs.backends.logdev_file`):
opening (the chains read back from the extent headers), extents taken, grown, zeroed and given
back to the host, headers and data written.

Format, invariants and the reasoning behind each write's order: docs/format/logdev.md.

The methods here run in the I/O threads (``terrafs.iopool``); the device's structures (chains,
the free list, the header counter) are guarded by one lock, and flushes are a group commit at
the device (:mod:`terrafs.backends.logdev_commit`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import threading
from typing import Sequence

from catalog.fsutil import fsync_dir
from terrafs.abc import Buffer
from terrafs.backends.logdev_commit import GroupCommit
from terrafs.backends.logdev_format import (PAGE, ZERO_ENDED, Chain, Piece, chains_from, decode_superblock,
                                            encode_header, encode_superblock, parse_header)
from terrafs.errors import FileCorruptionError, StorageIOError
from terrafs.rounds import DeviceRounds

EXTENT_SIZE = 1 << 20  # a new device's extent size (each device records its own)
GROW = 16  # extents added at a time
SPARE = GROW  # free extents kept written (zeros) for the next files; the rest go back to the host
_PUNCH = 0x01 | 0x02  # fallocate: FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (Linux)
_ZERO = memoryview(b"\0" * (1 << 20))


class LogDeviceCore:
    """A log device's files as chains of extents of the one file at ``path``; ``LogDevice``
    puts the ``BlockDevice`` interface on top."""

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
        self._commit = GroupCommit(self.path, lambda: os.fdatasync(self._fd))  # group commit at the device
        # every active file's group of a round written and flushed in one thread hop (RFC 0011)
        self.device_rounds = DeviceRounds(self.flush_sync)

    # -- opening -------------------------------------------------------------------

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
                    write_zeros(self._fd, self._offset(e), self.extent_size)
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
            write_zeros(self._fd, start, n * self.extent_size)
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, start)
            raise
        self._free.extend(range(self._count, self._count + n))
        self._count += n

    def _zero_sync(self, fd: int, extents: list[int]) -> None:
        for e in extents:  # the header last would leave a named extent of zeros: harmless either way
            write_zeros(fd, self._offset(e), self.extent_size)

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
        return self._commit.note_written(chain)

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
        """Make durable every write up to number ``upto`` (default: every write completed before
        this call), or raise: ``GroupCommit.flush``."""
        self._commit.flush(upto)

    @property
    def flushes(self) -> int:
        """fdatasyncs of the device (tests and metrics count them)."""
        return self._commit.flushes


def write_zeros(fd: int, offset: int, length: int) -> None:
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
