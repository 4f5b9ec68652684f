"""Copy-forward garbage collection with clustered rewrites (docs/rfcs/0009-gc.md).

A pass, per table partition: checkpoint the key memtable; under the partition index's
publish lock merge and purge every run at the horizon (the mark pass's input); mark live
rows per segment (a numba kernel); pick victims; copy their live rows, in cluster order, into
new offloaded segments (each created with a ``gc/pending`` row); publish — the new index runs,
the new segments' rows and the victims RETIRED — in one catalog transaction. Then dropped
tables are retired, and retired segments past ``grace`` that no read lease names are deleted.
Every step has a fail point (``gc.after_*``) so tests can crash the pass there.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from catalog.abc import Check, Delete, Entry, Op, Put
from rowstore.db.background.aging import Aging, floor_of
from rowstore.db.read.leases import Leases
from rowstore.db.registry import TableRegistry
from rowstore.errors import ConflictError, UnavailableError
from rowstore.hlc import ms_of
from rowstore.index.key_manifest import Manifest
from rowstore.index.key_memtable import Run
from rowstore.rowids import TOMBSTONE, rowids as make_rowids
from rowstore.schema import SchemaVersion
from rowstore.segments.relocate import ClusterSpec, Copy, VictimRows, mark_live, piece_stream, plan_copy, read_live
from rowstore.db.read.leaderless import WATERMARK_PREFIX
from rowstore.replication.epochs import EPOCHS_PREFIX
from rowstore.segments.records import PENDING_PREFIX, SEQ_FLOOR_PREFIX, SegmentRecord, SegState
from rowstore.segments.store import SegmentStore
from rowstore.tables.definitions import TableCatalog, TableDef
from rowstore.db.partition import Partition
from rowstore.timeline import Timeline
from terrafs.catalog_ops import commit
from terrafs.errors import InodeNotFoundError
from terrafs.failpoints import failpoint

log = logging.getLogger("rowstore.db.gc")
RECLAIM_PREFIX = "gc/drop/"  # gc/drop/<table id>: the node reclaiming a dropped table (docs/format/segment.md §5)
RECLAIM_TAKEOVER_S = 600.0  # a reclaim row untouched this long is taken over by another node
Marks = dict[int, tuple[int, np.ndarray]]  # segid -> (live rows, its live bitmap): mark_live()'s


@dataclass(frozen=True)
class GcConfig:
    min_garbage: float = 0.5  # a segment whose garbage ratio is at least this is a victim
    grace_s: float = 300.0  # a retired segment's object outlives its retirement this long
    max_bytes_per_run: int = 1 << 30  # victims' bytes per pass (at least one victim)


@dataclass
class _Pass:
    """What one pass did (the admin API's answer)."""

    dry_run: bool
    segments_collected: int = 0
    rows_copied: int = 0
    bytes_reclaimed: int = 0

    def __post_init__(self) -> None:
        self.budget: int | None = None  # victims' bytes this pass may still take
        self.retired: list[int] = []
        self.deleted: list[int] = []
        self.victims: list[dict[str, Any]] = []

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"job": "gc", "segments_collected": self.segments_collected,
                               "rows_copied": self.rows_copied, "bytes_reclaimed": self.bytes_reclaimed,
                               "retired": self.retired, "deleted": self.deleted}
        if self.dry_run:
            out["dry_run"] = True
            out["victims"] = self.victims
        return out


