"""Durable files of a Raft replica: journal, meta, dump. Layout: docs/format/raft-journal.md.

``DurableJournal`` implements pysyncobj's ``Journal`` interface. ``add`` only
writes; ``sync`` makes everything written durable with one fdatasync. The
transport calls ``sync`` before an acknowledgement leaves the node (see
``catalog/raft/wire.py``), which is what makes an acknowledged entry durable.
"""
from __future__ import annotations

import errno
import logging
import os
import re
import struct
import time
from typing import Callable, TypeVar, TypeVarTuple, overload

from pysyncobj.journal import Journal

from catalog.checksum import crc32c
from catalog.errors import CatalogCorruptionError, CatalogError
from catalog.fsutil import fsync_dir
from catalog.retry import Retry, call

log = logging.getLogger("catalog.raft")
T = TypeVar("T")
Ts = TypeVarTuple("Ts")
JournalEntry = tuple[bytes, int, int]  # (command, index, term): pysyncobj's log entry

J_MAGIC = b"TRRAFTJ1"  # part of the format
J_VERSION = 1
J_HEADER = struct.Struct("<8sHQI")  # 22 bytes
REC_MAGIC = 0x524A5254  # b"TRJR"
REC_HEADER = struct.Struct("<IIII")
ENTRY_HEAD = struct.Struct("<QQ")
MAX_RECORD = 1 << 20
M_MAGIC = b"TRRAFTM1"
M_VERSION = 1
D_MAGIC = b"TRRAFTD1"
D_VERSION = 1
_JOURNAL = re.compile(r"^journal-([0-9a-f]{16})\.trj$")
# Opening or creating a file failing with these is a passing shortage: retried, never fatal.
TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EAGAIN, errno.EINTR}
WRITE_RETRY = Retry(attempts=None, base=0.01, cap=1.0)  # until it works or the replica stops; 1 s apart at most


class JournalError(CatalogError):
    """Raised when a journal write or fsync fails: the replica must stop."""


