"""A replicated partition's segments changing hands (RFC 0010 §5): the log this node led, the
adoption of a follower's copies as the new leader's segments in one catalog transaction, and
the release of the local files when it stops leading. Mixed into
:class:`rowstore.segments.store.SegmentStore`."""
from __future__ import annotations

import builtins
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, AbstractSet

from catalog.abc import Catalog, Check, Delete, Op, Put
from rowstore.errors import ConflictError, RowstoreError
from rowstore.segments.position import ReplicaRecord, rep_key as rkey
from rowstore.segments.active import ActiveSegment
from rowstore.segments.records import SegmentRecord, SegState
from terrafs.catalog_ops import commit
from terrafs.active import ActiveFile
from terrafs.errors import TerrafsError
from terrafs.fs import TerrascaleFS

log = logging.getLogger("rowstore.segments.store")


class Handover:
    """Leadership of a partition moving between nodes (state: the store's ``active``,
    ``_current``, ``_parts``, ``catalog``, ``fs``, ``node``, ``lost``)."""

    # the store's state read and set here (rowstore.segments.store.SegmentStore)
    fs: TerrascaleFS
    catalog: Catalog
    node: str
    active: dict[int, ActiveSegment]
    _current: dict[tuple[str, int], ActiveSegment]
    _parts: dict[int, tuple[str, int]]
    epochs: dict[tuple[str, int], int]
    lost: set[int]
    not_led: set[tuple[str, int]]

    if TYPE_CHECKING:  # the store's methods used here
        async def list(self, owner: str | None = None, table: str | None = None) -> builtins.list[SegmentRecord]: ...

        async def seal(self, segid: int) -> SegmentRecord: ...

    async def own_log(self, table: str, partition: int) -> tuple[int, tuple[int, int]] | None:
        """(epoch, (seq, durable bytes)) of the partition's segments whose rows name this node —
        the log it led, until a newer leader's promotion moves the rows — or None. A file that
        is gone (a lost disk) counts as holding nothing."""
        recs = [r for r in await self.list(owner=self.node, table=table)
                if r.partition == partition and r.state in (SegState.ACTIVE, SegState.SEALED)]
        if not recs:
            return None
        if any(r.inode in self.lost for r in recs):
            log.warning("event=own_log_lost table=%s partition=%d", table, partition)
            return 0, (0, 0)
        top = max(recs, key=lambda r: r.seq)
        try:
            size = (await self.fs.open_active(top.inode)).durable_size
        except TerrafsError as e:
            log.warning("event=own_log_unreadable segid=%d error=%r", top.segid, e)
            return 0, (0, 0)
        return max(r.epoch for r in recs), (top.seq, size)

    async def adopt(self, table: str, partition: int, epoch: int, copies: dict[int, tuple[int, int]],
                    files: dict[int, ActiveFile], rep_key: str | None, rep_version: int,
                    decide: Callable[[int], Awaitable[bool]] | None = None) -> builtins.list[ActiveSegment]:
        """Become the partition's leader at ``epoch``: in ONE transaction every unsealed
        segment row of the partition names this node and its copy (``copies``: segid ->
        (seq, inode), handed over by the follower side with ``files``), this node's replica
        row (``rep_key``) is deleted, and each previous owner's own files go into its replica
        row, so nothing is orphaned and it knows its log is the old epoch's. Then the copies
        are recovered as active segments (prepared tails decided by ``decide``)."""
        recs = sorted([r for r in await self.list(table=table) if r.partition == partition
                       and r.state in (SegState.ACTIVE, SegState.SEALED)], key=lambda r: r.seq)
        checks: builtins.list[Check] = []
        ops: builtins.list[Op] = []
        olds: dict[str, builtins.list[SegmentRecord]] = {}  # previous owner -> its segments
        for rec in recs:
            e = await self.catalog.get(rec.key)
            assert e is not None  # listed just above
            if rec.owner == self.node:
                ops.append(Put(rec.key, replace(rec, epoch=epoch).to_bytes()))
            elif rec.segid in copies:
                f = files.get(rec.segid)
                if rec.state == SegState.SEALED and f is not None and f.durable_size < rec.bytes:
                    raise RowstoreError(f"segment {rec.segid}: this node's copy holds {f.durable_size} bytes of the "
                                        f"{rec.bytes} sealed; it cannot lead {table}/{partition}")
                mine = replace(rec, owner=self.node, inode=copies[rec.segid][1], epoch=epoch)
                ops.append(Put(rec.key, mine.to_bytes()))
                olds.setdefault(rec.owner, []).append(rec)
            elif rec.state == SegState.ACTIVE or rec.bytes == 0:
                # No copy here of an active segment: begun by an old leader past this log's end,
                # or of another lineage where this log has a segment of its own, or one that
                # never made a byte durable before a later one began (a seal that failed at the
                # disk) — an acknowledged byte would be in the elected log (it holds every one),
                # so nothing of it was acknowledged. Nor of a sealed one that holds no byte (a
                # leader that adopted its own log sealed such an empty segment: no follower
                # ever got a piece of it to copy — simulation seed 4332, every election after
                # choosing a node that could not lead). Its owner keeps the file as a copy, cut
                # when it follows. (A sealed segment with bytes and no copy here is refused below.)
                ops.append(Delete(rec.key))
                olds.setdefault(rec.owner, []).append(rec)
            else:
                raise RowstoreError(f"segment {rec.segid} (seq {rec.seq}, {rec.state.value}) of {table}/{partition} "
                                    f"has no copy here; this node cannot lead the partition")
            checks.append(Check(rec.key, e.version))
        for owner, gone in olds.items():
            k = rkey(table, partition, owner)
            e = await self.catalog.get(k)
            r = ReplicaRecord.from_bytes(e.value, k) if e else ReplicaRecord()
            r.promised = max(r.promised, epoch)
            r.last = max(max(g.epoch for g in gone), 0) if not r.segs else min(r.last, max(g.epoch for g in gone))
            for g in gone:
                r.segs[g.segid] = (g.seq, g.inode)
            checks.append(Check(k, e.version if e else 0))
            ops.append(Put(k, r.to_bytes()))
        if rep_key is not None and rep_version:
            checks.append(Check(rep_key, rep_version))
            ops.append(Delete(rep_key))
        res = await commit(self.catalog, checks, ops)
        if not res.committed:
            raise ConflictError(f"the segments of {table}/{partition} changed during the hand-over; retry")
        self.release_local(table, partition, keep={r.segid for r in recs if r.owner == self.node})
        out = []
        for rec in recs:
            if rec.owner != self.node and rec.segid not in copies:
                continue
            seg = self.active.get(rec.segid)
            if seg is None:
                inode = copies[rec.segid][1] if rec.segid in copies else rec.inode
                f = files.get(rec.segid) or await self.fs.open_active(inode)
                if f.failure is not None:  # its last group failed (a disk error): what is durable counts
                    f = await self.fs.reopen_failed(f)
                seg = await ActiveSegment.recover(rec.segid, f, decide)
                seg.seq = rec.seq
                self.active[rec.segid] = seg
            self._parts[rec.segid] = (table, partition)
            out.append((rec, seg))
        self.epochs[(table, partition)] = epoch
        self.not_led.discard((table, partition))
        live = [seg for rec, seg in out]
        actives = [(rec, seg) for rec, seg in out if rec.state == SegState.ACTIVE]
        for rec, _seg in actives[:-1]:  # the old leader rolled but had not sealed yet
            await self.seal(rec.segid)
        for rec, seg in out:  # a copy of a segment the old leader sealed: the file follows its row
            if rec.state == SegState.SEALED and rec.segid in copies:
                await self.fs.seal(seg.file.inode)
        self._current.pop((table, partition), None)
        if actives:
            self._current[(table, partition)] = actives[-1][1]
        return live

    def release_local(self, table: str, partition: int, keep: AbstractSet[int] = frozenset()) -> builtins.list[int]:
        """Stop treating this node's open segments of the partition as its log (another node
        leads it now); returns their inodes for the caller to close."""
        gone = [sid for sid, tp in self._parts.items() if tp == (table, partition) and sid not in keep]
        inodes = []
        for sid in gone:
            self._parts.pop(sid, None)
            seg = self.active.pop(sid, None)
            if seg is not None:
                inodes.append(seg.file.inode)
        cur = self._current.get((table, partition))
        if cur is not None and cur.segid in gone:
            del self._current[(table, partition)]
        return inodes
