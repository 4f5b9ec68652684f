"""A follower's copies of the partitions it replicates (docs/format/replication.md).

For each (table id, partition) this node follows, an ``rs/rep/`` record says which epoch it
promised, which epoch's log it holds a prefix of, and which TerrascaleFS active files hold
its copies of the leader's segments. Appends arrive in log order from the leader; a copy is
the leader's logical bytes at the same offsets, so it is a valid active segment once this
node is promoted (``take``)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from catalog.abc import Check, Op, Put
from rowstore.errors import ConflictError, FencedError, LeaderAliveError, RowstoreError
from rowstore.replication.epochs import Epoch, History, cut_point, epochs_key
from rowstore.segments.position import NOTHING, Position, ReplicaRecord, keeps_log, rep_key
from terrafs.active import ActiveFile
from terrafs.catalog_ops import commit
from terrafs.errors import CatalogConflictError, NoSpaceError, TerrafsError
from terrafs.failpoints import failpoint
from terrafs.fs import TerrascaleFS
from terrafs.records import FileRecord

log = logging.getLogger("rowstore.replication.follower")
_COPY_CHUNK = 4 << 20  # bytes read and appended at a time when a copy is cut


@dataclass
class SegmentPiece:
    segid: int
    seq: int
    offset: int
    data: bytes | memoryview


def _split(p: SegmentPiece, at: Position) -> tuple[SegmentPiece | None, SegmentPiece | None]:
    """``p`` cut at log position ``at``: the part before it and the part from it (None: empty)."""
    if p.seq != at.seq:
        return (p, None) if p.seq < at.seq else (None, p)
    n = min(max(at.offset - p.offset, 0), len(p.data))
    if n == 0:
        return None, p
    if n == len(p.data):
        return p, None
    d = memoryview(p.data)
    return SegmentPiece(p.segid, p.seq, p.offset, d[:n]), SegmentPiece(p.segid, p.seq, p.offset + n, d[n:])


def _fits(r: _Replica, p: SegmentPiece) -> bool:
    """Whether ``p`` continues what the copy holds (``ReplicaStore._put`` takes it): it begins
    where the copy of its segment ends, or begins a segment not copied yet — the leader sends
    the first segment it still holds after those offloaded, which the log need not copy."""
    f = r.files.get(p.segid)
    return p.offset == 0 if f is None else p.offset <= f.durable_size


@dataclass
class _Replica:
    """One partition's copy on this node (loaded from its record on first use)."""

    key: str
    rec: ReplicaRecord
    version: int  # the record's catalog version (0: none yet)
    files: dict[int, ActiveFile] = field(default_factory=dict)  # segid -> open copy
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Monotonic time of the last append from the current epoch's leader. Loaded counts as just
    # heard: this replica may have acknowledged a leader just before a restart, and that
    # leader's lease may still run on it (a promise waits it out).
    contact: float = 0.0
    leader: str = ""
    # The epoch whose leader this process has been receiving from since its log was known to
    # be a prefix of that leader's (in memory only: after a restart the record decides).
    following: int = 0

    def position(self) -> Position:
        if not self.rec.segs:
            return NOTHING
        segid, (seq, _) = max(self.rec.segs.items(), key=lambda kv: kv[1][0])
        f = self.files.get(segid)
        return Position(seq, f.durable_size if f is not None else 0)