def atomic_write(path: str, data: bytes) -> None:
    """temp + fsync + rename + directory fsync (never exists-then-write)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    payload = ENTRY_HEAD.pack(idx, term) + command
    head = struct.pack("<III", REC_MAGIC, len(payload), crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


def _decode_record(buf: bytes, pos: int) -> tuple[JournalEntry, int] | str:
    """(entry, next offset), or a string saying why the record at ``pos`` is bad."""
    if len(buf) - pos < REC_HEADER.size:
        return "incomplete record header"
    magic, n, pcrc, hcrc = REC_HEADER.unpack_from(buf, pos)
    if magic != REC_MAGIC or crc32c(buf[pos:pos + 12]) != hcrc or n > MAX_RECORD or n < 16:
        return "bad record header"
    end = pos + 16 + n
    if end > len(buf):
        return "incomplete record"
    payload = buf[pos + 16:end]
    if crc32c(payload) != pcrc:
        return "record checksum mismatch"
    idx, term = ENTRY_HEAD.unpack_from(payload, 0)
    return (bytes(payload[16:]), idx, term), end


def _valid_record_after(buf: bytes, pos: int) -> bool:
    i = buf.find(struct.pack("<I", REC_MAGIC), pos + 1)
    while i >= 0:
        if not isinstance(_decode_record(buf, i), str):
            return True
        i = buf.find(struct.pack("<I", REC_MAGIC), i + 1)
    return False


def parse_journal(buf: bytes, where: str,
                  gen: int) -> tuple[list[JournalEntry], list[int], tuple[int, str] | None]:
    """(entries, their offsets, torn tail) of a journal file's bytes, read-only.

    The torn tail is ``(offset, reason)`` of an incomplete or damaged last record with no
    valid record after it, else None. Anything else is CatalogCorruptionError."""
    if len(buf) < J_HEADER.size:
        raise CatalogCorruptionError(where, 0, "truncated journal header")
    magic, ver, g, crc = J_HEADER.unpack_from(buf, 0)
    if magic != J_MAGIC or crc32c(buf[:18]) != crc or g != gen:
        raise CatalogCorruptionError(where, 0, "bad journal header")
    if ver != J_VERSION:
        raise CatalogCorruptionError(where, 8, f"unsupported journal version {ver}")
    entries: list[JournalEntry] = []
    offsets: list[int] = []
    pos = J_HEADER.size
    while pos < len(buf):
        got = _decode_record(buf, pos)
        if isinstance(got, str):
            if _valid_record_after(buf, pos):
                raise CatalogCorruptionError(where, pos, got)
            return entries, offsets, (pos, got)
        entry, nxt = got
        if entries and entry[1] != entries[-1][1] + 1:
            raise CatalogCorruptionError(where, pos, f"index {entry[1]} follows "
                                         f"{entries[-1][1]}: the journal has a gap")
        entries.append(entry)
        offsets.append(pos)
        pos = nxt
    return entries, offsets, None


def journal_files(path: str) -> list[tuple[int, str]]:
    """(generation, file name) of the journal files in ``path``, oldest first."""
    return sorted((int(m.group(1), 16), n) for n in os.listdir(path) if (m := _JOURNAL.match(n)))


def parse_meta(raw: bytes, where: str) -> tuple[int, str | None, int]:
    """(term, vote, commit index) of a meta file's bytes."""
    if len(raw) < 32 or raw[:8] != M_MAGIC or crc32c(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
        raise CatalogCorruptionError(where, 0, "bad meta file")
    ver, term, commit, vl = struct.unpack_from("<HQQH", raw, 8)
    if ver != M_VERSION:
        raise CatalogCorruptionError(where, 8, f"unsupported meta version {ver}")
    vote = raw[28:28 + vl].decode() if vl else None
    return term, vote, max(commit, 1)


class DurableJournal(Journal):  # type: ignore[misc]  # pysyncobj is untyped: its Journal is Any
    """pysyncobj's journal: entries in memory, records in ``journal-<gen>.trj``."""

    def __init__(self, path: str, stopping: Callable[[], bool] = lambda: False,
                 on_retry: Callable[[], None] = lambda: None):
        """``stopping()``: transient write errors are retried until it says so (the replica
        stops); ``on_retry()``: called before each retry (the replica frees descriptors it can
        spare: its tick thread waits in the retry, so nothing else would)."""
        self.path = path
        self._entries: list[JournalEntry] = []
        self._offsets: list[int] = []
        self._fd = -1
        self._gen = 0
        self._size = 0
        self._dirty = False
        self._vote: str | None
        self._term, self._vote, self._commit = 0, None, 1
        self._commit_saved = 1
        self.torn_tail: tuple[str, int] | None = None
        self.syncs = 0  # fdatasync calls (tests, metrics)
        self.retries = 0  # transient write errors retried (metrics)
        self.stopping, self.on_retry = stopping, on_retry
        self._last_retry_log = float("-inf")
        self._open()

    # -- files --------------------------------------------------------------------------

    def _name(self, gen: int) -> str:
        return os.path.join(self.path, f"journal-{gen:016x}.trj")

    def _open(self) -> None:
        names = sorted(n for n in os.listdir(self.path) if _JOURNAL.match(n))
        for n in os.listdir(self.path):
            if n.endswith(".tmp"):
                os.unlink(os.path.join(self.path, n))
        self._read_meta()
        if not names:
            self._rewrite([], 1)
            return
        newest = _JOURNAL.match(names[-1])
        assert newest is not None  # names holds only the names that match
        self._gen = int(newest.group(1), 16)
        self._load(self._name(self._gen))
        for n in names[:-1]:  # left behind by a crash during a rewrite
            os.unlink(os.path.join(self.path, n))
        self._fd = os.open(self._name(self._gen), os.O_WRONLY)
        self._size = os.fstat(self._fd).st_size

    def align_to_dump(self, dump_path: str) -> None:
        """Start the journal at the dump's two entries when a dump on disk is newer than the
        journal's start: a background dump replaced the file, then the node stopped before
        pysyncobj compacted the journal. pysyncobj would clear such a journal down to the
        dump's entries and drop every entry after them, acknowledged ones included; this is
        the compaction it missed. A damaged dump is left for the dump loader to report."""
        try:
            with open(dump_path, "rb") as f:
                last, prev, _, _ = decode_dump(f.read(), dump_path)
        except (FileNotFoundError, CatalogCorruptionError):
            return
        e = self._entries
        for i in range(len(e) - 1):
            if e[i] == prev and e[i + 1] == last:
                if i:
                    log.info("event=raft_journal_aligned_to_dump dropped=%d first_index=%d", i, prev[1])
                    self._guarded(self._rewrite, e[i:], self._gen + 1)
                return

    def _load(self, where: str) -> None:
        with open(where, "rb") as f:
            buf = f.read()
        self._entries, self._offsets, torn = parse_journal(buf, where, self._gen)
        if torn is not None:
            pos, why = torn
            log.warning("event=raft_journal_torn_tail file=%s offset=%d dropped_bytes=%d reason=%r",
                        where, pos, len(buf) - pos, why)
            self.torn_tail = (where, pos)
            with open(where, "r+b") as f:
                f.truncate(pos)
                os.fsync(f.fileno())

    def _rewrite(self, entries: list[JournalEntry], gen: int) -> None:
        """Replace the journal by a new generation holding ``entries`` (crash-safe)."""
        head = J_MAGIC + struct.pack("<HQ", J_VERSION, gen)
        data = bytearray(head + struct.pack("<I", crc32c(head)))
        offsets: list[int] = []
        for e in entries:
            offsets.append(len(data))
            data += encode_record(*e)
        name = self._name(gen)
        self.retry(atomic_write, name, bytes(data))
        fd = self.retry(os.open, name, os.O_WRONLY)
        if self._fd >= 0:
            os.close(self._fd)
            old = self._name(self._gen)
            if old != name:
                os.unlink(old)
                self.retry(fsync_dir, self.path)
        self._fd = fd
        self._gen, self._size, self._dirty = gen, len(data), False
        self._entries, self._offsets = list(entries), offsets

    # -- pysyncobj Journal interface ----------------------------------------------------------

    def add(self, command: bytes, idx: int, term: int) -> None:
        rec = encode_record(bytes(command), idx, term)
        try:
            os.pwrite(self._fd, rec, self._size)
        except OSError as e:
            raise JournalError(f"{self._name(self._gen)}: write failed: {e}") from e
        self._entries.append((bytes(command), idx, term))
        self._offsets.append(self._size)
        self._size += len(rec)
        self._dirty = True

    def sync(self) -> None:
        """Make every add/cut so far durable: one fdatasync."""
        if not self._dirty:
            return
        try:
            os.fdatasync(self._fd)
        except OSError as e:
            raise JournalError(f"{self._name(self._gen)}: fdatasync failed: {e}") from e
        self._dirty = False
        self.syncs += 1

    def clear(self) -> None:
        self._guarded(self._rewrite, [], self._gen + 1)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        cut = self._offsets[entryFrom]
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._guarded(os.ftruncate, self._fd, cut)
        self._size, self._dirty = cut, True

    def deleteEntriesTo(self, entryTo: int) -> None:
        # pysyncobj renamed the dump that covers these entries just before: make the rename
        # durable before the entries disappear.
        self._guarded(fsync_dir, self.path)
        self._guarded(self._rewrite, self._entries[entryTo:], self._gen + 1)

    def _guarded(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        try:
            return self.retry(fn, *args)
        except OSError as e:
            raise JournalError(f"{self.path}: journal write failed: {e}") from e

    def retry(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """``fn(*args)``, retried with backoff (catalog.retry) while it fails with a TRANSIENT
        errno (too many open files, say): a replica waits the shortage out instead of stopping
        for good. No limit but the replica stopping. The tick thread waits meanwhile; peers
        see a silent node (a new leader, if it led). Each call retried here writes a whole
        file, cuts at a fixed offset, opens or reads: repeating it is safe."""
        return call(lambda: fn(*args), self._transient, WRITE_RETRY, on_retry=self._retrying)

    def _transient(self, e: Exception) -> bool:
        return isinstance(e, OSError) and e.errno in TRANSIENT and not self.stopping()

    def _retrying(self, _attempt: int, e: Exception, delay: float) -> None:
        self.retries += 1
        now = time.monotonic()
        if now - self._last_retry_log >= 1.0:  # one line a second at most while it lasts
            self._last_retry_log = now
            code = e.errno if isinstance(e, OSError) else None  # an OSError: _transient took it
            log.warning("event=raft_write_retry dir=%s errno=%s backoff_s=%.2f retries=%d",
                        self.path, errno.errorcode.get(code, code) if code is not None else None, delay,
                        self.retries)
        self.on_retry()

    @overload
    def __getitem__(self, item: int) -> JournalEntry: ...
    @overload
    def __getitem__(self, item: slice) -> list[JournalEntry]: ...

    def __getitem__(self, item: int | slice) -> JournalEntry | list[JournalEntry]:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        if self._fd >= 0:
            self.sync()
            self._save_meta()
            os.close(self._fd)
            self._fd = -1

    def flush(self) -> None:
        self.sync()

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._commit = raftCommitIndex

    def getRaftCommitIndex(self) -> int:
        return self._commit

    def setCurrentTerm(self, term: int, votedForNodeId: str | None) -> None:
        self._term, self._vote = term, votedForNodeId
        self._save_meta()  # before any message that reflects the vote is sent

    def getCurrentTerm(self) -> int:
        return self._term

    def getVotedForNodeId(self) -> str | None:
        return self._vote

    def onOneSecondTimer(self) -> None:
        if self._commit != self._commit_saved:
            self._save_meta()

    # -- meta -------------------------------------------------------------------------------

    def _meta_path(self) -> str:
        return os.path.join(self.path, "meta.trm")

    def _save_meta(self) -> None:
        vote = (self._vote or "").encode()
        raw = M_MAGIC + struct.pack("<HQQH", M_VERSION, self._term, self._commit, len(vote)) + vote
        try:
            self.retry(atomic_write, self._meta_path(), raw + struct.pack("<I", crc32c(raw)))
        except OSError as e:
            raise JournalError(f"{self._meta_path()}: write failed: {e}") from e
        self._commit_saved = self._commit

    def _read_meta(self) -> None:
        where = self._meta_path()
        if not os.path.exists(where):
            return
        with open(where, "rb") as f:
            raw = f.read()
        self._term, self._vote, self._commit = parse_meta(raw, where)
        self._commit_saved = self._commit


# -- dump ----------------------------------------------------------------------------------

def _entry_bytes(e: JournalEntry) -> bytes:
    return ENTRY_HEAD.pack(e[1], e[2]) + struct.pack("<I", len(e[0])) + bytes(e[0])


def encode_dump(last: JournalEntry, prev: JournalEntry, members: list[str], state: bytes) -> bytes:
    out = bytearray(D_MAGIC + struct.pack("<H", D_VERSION))
    out += _entry_bytes(last) + _entry_bytes(prev)
    out += struct.pack("<H", len(members))
    for m in members:
        mb = m.encode()
        out += struct.pack("<H", len(mb)) + mb
    out += struct.pack("<I", len(state)) + state
    out += struct.pack("<I", crc32c(bytes(out)))
    return bytes(out)


def decode_dump(raw: bytes, where: str) -> tuple[JournalEntry, JournalEntry, list[str], bytes]:
    """(last entry, prev entry, members, state bytes); CatalogCorruptionError if damaged."""
    if len(raw) < 14 or raw[:8] != D_MAGIC:
        raise CatalogCorruptionError(where, 0, "bad dump magic")
    if crc32c(raw[:-4]) != struct.unpack_from("<I", raw, len(raw) - 4)[0]:
        raise CatalogCorruptionError(where, len(raw) - 4, "dump checksum mismatch")
    (ver,) = struct.unpack_from("<H", raw, 8)
    if ver != D_VERSION:
        raise CatalogCorruptionError(where, 8, f"unsupported dump version {ver}")
    pos = 10
    entries: list[JournalEntry] = []
    try:
        for _ in range(2):
            idx, term = ENTRY_HEAD.unpack_from(raw, pos)
            (n,) = struct.unpack_from("<I", raw, pos + 16)
            entries.append((bytes(raw[pos + 20:pos + 20 + n]), idx, term))
            pos += 20 + n
        (m,) = struct.unpack_from("<H", raw, pos)
        pos += 2
        members: list[str] = []
        for _ in range(m):
            (n,) = struct.unpack_from("<H", raw, pos)
            members.append(raw[pos + 2:pos + 2 + n].decode())
            pos += 2 + n
        (n,) = struct.unpack_from("<I", raw, pos)
        state = bytes(raw[pos + 4:pos + 4 + n])
    except (struct.error, UnicodeDecodeError) as e:
        raise CatalogCorruptionError(where, pos, f"malformed dump: {e}") from e
    return entries[0], entries[1], members, state