class GarbageCollector:
    def __init__(self, store: SegmentStore, definitions: TableCatalog, tables: TableRegistry, timeline: Timeline,
                 leases: Leases, horizon: Callable[[], int], offload: Callable[[], Awaitable[dict[str, Any]]],
                 cfg: GcConfig = GcConfig()):
        self.store, self.definitions, self.tables, self.timeline = store, definitions, tables, timeline
        self.leases, self.horizon, self.offload, self.cfg = leases, horizon, offload, cfg
        self._lock = asyncio.Lock()  # one pass at a time
        self._reclaiming: set[str] = set()  # dropped table ids whose shared parts this node reclaims
        # (table id, partition) -> (what it looked like, the ts at which garbage can next appear)
        # after a pass found no victim there: an idle partition is not re-read every interval
        self._idle: dict[tuple[str, int], tuple[tuple[bytes, frozenset[int], int | None, float], int]] = {}
        self.totals: dict[str, float] = {"runs": 0, "rows_copied": 0, "bytes_reclaimed": 0, "run_seconds": 0.0,
                       "segments_collected": 0, "segments_deleted": 0, "bytes_copied": 0,
                       "retention_segments_dropped": 0, "retention_bytes_dropped": 0}
        self.aging = Aging(store)  # the retention's step of the mark pass, with the ranges it learned
        self.phases = dict.fromkeys(("checkpoint", "mark", "read", "order", "write", "publish", "delete"), 0.0)

    async def recover(self) -> list[int]:
        """At open: delete the copies of a pass that crashed before publishing them."""
        return await self.store.drop_pending()

    def gc_horizon(self) -> int:
        """Versions at or below it that are superseded are garbage (RFC 0009: H): the purge
        horizon, which already trails the closed timestamp."""
        return min(self.horizon(), self.timeline.closed)

    async def run(self, table: str | None = None, dry_run: bool = False) -> dict[str, Any]:
        """One pass over every open table (or ``table``); a dry run only reports victims."""
        async with self._lock:
            t0 = time.perf_counter()
            res = _Pass(dry_run)
            res.budget = self.cfg.max_bytes_per_run
            tid = None if table is None else (await self.definitions.describe(table)).table_id
            if not dry_run:
                await self.offload()
            H = self.gc_horizon()
            dropped = await self._dropped()  # reclaimed whole (below), never collected partition by partition
            for t in self.tables.opened():
                d = self.tables.definition(t.table_id)
                if d is None or (tid is not None and t.table_id != tid) or t.table_id in dropped:
                    continue
                for p in t.served():  # only what this node serves (RFC 0009, "Who collects")
                    try:
                        await self._partition(d, p, H, res)
                    except Exception as e:
                        # a partition this node stopped serving meanwhile (an election or a hand-off
                        # moved it) fails in whatever step met the change first — a conflict, a
                        # segment released or sealed under it: abandoned, not an error of the pass
                        if not isinstance(e, (ConflictError, UnavailableError)) and self._serves(p):
                            raise
                        log.warning("event=gc_partition_abandoned table=%s partition=%d reason=%r", d.name, p.pid, e)
            if not dry_run:
                await self._retire_dropped(dropped, tid, H, res)
                failpoint("gc.after_retire")
                t1 = time.perf_counter()
                await self._delete_retired(dropped, tid, res)
                self.phases["delete"] += time.perf_counter() - t1
                self._count(res, time.perf_counter() - t0)
            return res.to_dict()

    def _count(self, res: _Pass, seconds: float) -> None:
        tot = self.totals
        tot["runs"] += 1
        tot["rows_copied"] += res.rows_copied
        tot["bytes_reclaimed"] += res.bytes_reclaimed
        tot["segments_collected"] += res.segments_collected
        tot["segments_deleted"] += len(res.deleted)
        tot["run_seconds"] += seconds
        busy = res.segments_collected or res.deleted or res.retired
        log.log(logging.INFO if busy else logging.DEBUG,
                "event=gc_pass collected=%d rows_copied=%d bytes_reclaimed=%d deleted=%d seconds=%.3f",
                res.segments_collected, res.rows_copied, res.bytes_reclaimed, len(res.deleted), seconds)

    async def garbage_ratio(self) -> float:
        """1 - live bytes / bytes over every sealed, offloaded and retired segment."""
        recs = [r for r in await self.store.list() if r.state != SegState.ACTIVE]
        total = sum(r.bytes for r in recs)
        live = sum(r.live_bytes for r in recs if r.state != SegState.RETIRED)
        return 0.0 if total == 0 else 1.0 - live / total

    # -- one partition ---------------------------------------------------------------------------

    async def _partition(self, d: TableDef, p: Partition, H: int, res: _Pass) -> None:
        t0 = time.perf_counter()
        if not res.dry_run:
            await p.checkpoint()  # every entry of a sealed segment into the runs
        self.phases["checkpoint"] += time.perf_counter() - t0
        async with p.index.rewrite_lock, p.index.publish_lock:  # no merge rewrites the runs meanwhile
            if not self._serves(p):
                return  # another node took the partition meanwhile (leadership, handoff)
            t0 = time.perf_counter()
            recs = await p.segments()
            counted = {r.segid: r for r in recs if r.state == SegState.OFFLOADED}
            state = (p.index.manifest.to_bytes(), frozenset(counted), d.cluster_by, self.cfg.min_garbage)
            idle = self._idle.get((p.table_id, p.pid))
            floor = floor_of(await self.definitions.history(d.name), d, H)  # retention: rows age as time passes
            if not res.dry_run and idle is not None and idle[0] == state and H < idle[1] and floor is None:
                return  # nothing changed since a pass found no victim, and nothing turned to garbage since
            merged = await p.index.gc_view(H, with_memtable=res.dry_run)
            aged: dict[int, int] = {}
            if floor is not None:  # the versions no read at or after H sees: not live (RFC 0016 §5)
                assert d.schema is not None  # the registry's newest definition with a schema
                merged, aged = await self.aging.without_aged((p.table_id, p.pid), merged, floor, H, set(counted),
                                                             d.schema,
                                                             await self.tables.schemas_of(d))
            marks = await asyncio.to_thread(mark_live, merged.rowids, {s: r.rows for s, r in counted.items()})
            for segid, r in counted.items():  # deletion rows above the horizon: live, unreferenced
                if r.deletions and r.deletions_max_ts > H:
                    marks[segid] = (marks[segid][0] + r.deletions, marks[segid][1])
            self.phases["mark"] += time.perf_counter() - t0
            mark = [0, 0, 2**62] if res.dry_run else p.index.manifest.mark  # dry: the memtable is in the view
            victims = self._victims(d, recs, counted, marks, mark, res)
            if res.dry_run:
                res.victims += [{"segid": r.segid, "table": d.name, "partition": p.pid, "rows": r.rows,
                                 "live_rows": marks[r.segid][0], "bytes": r.bytes,
                                 "garbage_ratio": round(_ratio(r, marks), 4)} for r in victims]
                return
            if not victims:
                await self._update_live(counted, marks)
                if floor is None:
                    self._idle[(p.table_id, p.pid)] = (state, _next_garbage(merged, counted, H))
                return
            new, old_ids, new_ids = await self._copy(d, p, victims, marks, H)
            failpoint("gc.after_copy")
            t0 = time.perf_counter()
            checks, ops = await self._publish_ops(counted, marks, victims, new)
            top = await self.store.next_seq(p.table_id, p.pid) - 1
            if not new and any(r.seq == top for r in victims):  # no copy carries the highest seq on
                ops.append(self.store.seq_floor_op(p.table_id, p.pid, top))  # (RFC 0009, replay order)
            try:
                await p.index.publish_relocation(merged, old_ids, new_ids, checks, ops)
            except ConflictError:
                await self.store.drop_pending()  # the copies are unreferenced: gone now
                raise
            failpoint("gc.after_publish")
            self.phases["publish"] += time.perf_counter() - t0
            self.totals["bytes_copied"] += sum(r.bytes for r in new)
            res.segments_collected += len(victims)
            res.rows_copied += len(old_ids)
            res.bytes_reclaimed += sum(r.bytes for r in victims) - sum(r.bytes for r in new)
            res.retired += [r.segid for r in victims]
            for r in victims:
                if aged.get(r.segid) and marks[r.segid][0] == 0:  # emptied by the retention: dropped unread
                    self.totals["retention_segments_dropped"] += 1
                    self.totals["retention_bytes_dropped"] += r.bytes
            log.info("event=gc_relocated table=%s partition=%d victims=%s copies=%s rows=%d", d.name, p.pid,
                     [r.segid for r in victims], [r.segid for r in new], len(old_ids))
        await p.index.collect()  # the replaced index runs
        failpoint("gc.after_index_checkpoint")

    def _serves(self, p: Partition) -> bool:
        """Whether ``p`` is (still) the partition object this node serves. Checked under the
        publish lock; the manifest's claim is what makes it hold until the publish."""
        t = self.tables.get(p.table_id)
        return not p.index.moved and t is not None and p.pid in t.owned and t.parts[p.pid] is p

    def _victims(self, d: TableDef, recs: list[SegmentRecord], counted: dict[int, SegmentRecord], marks: Marks,
                 mark: list[int], res: _Pass) -> list[SegmentRecord]:
        """Offloaded segments below the replay mark with enough garbage or not in cluster order;
        most garbage first, within budget."""
        assert res.budget is not None  # run() sets it before the first partition
        mark_seq = (list(mark) + [0, 0, 0])[2]
        cands = []
        for r in counted.values():
            if r.seq >= mark_seq or r.rows == 0:
                continue
            ratio = _ratio(r, marks)
            unclustered = d.cluster_by is not None and not r.copy  # never rewritten in cluster order
            row_wise = self.store.columnar and r.format < 2  # rewritten columnar (docs/format/segment.md §7)
            if ratio >= self.cfg.min_garbage or unclustered or row_wise:
                cands.append((ratio, r))
        cands.sort(key=lambda x: (-x[0], x[1].segid))
        out: list[SegmentRecord] = []
        first = res.budget == self.cfg.max_bytes_per_run  # the pass's first victim goes whatever its size
        for _, r in cands:
            if r.bytes > res.budget and not (first and not out):
                break
            out.append(r)
            res.budget -= r.bytes
        return out

    async def _copy(self, d: TableDef, p: Partition, victims: list[SegmentRecord], marks: Marks,
                    H: int) -> tuple[list[SegmentRecord], np.ndarray, np.ndarray]:
        """Live rows of the victims into new offloaded segments; (records, old rowids sorted,
        new rowids in the same order)."""
        assert d.schema is not None  # the registry's newest definition with a schema
        schemas = await self.tables.schemas_of(d)
        rows: list[VictimRows] = []
        t0 = time.perf_counter()
        for r in victims:
            if marks[r.segid][0] == 0 and r.max_ts <= H:
                continue  # nothing live and nothing above the horizon: retire without reading
            rows.append(await read_live(await self.store.sealed(r.segid), marks[r.segid][1], H, schemas, d.schema))
        t1 = time.perf_counter()
        self.phases["read"] += t1 - t0
        spec = ClusterSpec(d.cluster_column, d.schema.pk)
        copy = await asyncio.to_thread(plan_copy, rows, spec, self.store.seal_bytes)
        t0 = time.perf_counter()
        self.phases["order"] += t0 - t1
        new: list[SegmentRecord] = []
        new_ids: list[np.ndarray] = []
        for a, b in copy.cuts:
            stats: dict[str, Any] = {}
            columnar = self.store.columnar
            rec = await self.store.create_copy(p.table_id, p.pid,
                                               _piece(copy, a, b, schemas, d.schema, spec, stats, columnar), columnar)
            cluster = stats.get("cluster")
            dels, ts = copy.deleted[a:b], copy.commit_ts[a:b]
            new.append(replace(rec, rows=b - a, live_rows=b - a, deletions=int(dels.sum()),
                               deletions_max_ts=int(ts[dels].max()) if dels.any() else 0,
                               min_ts=int(ts.min()), max_ts=int(ts.max()), copy=True,
                               seq=max(r.seq for r in victims),  # below the mark; keeps the highest seq
                               cluster=list(cluster) if cluster is not None else None))
            new_ids.append(make_rowids(rec.segid, np.arange(b - a, dtype=np.uint32)))
        self.phases["write"] += time.perf_counter() - t0
        old = copy.old_rowids
        nid = np.concatenate(new_ids) if new_ids else np.zeros(0, np.uint64)
        order = np.argsort(old, kind="stable")
        return new, old[order], nid[order]

    async def _publish_ops(self, counted: dict[int, SegmentRecord], marks: Marks, victims: list[SegmentRecord],
                           new: list[SegmentRecord]) -> tuple[list[Check], list[Op]]:
        """The segments' part of the publishing transaction: copies in (pending rows out),
        victims RETIRED, live counts of the others."""
        now_ms = self.timeline.clock.now_ms()
        gone = {r.segid for r in victims}
        checks: list[Check] = []
        ops: list[Op] = []
        for segid in counted:
            cur, e = await self.store.record(segid)
            assert isinstance(e, Entry)  # record() gives the segment's catalog entry (annotated object)
            if segid in gone:
                upd = replace(cur, state=SegState.RETIRED, retired_ms=now_ms, live_rows=0, live_bytes=0)
            else:
                upd = _with_live(cur, marks)
                if upd == cur:
                    continue
            checks.append(Check(e.key, e.version))
            ops.append(Put(e.key, upd.to_bytes()))
        for r in new:
            checks.append(Check(r.key, 0))
            ops += [Put(r.key, r.to_bytes()), Delete(f"{PENDING_PREFIX}{r.segid:08x}")]
        return checks, ops

    async def _update_live(self, counted: dict[int, SegmentRecord], marks: Marks) -> None:
        """Live counts of a partition without victims (best effort: a segment row changed
        meanwhile keeps its counts until the next pass)."""
        for segid in counted:
            cur, e = await self.store.record(segid)
            assert isinstance(e, Entry)  # record() gives the segment's catalog entry (annotated object)
            upd = _with_live(cur, marks)
            if upd != cur:
                await commit(self.store.catalog, [Check(e.key, e.version)], [Put(e.key, upd.to_bytes())])

    # -- dropped tables, retired segments -----------------------------------------------------------

    async def _dropped(self) -> dict[str, int]:
        """table id -> commit ts of its drop, for every dropped table id."""
        out = {}
        for e in await self.store.catalog.scan("tbl/"):
            parts = e.key.split("/")
            if len(parts) == 4 and parts[2] == "v":
                td = TableDef.from_entry(parts[1], int(parts[3], 16), e.value)
                if td.dropped:
                    out[td.table_id] = td.ts
        return out

    async def _retire_dropped(self, dropped: dict[str, int], tid: str | None, H: int, res: _Pass) -> None:
        """Retire the segments of a table dropped before the horizon and over ``grace`` ago, and
        delete its index runs (nothing can read them: reads below the horizon are refused).
        Every node retires its own local segments; one node — the one holding the table's
        reclaim row — retires the offloaded ones and deletes the indexes."""
        now_ms = self.timeline.clock.now_ms()
        self._reclaiming = set()
        for table_id, ts in dropped.items():
            if (tid is not None and table_id != tid) or ts > H or now_ms - ms_of(ts) < self.cfg.grace_s * 1000:
                continue
            self.tables.forget(table_id)
            mine = await self._reclaim(table_id, now_ms)
            if mine is None:
                continue  # reclaimed whole already
            if mine:
                self._reclaiming.add(table_id)
            for r in await self.store.list(table=table_id):
                if r.state == SegState.RETIRED or not (r.owner == self.store.node if not r.location else mine):
                    continue
                cur, e = await self.store.record(r.segid)
                assert isinstance(e, Entry)  # record() gives the segment's catalog entry (annotated object)
                upd = replace(cur, state=SegState.RETIRED, retired_ms=int(now_ms), live_rows=0, live_bytes=0)
                done = await commit(self.store.catalog, [Check(e.key, e.version)], [Put(e.key, upd.to_bytes())])
                if done.committed:
                    res.retired.append(r.segid)
            if mine:
                await self._drop_indexes(table_id)

    async def _reclaim(self, table_id: str, now_ms: float) -> bool | None:
        """Whether this node reclaims dropped table ``table_id``'s shared parts (its reclaim row
        ``gc/drop/<table id>`` names this node: taken by compare-and-set when absent, or when
        its holder has not touched it for ``RECLAIM_TAKEOVER_S``); None when it is done."""
        key = f"{RECLAIM_PREFIX}{table_id}"
        e = await self.store.catalog.get(key)
        doc = json.loads(e.value) if e is not None else {}
        if doc.get("done") and not any(r.state != SegState.RETIRED or r.owner == self.store.node
                                       for r in await self.store.list(table=table_id)):
            return None
        if doc.get("node") == self.store.node or (
                not doc.get("done") and (e is None or now_ms - doc.get("at_ms", 0) >= RECLAIM_TAKEOVER_S * 1000)):
            new = {"node": self.store.node, "at_ms": int(now_ms), "done": bool(doc.get("done"))}
            got = await commit(self.store.catalog, [Check(key, e.version if e is not None else 0)],
                               [Put(key, json.dumps(new).encode())])
            return got.committed
        return False

    async def _reclaimed(self, table_id: str) -> None:
        """Mark a dropped table's reclaim done once nothing of it is left but its reclaim row."""
        key = f"{RECLAIM_PREFIX}{table_id}"
        e = await self.store.catalog.get(key)
        if e is None or await self.store.list(table=table_id):
            return
        doc = dict(json.loads(e.value), done=True)
        await commit(self.store.catalog, [Check(key, e.version)], [Put(key, json.dumps(doc).encode())])

    async def _drop_indexes(self, table_id: str) -> None:
        """Delete a dropped table's key and column runs, then its manifests."""
        fs = self.store.fs
        for e in await self.store.catalog.scan(f"idx/{table_id}/"):
            if "/pending/" in e.key:
                await self._drop_run(int(e.key.rsplit("/", 1)[1], 16), e, [Delete(e.key)])
                continue
            if not e.key.endswith("/manifest"):
                continue
            # each run deleted with the manifest minus it: a pass cut short and run again never
            # deletes an inode it freed before, which a new file may have taken since
            m = Manifest.from_bytes(e.value)
            while m.runs or m.garbage:
                if m.runs and m.runs[0].get("cols"):
                    cid, inode = next(iter(m.runs[0]["cols"].items()))
                    cols = {c: i for c, i in m.runs[0]["cols"].items() if c != cid}
                    left = replace(m, runs=[{**m.runs[0], "cols": cols}, *m.runs[1:]])
                elif m.runs:
                    inode, left = m.runs[0]["inode"], replace(m, runs=m.runs[1:])
                else:
                    inode, left = m.garbage[0], replace(m, garbage=m.garbage[1:])
                e = await self._drop_run(inode, e, [Put(e.key, left.to_bytes())])
                m = left
            await commit(fs.catalog, [Check(e.key, e.version)], [Delete(e.key)])
        for prefix in (WATERMARK_PREFIX, EPOCHS_PREFIX, SEQ_FLOOR_PREFIX):  # what its partitions had offloaded,
            # their epochs, their highest seqs
            keys = [e.key for e in await self.store.catalog.scan(f"{prefix}{table_id}/")]
            if keys:
                await commit(self.store.catalog, [], [Delete(k) for k in keys])

    async def _drop_run(self, inode: int, e: Entry, ops: list[Op]) -> Entry:
        """Delete run ``inode`` with ``ops`` (which rewrite the row ``e`` that names it) in one
        transaction checked on ``e``; the row as it is after."""
        checks = [Check(e.key, e.version)]
        try:
            revision = await self.store.fs.delete(inode, checks, ops)
        except InodeNotFoundError as err:  # gone already: only the row still named it
            log.info("event=gc_index_skip inode=%d reason=%r", inode, err)
            res = await commit(self.store.catalog, checks, ops)
            if not res.committed:
                raise ConflictError(f"{e.key} changed while its table's runs were deleted") from err
            revision = res.revision
        put = next((op for op in ops if isinstance(op, Put)), None)
        return e if put is None else replace(e, value=put.value, version=revision)

    async def _delete_retired(self, dropped: dict[str, int], tid: str | None, res: _Pass) -> None:
        """Delete retired segments past ``grace`` that no unexpired read lease names (the leases
        are read again right before each delete: a plan made meanwhile holds its segments).
        Only this node's: those of partitions it serves, and of a dropped table the objects it
        reclaims and its own local files."""
        served = {(t.table_id, p.pid) for t in self.tables.opened() for p in t.served()}
        now_ms = self.timeline.clock.now_ms()
        due = [r for r in await self.store.list() if r.state == SegState.RETIRED
               and (tid is None or r.table == tid) and now_ms - r.retired_ms >= self.cfg.grace_s * 1000
               and ((r.table, r.partition) in served or (r.table in dropped and (
                   r.table in self._reclaiming if r.location else r.owner == self.store.node)))]
        for r in due:
            if r.segid in await self.leases.leased_segments():
                continue
            if await self.store.delete(r.segid):
                failpoint("gc.after_delete")
                res.deleted.append(r.segid)
        for table_id in self._reclaiming:
            await self._reclaimed(table_id)


