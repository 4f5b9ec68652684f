"""Routing by partition (docs/rfcs/0010-replication.md §2): any node accepts any request.

The node that receives a request hashes its keys to partitions with the format's
partition hash and looks up who serves them (``node/cluster/placement.py``):

* everything on this node: served here — confirmed by the leases of replicated partitions led
  here, by the engine's own set for one-copy ones (only their release moves them), else by a
  fresh look at the placement;
* everything on one other node: the request goes there unchanged (RFC 0007's forward);
* rows on several nodes: one atomic batch across them (``node/cluster/commit.py``);
* a query: every node's partitions read at one snapshot T and merged in key order.

A request that arrives forwarded (``X-Terrascale-Forwarded-By``) is served here or
answered 421 — never forwarded again.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from aiohttp import web

from node.cluster.members import FORWARDED, RemoteError, raise_remote
from node.wire import read_arrow_stream
from node.errors import ApiError, NodeError
from node.cluster.commit import Outcome, commit_across, delete_across
from node.cluster.serving import Serving
from node.metrics import Metrics
from node.phase import Readiness
from node.cluster.placement import Placement, key_partitions as _pids, schema_of
from rowstore.db.database import Database
from rowstore.db.write.by_predicate import Selection
from rowstore.db.write.committer import WriteResult
from rowstore.errors import UnavailableError
from rowstore.tables.conform import conform
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import check_key_columns, check_key_lists, check_key_tuple
from rowstore.tables.keys import key_arrays, partition_of_key

log = logging.getLogger("node.router")
R = TypeVar("R")  # what a request served here answers
L = TypeVar("L")  # a node's share of a read across nodes, asked of it
W = TypeVar("W")  # that share when the partitions' leader does not answer (from their objects)


class Misdirected(NodeError):
    """Raised when a forwarded request names partitions this node does not serve (421)."""


class Router:
    """Made when the node's stores are open (``Api.open``); ``readiness`` turns requests away
    while the node stops, ``metrics`` counts forwards and batches across nodes."""

    def __init__(self, sv: Serving, readiness: Readiness, metrics: Metrics) -> None:
        self.sv, self.cluster, self.readiness, self.metrics = sv, sv.cluster, readiness, metrics

    @property
    def db(self) -> Database:
        if not self.readiness.ready:  # an internal call from a node that saw this one up (a restart)
            raise ApiError(503, "not_ready", "the node is starting or stopping (see /readyz)")
        return self.sv.db

    @property
    def multi(self) -> bool:
        return self.cluster.multi

    async def placement(self, d: TableDef, fresh: bool = False) -> Placement:
        return await self.cluster.placement(d.name, d.partitions, fresh=fresh)

    async def _where(self, request: web.Request, d: TableDef, pids: np.ndarray, fresh: bool = False) -> str | None:
        """The one node serving all of ``pids`` (None: several). Serving here is confirmed by
        the leases of replicated partitions led here (no other leader while a majority answered
        within the lease), the engine's set of one-copy ones, or a fresh look; a forwarded
        request for partitions elsewhere is Misdirected."""
        if self._leased_here(d, pids):
            return self.cluster.node_id
        pl = await self.placement(d, fresh)
        nodes = {pl.leader(int(p)) for p in pids}
        forwarded = FORWARDED in request.headers
        if not forwarded and not fresh and self._owned_here(d, pl, pids):
            return self.cluster.node_id
        if forwarded or self.cluster.node_id in nodes:
            pl = await self.placement(d, fresh=True)
            nodes = {pl.leader(int(p)) for p in pids}
        if forwarded and nodes != {self.cluster.node_id}:
            raise Misdirected(f"table {d.name!r}: partitions {sorted(set(map(int, pids)))} are served by "
                              f"{', '.join(sorted(nodes))}")
        return nodes.pop() if len(nodes) == 1 else None

    def _owned_here(self, d: TableDef, pl: Placement, pids: np.ndarray) -> bool:
        """One-copy partitions the engine serves: only their release here moves them (retired,
        every write refused, before the placement switches; no election without their one
        replica), so no linearizable placement read (a Raft barrier) is needed per request."""
        t, me = self.db.tables.get(d.table_id), self.cluster.node_id
        return t is not None and len(pids) > 0 and all(
            int(p) < len(pl.partitions) and pl.partitions[int(p)].replicas == (me,) and int(p) in t.owned
            for p in pids)

    def _leased_here(self, d: TableDef, pids: np.ndarray) -> bool:
        lead = self.db.leadership
        for p in pids:
            sh = lead.shipper(d.table_id, int(p))
            if sh is None or not sh.lease_ok():
                return False
        return len(pids) > 0

    async def _forward(self, request: web.Request, d: TableDef, who: str, pids: np.ndarray) -> web.Response | None:
        """The answer of ``who``; None when, after a 421, a fresh placement says the request
        is no longer for one other node (the caller routes it again)."""
        self.metrics.forwarded.labels(who).inc()

        async def again() -> str:
            return await self._where(request, d, pids, fresh=True) or self.cluster.node_id
        return await self.cluster.forward(request, who, await request.read(), again)

    async def dispatch(self, request: web.Request, d: TableDef, pids: np.ndarray, here: Callable[[], Awaitable[R]],
                        across: Callable[[], Awaitable[R]]) -> tuple[web.Response | None, R | None]:
        """Route by the partitions ``pids``: ``here()`` when this node serves them all, the
        request forwarded when one other node does, ``across()`` when several do."""
        fresh = False
        for _ in range(2):
            who = await self._where(request, d, np.unique(pids), fresh)
            if who == self.cluster.node_id:
                return None, await here()
            if who is None:
                return None, await across()
            resp = await self._forward(request, d, who, np.unique(pids))
            if resp is not None:
                return resp, None
            fresh = True
        raise ConnectionError(f"table {d.name!r}: the placement keeps changing; retry")

    async def served_here(self, table: str, rows: pa.Table, delete: bool) -> None:
        """A participant's check: every row of a reservation hashes to a partition led here."""
        d = await self.db.describe(table)
        pk = schema_of(d).pk
        if delete:
            pids = _pids(d, check_key_columns(key_arrays(pk, rows), pk))
        else:
            pids = _pids(d, conform(rows, schema_of(d)))
        await self._mine(d, np.unique(pids))

    async def _mine(self, d: TableDef, pids: Iterable[int] | np.ndarray) -> None:
        pl = await self.placement(d, fresh=True)
        others = sorted({int(p) for p in pids if pl.leader(int(p)) != self.cluster.node_id})
        if others:
            raise Misdirected(f"table {d.name!r}: partitions {others} are not served by {self.cluster.node_id}")

    async def mine(self, table: str, pids: list[int]) -> None:
        """Misdirected unless every partition of ``pids`` is led here (fresh)."""
        d = await self.db.describe(table)
        if any(p >= d.partitions for p in pids):
            raise Misdirected(f"table {table!r} has partitions 0..{d.partitions - 1}")
        await self._mine(d, pids)

    async def local_read(self, table: str, pids: list[int], T: int, where: Any, bbox: Any,
                         limit: int | None) -> tuple[pa.Table, int]:
        """This node's share of a read across nodes, at the coordinator's T."""
        await self.mine(table, pids)
        return await self.db.query(table, where=where, bbox=bbox, limit=limit, as_of=T, partitions=pids,
                                   trusted=True)

    async def whole_table(self, request: web.Request, table: str) -> web.Response | None:
        """Requests about a whole table that are not scattered (the bridge's snapshot, plan and
        change feed; a partition's tail): to the one node serving every partition (or the
        named one), else None — served here."""
        if not self.multi:
            return None
        d = await self.db.describe(table)
        pids = np.arange(d.partitions)
        if request.path.endswith("/tail"):
            try:
                p = json.loads(await request.read()).get("partition")
            except (ValueError, AttributeError):
                return None  # the handler answers the bad body
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < d.partitions:
                return None
            pids = np.array([p])
        who = await self._where(request, d, pids)
        if who is None or who == self.cluster.node_id:
            return None
        plan = request.path.endswith("/plan")
        try:
            resp = await self._forward(request, d, who, pids)
        except ConnectionError:
            if not plan:
                raise
            return None  # planned here: the partitions' objects, without their leader (§6)
        return None if plan and resp is not None and resp.status == 503 else resp

    # -- writes ---------------------------------------------------------------------------------

    async def upsert(self, request: web.Request, table: str,
                     data: pa.Table) -> tuple[web.Response | None, tuple[int, int] | None]:
        """(forwarded response, None) or (None, (count, commit_ts))."""
        d = await self.db.describe(table)
        if not self.multi or data.num_rows == 0:
            res = await self.db.upsert(table, data)
            return None, (res.count, res.commit_ts)
        batch = conform(data, schema_of(d))  # bad rows are refused here, before anything moves
        return await self.write(request, d, _pids(d, batch), lambda: self.db.upsert(table, batch), lambda: batch,
                                False)

    async def delete(self, request: web.Request, table: str,
                     keys: list[Any]) -> tuple[web.Response | None, tuple[int, int] | None]:
        d = await self.db.describe(table)
        if not self.multi or not keys:
            res = await self.db.delete(table, keys)
            return None, (res.count, res.commit_ts)
        pk = schema_of(d).pk
        karrs = check_key_lists(keys, pk)
        return await self.write(request, d, _pids(d, karrs), lambda: self.db.delete(table, keys),
                                lambda: pa.RecordBatch.from_arrays(karrs, names=pk.names), True)

    async def delete_where(self, request: web.Request, table: str,
                           spec: dict[str, Any]) -> tuple[web.Response | None, tuple[int, int] | None]:
        """A delete by predicate (RFC 0016 §6), refused here if its terms are bad, then run where
        the partitions it can match are led: here, forwarded to the one node leading them all,
        or across every leader."""
        d = await self.db.describe(table)
        if not self.multi:
            res = await self.db.delete_where(table, **spec)
            return None, (res.count, res.commit_ts)
        schema = schema_of(d)
        sel = Selection.parse(schema, spec.get("where"), spec.get("bbox"), spec.get("prefix"))
        pids = np.asarray(sel.partitions(schema, d.partitions, set(range(d.partitions))), np.int64)

        async def here() -> tuple[int, int]:  # every partition it routed here, or a 503: never fewer
            res = await self.db.delete_where(table, **spec, pids=pids.tolist())
            return res.count, res.commit_ts

        async def across() -> tuple[int, int]:
            try:
                out = await delete_across(self.sv, d, spec, pids.tolist(), await self.placement(d, fresh=True))
            except BaseException:
                self.metrics.txn_across.labels("failed").inc()
                raise
            self.metrics.txn_across.labels("committed").inc()
            return out.existed, out.commit_ts
        return await self.dispatch(request, d, pids, here, across)

    async def write(self, request: web.Request, d: TableDef, pids: list[int] | np.ndarray,
                    commit: Callable[[], Awaitable[WriteResult]], batch_of: Callable[[], pa.RecordBatch],
                    delete: bool) -> tuple[web.Response | None, tuple[int, int] | None]:
        """A write whose rows fall in partitions ``pids`` (checked already), routed:
        ``commit()`` when this node serves them all, the request forwarded as it came when one
        other node does, ``batch_of()`` (the rows, or for a delete the keys, as Arrow)
        committed across when several do. A small JSON write comes here prepared by the
        coalescer (RFC 0008), so the usual path converts no row twice."""
        pids = np.asarray(pids, np.int64)

        async def here() -> tuple[int, int]:
            res = await commit()
            return res.count, res.commit_ts

        async def across() -> tuple[int, int]:
            out = await self._across(d, batch_of(), pids, delete)
            return (out.existed if delete else out.rows), out.commit_ts
        return await self.dispatch(request, d, pids, here, across)

    async def _across(self, d: TableDef, batch: pa.RecordBatch, pids: np.ndarray, delete: bool) -> Outcome:
        try:
            out = await commit_across(self.sv, d, batch, pids, await self.placement(d, fresh=True), delete)
        except BaseException:
            self.metrics.txn_across.labels("failed").inc()
            raise
        self.metrics.txn_across.labels("committed").inc()
        return out

    # -- reads ----------------------------------------------------------------------------------

    async def get(self, request: web.Request, d: TableDef, key: object) -> web.Response | None:
        """The forwarded response, or None: read here."""
        if not self.multi:
            return None
        pk = schema_of(d).pk
        pids = np.array([partition_of_key(pk, check_key_tuple(key, pk), d.partitions)])

        async def here() -> None:
            return None

        async def across() -> None:
            raise AssertionError("one key is in one partition")
        resp, _ = await self.dispatch(request, d, pids, here, across)
        return resp

    async def query(self, request: web.Request, table: str, where: Any, bbox: Any, columns: Any, limit: int | None,
                    as_of: int | None) -> tuple[web.Response | None, tuple[pa.Table, int] | None]:
        """(forwarded response, None) or (None, (rows, T))."""
        d = await self.db.describe(table)

        async def here() -> tuple[pa.Table, int]:
            return await self.db.query(table, where=where, bbox=bbox, columns=columns, limit=limit, as_of=as_of,
                                       partitions=self.every_partition(d))
        if not self.multi:
            return None, await here()

        async def across() -> tuple[pa.Table, int]:
            return await self._scatter(d, where, bbox, columns, limit, as_of)
        try:
            resp, out = await self.dispatch(request, d, np.arange(d.partitions), here, across)
        except (ConnectionError, UnavailableError):
            if as_of is None:
                raise
            return None, await across()  # as of a given T: partitions without a leader from their objects
        if resp is not None and resp.status == 503 and as_of is not None:
            return None, await across()
        return resp, out

    async def cluster_ts(self, nodes: Iterable[str]) -> int:
        """A read timestamp that sees every commit acknowledged anywhere before now: the
        largest present of ``nodes`` (``Database.present_ts``: the closed timestamp, or above it
        a floor no read of the present goes below; each observes this node's clock first)."""
        mine = self.db.present_ts

        async def closed(n: str) -> int:
            if n == self.cluster.node_id:
                return mine
            status, _, payload = await self.cluster.call(n, "GET", f"/v1/internal/closed?observe={mine}")
            if status != 200:
                raise_remote(status, payload, n)
            doc = json.loads(payload)
            return int(doc.get("present_ts", doc["closed_ts"]))  # a node of an older version: its closed
        return max(await asyncio.gather(*(closed(n) for n in nodes)))

    async def _scatter(self, d: TableDef, where: Any, bbox: Any, columns: Any, limit: int | None,
                       as_of: int | None) -> tuple[pa.Table, int]:
        """Every node's partitions at one T, merged in key order (RFC 0010 §4)."""
        pl = await self.placement(d, fresh=True)
        by_node = pl.by_node()
        if as_of is None:
            T = await self.cluster_ts(sorted(by_node))
        else:
            T = await self.db.snapshot(as_of)  # the caller's T: checked against the horizon here
        if columns is not None:  # checked here once, with the schema of T
            td = await self.db.describe(d.name, T, trusted=True)
            missing = [c for c in columns if not isinstance(c, str) or schema_of(td).by_name(c) is None]
            if not isinstance(columns, list) or missing:
                from rowstore.errors import QueryError
                raise QueryError(f"no column {missing[0]!r}" if missing else "columns must be a list of names")

        async def read(n: str, pids: list[int]) -> pa.Table:
            try:
                return await share(n, pids)
            except (ConnectionError, UnavailableError, RemoteError) as e:
                if as_of is None or not unled(e):
                    raise
                log.info("event=read_without_leader table=%s node=%s partitions=%s", d.name, n, pids)
                return await self.db.query_without_leader(d.name, T, pids, where, bbox, limit)

        async def share(n: str, pids: list[int]) -> pa.Table:
            if n == self.cluster.node_id:
                t, _ = await self.db.query(d.name, where=where, bbox=bbox, limit=limit, as_of=T, partitions=pids,
                                           trusted=True)
                return t
            doc = {"table": d.name, "partitions": pids, "as_of": T, "where": where, "bbox": bbox, "limit": limit}
            status, _, payload = await self.cluster.call(n, "POST", "/v1/internal/read", doc=doc)
            if status != 200:
                raise_remote(status, payload, n)
            return await asyncio.to_thread(read_arrow_stream, payload)
        got = await asyncio.gather(*(read(n, p) for n, p in sorted(by_node.items())))
        t = pa.concat_tables([g for g in got if g.num_rows] or got[:1], promote_options="default")
        keys = schema_of(await self.db.describe(d.name, T, trusted=True)).pk.names
        if t.num_rows > 1:
            t = t.sort_by([(k, "ascending") for k in keys])
        if limit is not None:
            t = t.slice(0, limit)
        return (t.select(list(columns)) if columns is not None else t), T

    def every_partition(self, d: TableDef) -> list[int] | None:
        """Every partition of ``d``, named, for a read served whole by this node in a cluster:
        a partition the placement gives this node but that it has not taken over yet (a
        restart, an election just won) is then refused (503) instead of read as empty."""
        return list(range(d.partitions)) if self.multi else None


def unled(e: BaseException) -> bool:
    """Whether a node's failure to serve its partitions says they have no leader answering
    (down, or 503: not leading them now) — not that the request itself was wrong."""
    return not isinstance(e, RemoteError) or e.status == 503