class ReplicaStore:
    """This node's follower side: appends, fences, promotion hand-over, clean-up."""

    def __init__(self, fs: TerrascaleFS, lease_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic,
                 resume_free_bytes: int = 64 << 20, lost: frozenset[int] = frozenset()):
        self.fs, self.catalog, self.node = fs, fs.catalog, fs.cfg.node_id
        self.lease_s = lease_s
        self.monotonic = monotonic  # leases and contact ages (a simulation runs it on virtual time)
        self.resume_free_bytes = resume_free_bytes  # free space before a copy that hit a full device takes writes
        self._reps: dict[tuple[str, int], _Replica] = {}
        self._loading: dict[tuple[str, int], asyncio.Lock] = {}
        # The highest clock a leader sent, per partition (its present then): answered to every
        # fence, so an election's floor is above the reads its leader served. Kept apart from
        # the cached replica state, which a promotion here or another node's drops and reloads
        # — the clock heard must not go with it (RFC 0010 §5, "Clocks").
        self.leader_clocks: dict[tuple[str, int], int] = {}
        self.lost: set[int] = set(lost)  # inodes whose local files were found missing at start

    async def replica(self, table_id: str, pid: int) -> _Replica:
        r = self._reps.get((table_id, pid))
        if r is not None:
            return r
        async with self._loading.setdefault((table_id, pid), asyncio.Lock()):
            r = self._reps.get((table_id, pid))
            if r is None:
                r = await self._load(table_id, pid)
                self._reps[(table_id, pid)] = r
        return r

    async def _load(self, table_id: str, pid: int) -> _Replica:
        key = rep_key(table_id, pid, self.node)
        e = await self.catalog.get(key)
        if e is None:
            return _Replica(key, ReplicaRecord(), 0, contact=self.monotonic())
        r = _Replica(key, ReplicaRecord.from_bytes(e.value, key), e.version, contact=self.monotonic())
        if r.rec.rewriting:  # a cut copy whose switch a crash prevented: the old copy stands
            await self._drop_rewrites(r)
        if any(inode in self.lost for _, inode in r.rec.segs.values()):
            log.warning("event=replica_lost table=%s partition=%d: a copy's file is gone; starting over",
                        table_id, pid)
            await self._discard(r)
            return r
        for segid, (_, inode) in r.rec.segs.items():
            try:
                r.files[segid] = await self.fs.open_active(inode)
            except TerrafsError as err:
                log.warning("event=replica_unreadable table=%s partition=%d segid=%d error=%r", table_id, pid,
                            segid, err)
                await self._discard(r)
                break
        return r

    # -- the leader's messages ------------------------------------------------------------------

    async def append(self, table_id: str, pid: int, epoch: int, base: int, start: Position, pieces: list[SegmentPiece],
                     leader: str = "", clock: int = 0) -> dict[str, Any]:
        """Make ``pieces`` durable in order; answer the position (``gap``: a piece began past it).
        ``clock``: the leader's present when it sent them (answered by a promise)."""
        r = await self.replica(table_id, pid)
        async with r.lock:
            if epoch < r.rec.promised:
                raise FencedError(f"epoch {epoch} is older than the promised {r.rec.promised}", r.rec.promised)
            if r.following != epoch and r.rec.last != epoch:
                if not keeps_log(r.rec.last, r.position(), epoch, base, start):
                    cut = cut_point(r.rec.last, r.position(), epoch, base, start, await self.history(table_id, pid))
                    log.info("event=replica_diverged table=%s partition=%d last=%d pos=%s epoch=%d base=%d start=%s "
                             "cut=%s", table_id, pid, r.rec.last, r.position(), epoch, base, start, cut)
                    if cut is not None:
                        await self._truncate(r, cut)
                    else:
                        await self._discard(r)
            r.following = epoch  # from here on its log is a prefix of this leader's
            if epoch > r.rec.promised:
                await self._save(r, promised=epoch)
            r.contact, r.leader = self.monotonic(), leader
            self.leader_clocks[(table_id, pid)] = max(self.leader_clocks.get((table_id, pid), 0), clock)
            gap = not await self._put_all(r, table_id, pid, epoch, start, pieces)
            pos = r.position()
            if r.rec.last != epoch and pos >= start:
                await self._save(r, last=epoch)
            return {"pos": pos.json(), "last": r.rec.last, "gap": gap}

    async def _put_all(self, r: _Replica, table_id: str, pid: int, epoch: int, start: Position,
                       pieces: list[SegmentPiece]) -> bool:
        """Write ``pieces`` in order (False: one began past the log's end). No byte of ``epoch``'s
        own log (at or past ``start``) is written before ``epoch`` is the record's durable
        ``last``: a fence answers (last, position), and an election trusts that a log ending
        past ``start`` under ``last`` is that epoch's (RFC 0010, LM; seed 36's first suspect)."""
        for piece in pieces:
            rest: SegmentPiece | None = piece
            if r.rec.last != epoch:
                head, rest = _split(piece, start)  # the older epochs' log below start, and the rest
                if head is not None and not await self._put(r, table_id, pid, head):
                    return False
                if rest is None:
                    continue
                if not _fits(r, rest):
                    return False
                await self._save(r, last=epoch)
            if rest is not None and not await self._put(r, table_id, pid, rest):
                return False
        return True

    async def _put(self, r: _Replica, table_id: str, pid: int, p: SegmentPiece) -> bool:
        f = r.files.get(p.segid)
        if f is not None and f.failure is not None:
            f = r.files[p.segid] = await self._revive(f)
        if f is None:
            if p.offset != 0:
                return False
            f = await self._create(r, table_id, pid, p.segid, p.seq)
        end = f.durable_size
        if p.offset > end:
            return False
        skip = end - p.offset  # bytes already held (a resend)
        if skip < len(p.data):
            await f.append(bytes(memoryview(p.data)[skip:]))
        return True

    async def _revive(self, f: ActiveFile) -> ActiveFile:
        """A copy whose last write failed at the device (full, or a disk error) takes writes
        again once the device does (a full one: once it has ``resume_free_bytes`` free): cut
        back to its last durable group and recovered (its position is then what it really
        holds; the leader resends the rest). Until then the append is refused at once."""
        free = self.fs.block.free_bytes()
        if isinstance(f.failure, NoSpaceError) and free is not None and free < self.resume_free_bytes:
            raise NoSpaceError(f"{f.where}: the block device is still full ({free} bytes free)")
        return await self.fs.reopen_failed(f)  # raises while the device still fails

    async def _create(self, r: _Replica, table_id: str, pid: int, segid: int, seq: int) -> ActiveFile:
        rec = r.rec.copy()

        def extra(f: FileRecord, rec: ReplicaRecord = rec,
                  version: int = r.version) -> tuple[Sequence[Check], Sequence[Op]]:
            rec.segs[segid] = (seq, f.inode)
            return [Check(r.key, version)], [Put(r.key, rec.to_bytes())]

        try:
            af = await self.fs.create(extra=extra)
        except CatalogConflictError:
            await self._reload(r)
            raise ConflictError(f"{r.key} changed under this replica; retry") from None
        r.rec, r.version = rec, await self._version(r.key)
        r.files[segid] = af
        return af

    async def fence(self, table_id: str, pid: int, epoch: int, force: bool = False) -> dict[str, Any]:
        """Promise ``epoch``: refuse older appends from now on; answer the log's epoch and end."""
        r = await self.replica(table_id, pid)
        async with r.lock:
            if epoch <= r.rec.promised:
                raise FencedError(f"epoch {epoch} is not above the promised {r.rec.promised}", r.rec.promised)
            if not force and self.monotonic() - r.contact < self.lease_s:
                raise LeaderAliveError(f"heard from leader {r.leader} {self.monotonic() - r.contact:.2f} s ago")
            await self._save(r, promised=epoch)
            # how long ago the old leader last reached this replica: its lease may run until
            # lease_s after that (a forced election waits it out, RFC 0010 §5 "Leases")
            age = self.monotonic() - r.contact
            return {"last": r.rec.last, "pos": r.position().json(), "contact_age_s": age,
                    "clock": self.leader_clocks.get((table_id, pid), 0)}

    def status(self, table_id: str, pid: int) -> dict[str, Any] | None:
        r = self._reps.get((table_id, pid))
        if r is None:
            return None
        return {"promised": r.rec.promised, "last": r.rec.last, "pos": r.position().json(),
                "contact_s": round(self.monotonic() - r.contact, 3)}

    # -- promotion and clean-up -----------------------------------------------------------------

    async def take(self, table_id: str, pid: int) -> tuple[ReplicaRecord, int, dict[int, ActiveFile]]:
        """Hand this partition's copies to the leader side (promotion): the record, its version
        and the open files; this store forgets them (the caller's transaction deletes the row)."""
        r = await self.replica(table_id, pid)
        await r.lock.acquire()
        try:
            for segid, f in list(r.files.items()):  # a leader never starts from a failed file
                if f.failure is not None:
                    r.files[segid] = await self._revive(f)
            self._reps.pop((table_id, pid), None)
            return r.rec.copy(), r.version, dict(r.files)
        finally:
            r.lock.release()

    def forget(self, table_id: str, pid: int) -> None:
        """Drop the cached state (the record changed under us: promotion of another node)."""
        self._reps.pop((table_id, pid), None)

    async def prune(self, table_id: str, pid: int, keep: set[int]) -> int:
        """Drop copies of segments not in ``keep`` (offloaded or deleted by the leader)."""
        r = await self.replica(table_id, pid)
        async with r.lock:
            gone = [s for s in r.rec.segs if s not in keep]
            if gone:
                await self._drop(r, gone)
            return len(gone)

    async def history(self, table_id: str, pid: int) -> list[Epoch]:
        """The partition's epoch history (empty when none was written: its first epochs)."""
        key = epochs_key(table_id, pid)
        e = await self.catalog.get(key)
        return History.from_bytes(e.value, key).epochs if e is not None else []

    async def _truncate(self, r: _Replica, to: Position) -> None:
        """Cut this replica's log at ``to``: copies of later segments go, the copy of segment
        ``to.seq`` is rewritten with its first ``to.offset`` bytes and switched in (one catalog
        transaction, the old file deleted with it), earlier copies stay as they are."""
        later = [s for s, (q, _) in r.rec.segs.items() if q > to.seq]
        if later:
            await self._drop(r, later)
        at = next((s for s, (q, _) in r.rec.segs.items() if q == to.seq), None)
        f = r.files.get(at) if at is not None else None
        if f is None or f.durable_size <= to.offset:
            return
        assert at is not None  # f was found under it
        if to.offset == 0:
            await self._drop(r, [at])
            return
        seq, old = r.rec.segs[at]
        rec = r.rec.copy()

        def extra(nf: FileRecord, rec: ReplicaRecord = rec,
                  version: int = r.version) -> tuple[Sequence[Check], Sequence[Op]]:
            rec.rewriting[nf.inode] = at
            return [Check(r.key, version)], [Put(r.key, rec.to_bytes())]
        try:
            nf = await self.fs.create(extra=extra)
        except CatalogConflictError:
            await self._reload(r)
            raise ConflictError(f"{r.key} changed under this replica; retry") from None
        r.rec, r.version = rec, await self._version(r.key)
        for a in range(0, to.offset, _COPY_CHUNK):
            await nf.append(await f.read(a, min(_COPY_CHUNK, to.offset - a)))
        failpoint("replica.after_cut_copy")
        done = r.rec.copy()
        done.segs[at] = (seq, nf.inode)
        done.rewriting.pop(nf.inode, None)
        await f.close()
        await self.fs.delete(old, [Check(r.key, r.version)], [Put(r.key, done.to_bytes())])
        r.rec, r.version = done, await self._version(r.key)
        r.files[at] = nf
        log.info("event=replica_cut segid=%d seq=%d offset=%d", at, seq, to.offset)

    async def _drop_rewrites(self, r: _Replica) -> None:
        """Delete the files of cuts a crash interrupted before their switch."""
        for inode in list(r.rec.rewriting):
            rec = r.rec.copy()
            rec.rewriting.pop(inode)
            try:
                await self.fs.delete(inode, [Check(r.key, r.version)], [Put(r.key, rec.to_bytes())])
            except TerrafsError as e:  # already gone: forget it all the same
                log.warning("event=replica_rewrite_not_deleted inode=%d error=%r", inode, e)
                await self._write(r, rec)
                continue
            r.rec, r.version = rec, await self._version(r.key)

    async def _discard(self, r: _Replica) -> None:
        await self._drop(r, list(r.rec.segs), last=0)

    async def _drop(self, r: _Replica, segids: list[int], last: int | None = None) -> None:
        """Delete copies: each file with its entry in the record, in one transaction."""
        for s in segids:
            f = r.files.pop(s, None)
            if f is not None:
                await f.close()
            if s not in r.rec.segs:
                continue
            rec = r.rec.copy()
            inode = rec.segs.pop(s)[1]
            try:
                await self.fs.delete(inode, [Check(r.key, r.version)], [Put(r.key, rec.to_bytes())])
            except CatalogConflictError:
                await self._reload(r)
                raise ConflictError(f"{r.key} changed under this replica; retry") from None
            except TerrafsError as e:  # the file is gone already (a lost disk): forget it all the same
                log.warning("event=replica_copy_not_deleted inode=%d error=%r", inode, e)
                await self._write(r, rec)
                continue
            r.rec, r.version = rec, await self._version(r.key)
        if last is not None and r.rec.last != last:
            await self._save(r, last=last)

    async def _save(self, r: _Replica, promised: int | None = None, last: int | None = None) -> None:
        rec = r.rec.copy()
        if promised is not None:
            rec.promised = max(rec.promised, promised)
        if last is not None:
            rec.last = last
        await self._write(r, rec)

    async def _write(self, r: _Replica, rec: ReplicaRecord) -> None:
        res = await commit(self.catalog, [Check(r.key, r.version)], [Put(r.key, rec.to_bytes())])
        if not res.committed:
            await self._reload(r)
            raise ConflictError(f"{r.key} changed under this replica; retry")
        r.rec, r.version = rec, res.revision

    async def _reload(self, r: _Replica) -> None:
        """The record changed under this replica — another node's promotion wrote it (this
        node's files of segments it led go into it as copies), or a promotion here took it:
        forget the cached state, so that the next message loads the record and opens its
        files afresh, and checks the log against its leader's again (a copy recorded meanwhile
        may be of another lineage: it is cut then). The caller raises ConflictError."""
        for k, v in list(self._reps.items()):
            if v is r:
                del self._reps[k]

    async def _version(self, key: str) -> int:
        e = await self.catalog.get(key)
        if e is None:
            raise RowstoreError(f"{key} vanished")
        return e.version

    async def close(self) -> None:
        for r in self._reps.values():
            for f in r.files.values():
                await f.close()
        self._reps.clear()