def _next_garbage(run: Run, counted: dict[int, SegmentRecord], H: int) -> int:
    """The lowest horizon at which this partition can have new garbage without anything else
    changing: the oldest superseding version or deletion above ``H`` (once the horizon
    passes it, what it supersedes is garbage), or a copy's newest deletion row."""
    older = np.zeros(len(run), bool)
    older[:-1] = run.keys[:-1] == run.keys[1:]  # (key asc, ts desc): this entry supersedes the next
    cand = (older | (run.rowids == TOMBSTONE)) & (run.ts > np.uint64(H))
    nxt = [int(run.ts[cand].min())] if cand.any() else []
    nxt += [r.deletions_max_ts for r in counted.values() if r.deletions and r.deletions_max_ts > H]
    return min(nxt, default=2**63)


def _ratio(r: SegmentRecord, marks: Marks) -> float:
    return 1.0 - marks[r.segid][0] / r.rows if r.rows else 1.0


def _with_live(r: SegmentRecord, marks: Marks) -> SegmentRecord:
    live = marks[r.segid][0] if r.segid in marks else r.live_rows
    return replace(r, live_rows=live, live_bytes=r.bytes * live // r.rows if r.rows else 0)


def _piece(copy: Copy, a: int, b: int, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
           spec: ClusterSpec, stats: dict[str, Any], columnar: bool) -> Callable[[int], AsyncIterator[bytes]]:
    """The bytes of copy rows ``[a, b)`` as the object of the segment id the store gives it."""
    def content(segid: int) -> AsyncIterator[bytes]:
        return piece_stream(copy, a, b, segid, schemas, target, spec, stats, columnar)
    return content
