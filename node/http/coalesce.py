"""Concurrent small writes to one table become one engine batch (docs/rfcs/0008-point-writes.md).

Each request is checked and encoded on its own (``node.http.fast_encoder``: a request the fast
encoder is unsure of takes the full path alone, so a bad request fails alone and answers
with the full path's error). Requests then queue per table; one committer per table takes
everything queued as one group:

* requests whose rows all fall in one partition (every single-row write) are merged per
  partition into one piece — one append and one group-commit fdatasync per partition
  touched — each piece one atomic record (a request lies wholly in one piece, so it commits
  all or nothing), each request with its own commit timestamp stamped into its rows;
* a request spanning partitions is its own atomic batch (the engine's two-phase group
  commit already merges those);
* two requests of one group never write the same key: the later one waits for the next
  group, so a request's ``commit_ts`` reads back exactly its own rows.

The window is adaptive, with no timer: a group starts at once when none of its table is in
flight, else once the previous one is done — or, when PIPELINE_AT requests are already
waiting, right away (up to MAX_GROUPS in flight, so one slow fdatasync does not stall the
table). A lone client finds the queue empty and commits at once; under load, groups grow
with the time a commit takes.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from collections.abc import Awaitable
from typing import Any, cast

import numpy as np
import pyarrow as pa

from node.wire import column_from_json
from node.http.fast_encoder import NotFast, encoder, index_key
from node.metrics import Metrics
from rowstore.codec.rows import Encoded
from rowstore.db.database import Database
from rowstore.db.write.committer import WriteResult
from rowstore.errors import InvalidKeyError
from rowstore.tables.conform import PartitionShare
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import check_key
from rowstore.tables.keys import partition_one
from rowstore.schema import Column

log = logging.getLogger("terrascale.node")
FAST_ROWS = 64  # requests with more rows take the full (vectorized) path
GROUP_ROWS = 8192  # rows one group commits at most
MAX_GROUPS = 4  # groups of one table in flight at most (their fdatasyncs overlap)
PIPELINE_AT = 16  # queued requests that start another group while one is in flight


@dataclass
class _Request:
    d: TableDef
    rows: list[bytes]  # encoded rows
    keys: list[int | bytes]  # the index's key scalars
    objs: list[Any]  # JSON objects (None for a tombstone): the column index's values
    pids: list[int]
    deleted: bool
    fut: asyncio.Future[WriteResult]
    t0: float = field(default_factory=time.perf_counter)


@dataclass
class _Queue:
    pending: list[_Request] = field(default_factory=list)
    running: bool = False


class Coalescer:
    def __init__(self, db: Database, metrics: Metrics | None = None):
        self.db, self.metrics = db, metrics
        self._queues: dict[str, _Queue] = {}

    # -- the requests --------------------------------------------------------------------------

    async def upsert(self, d: TableDef, rows: object) -> WriteResult | None:
        """Upsert JSON rows (a request's ``"rows"``); None when the full path must take them."""
        req = self.prepare(d, rows, False)
        return None if req is None else await self.submit(req)

    async def delete(self, d: TableDef, keys: object) -> WriteResult | None:
        """Delete by JSON key values; None when the full path must take them."""
        req = self.prepare(d, keys, True)
        return None if req is None else await self.submit(req)

    def prepare(self, d: TableDef, items: object, deleted: bool) -> _Request | None:
        """The request encoded (rows, keys checked, partitions), or None for the full path. In
        a cluster the router routes by its ``pids`` before anything else is done with it."""
        t0 = time.perf_counter()
        schema = d.schema
        assert schema is not None  # a live table's definition (Database.describe)
        enc = encoder(schema)
        if enc is None or not isinstance(items, list) or not 0 < len(items) <= FAST_ROWS:
            self._full()
            return None
        key = schema.pk.columns[0]  # an encoder exists: a key of one int64, string or uuid column
        fn, kind, nparts = (enc.tombstone if deleted else enc.row), schema.pk.kind, d.partitions
        rows: list[bytes] = []
        keys: list[int | bytes] = []
        pids: list[int] = []
        try:
            for r in items:
                if not deleted and type(r) is not dict:
                    self._full()
                    return None
                b, k = fn(r)
                ik = index_key(check_key(k, key, text=False), kind)  # the one key check
                rows.append(b)
                keys.append(ik)
                pids.append(partition_one(ik, nparts))
        except (NotFast, InvalidKeyError):  # the full path answers with its error
            self._full()
            return None
        if len(set(keys)) != len(keys):
            self._full()  # the last row of a key wins: the full path sorts that out
            return None
        self._stage("encode", t0)
        fut: asyncio.Future[WriteResult] = asyncio.get_running_loop().create_future()
        return _Request(d, rows, keys, [None] * len(rows) if deleted else items, pids, deleted, fut)

    def _full(self) -> None:
        if self.metrics is not None:
            self.metrics.write_path.labels("full").inc()

    async def submit(self, req: _Request) -> WriteResult:
        """Commit a prepared request with the group it joins; its own result."""
        q = self._queues.get(req.d.table_id)
        if q is None:
            q = self._queues[req.d.table_id] = _Queue()
        q.pending.append(req)
        if not q.running:
            q.running = True
            asyncio.ensure_future(self._drain(q))
        return await req.fut

    # -- the committer -------------------------------------------------------------------------

    async def _drain(self, q: _Queue) -> None:
        inflight: set[asyncio.Task[None]] = set()
        try:
            while q.pending or inflight:
                if q.pending and (not inflight or len(inflight) < MAX_GROUPS and len(q.pending) >= PIPELINE_AT):
                    d, group = self._take(q)
                    inflight.add(asyncio.ensure_future(self._commit_group(d, group)))
                    continue
                _, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        finally:
            q.running = False
            for t in inflight:
                t.cancel()
            if q.pending:  # cancelled with requests waiting: they fail rather than hang
                for r in q.pending:
                    if not r.fut.done():
                        r.fut.set_exception(ConnectionError("the node is stopping"))
                q.pending = []

    @staticmethod
    def _take(q: _Queue) -> tuple[TableDef, list[_Request]]:
        """The next group: queued requests in order, of one table definition, at most
        GROUP_ROWS rows, no key twice (a later request of a key waits for the next group)."""
        group: list[_Request] = []
        rest: list[_Request] = []
        seen: set[int | bytes] = set()
        rows = 0
        d = q.pending[0].d
        for r in q.pending:
            if r.d is not d or rows + len(r.rows) > GROUP_ROWS or not seen.isdisjoint(r.keys):
                rest.append(r)
                continue
            group.append(r)
            seen.update(r.keys)
            rows += len(r.rows)
        q.pending = rest
        return d, group

    async def _commit_group(self, d: TableDef, group: list[_Request]) -> None:
        try:
            await self._commit(d, group)
        except BaseException as e:
            for r in group:
                if not r.fut.done():
                    r.fut.set_exception(e)
            if not isinstance(e, Exception):
                raise

    async def _commit(self, d: TableDef, group: list[_Request]) -> None:
        t0 = time.perf_counter()
        m = self.metrics
        if m is not None:
            m.write_path.labels("coalesced").inc(len(group))
            m.group_requests.observe(len(group))
            m.queue_seconds.inc(sum(t0 - r.t0 for r in group))
        single: dict[int, list[_Request]] = {}
        multi: list[_Request] = []
        for r in group:
            if len(set(r.pids)) == 1:
                single.setdefault(r.pids[0], []).append(r)
            else:
                multi.append(r)
        schema = d.schema
        assert schema is not None  # the definition its requests were prepared with
        kind = schema.pk.kind
        indexed = [c for c in schema.columns if c.id in d.indexes and c.id not in schema.primary_key]
        pieces = [self._piece(pid, [(r, i) for r in reqs for i in range(len(r.rows))], kind, indexed)
                  for pid, reqs in sorted(single.items())]
        existed = await self._existing(d, [(p, [r for r in single[p.pid]]) for p in pieces])
        jobs: list[Awaitable[Any]] = [self.db.write_pieces(d, pieces, [[len(r.rows) for r in single[p.pid]]
                                                                       for p in pieces])]
        for r in multi:
            by_pid: dict[int, list[tuple[_Request, int]]] = {}
            for i, pid in enumerate(r.pids):
                by_pid.setdefault(pid, []).append((r, i))
            rp = [self._piece(pid, ri, kind, indexed) for pid, ri in sorted(by_pid.items())]
            existed.update(await self._existing(d, [(p, [r]) for p in rp]))
            jobs.append(self.db.write_pieces(d, rp))
        got = await asyncio.gather(*jobs, return_exceptions=True)
        if isinstance(got[0], BaseException):
            raise got[0]
        for p, tss in zip(pieces, got[0]):
            for j, r in enumerate(single[p.pid]):
                _answer(r, tss if isinstance(tss, BaseException) else tss[j], existed.get(id(r)))
        for r, tss in zip(multi, got[1:]):
            _answer(r, tss if isinstance(tss, BaseException) else tss[0], existed.get(id(r)))
        self._stage("commit", t0)

    def _piece(self, pid: int, members: list[tuple[_Request, int]], kind: str, indexed: list[Column]) -> PartitionShare:
        """One partition's rows of several requests (``members``: (request, row index))."""
        rows = [r.rows[i] for r, i in members]
        starts = np.zeros(len(rows), np.int64)
        np.cumsum([len(b) for b in rows[:-1]], out=starts[1:])
        buf = np.frombuffer(bytearray(b"".join(rows)), np.uint8)  # writable: stamped in place
        keys = [r.keys[i] for r, i in members]
        karr = np.array(keys, np.uint64) if kind == "int64" else np.array(
            keys, f"S{max(map(len, cast(list[bytes], keys)))}")  # not int64: bytes keys (encode_one)
        dels = [r.deleted for r, _ in members]
        deleted = np.array(dels, bool) if any(dels) else None
        batch = None
        if indexed:  # the column index's values (nulls for tombstones, which it skips)
            objs = [r.objs[i] for r, i in members]
            batch = pa.RecordBatch.from_arrays(
                [column_from_json([None if o is None else o.get(c.name) for o in objs], c) for c in indexed],
                schema=pa.schema([c.field() for c in indexed]))
        return PartitionShare(pid, karr, deleted, Encoded(buf, starts), batch, None)

    async def _existing(self, d: TableDef, pieces: list[tuple[PartitionShare, list[_Request]]]) -> dict[int, int]:
        """Per delete request (by id): how many of its keys have a live row now."""
        out: dict[int, int] = {}
        for p, reqs in pieces:
            if p.deleted is None:
                continue
            live = await self.db.existing(d, p.pid, p.keys)
            at = 0
            for r in reqs:
                n = sum(1 for pid in r.pids if pid == p.pid)
                if r.deleted:
                    out[id(r)] = out.get(id(r), 0) + int(np.count_nonzero(live[at : at + n]))
                at += n
        return out

    def _stage(self, stage: str, t0: float) -> None:
        if self.metrics is not None:
            self.metrics.write_stage.labels(stage).inc(time.perf_counter() - t0)


def _answer(r: _Request, ts: int | BaseException, existed: int | None) -> None:
    if r.fut.done():
        return
    if isinstance(ts, BaseException):
        r.fut.set_exception(ts)
    else:
        count = existed if r.deleted else len(r.rows)
        assert count is not None  # a delete's rows are all tombstones, so _existing counted it
        r.fut.set_result(WriteResult(count, ts))
