"""Reads of a whole table across the nodes that serve its partitions, at one T (RFC 0010 §6):
the Spark bridge's snapshot, read plans and change feed, and the partials of aggregates
(RFC 0012). The node that receives the request asks every node for its partitions' share at
one T and merges them; a partition whose leader does not answer is read from its objects
where the read allows it (an ``as_of``)."""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
from aiohttp import web

from node.cluster.members import Cluster, RemoteError, raise_remote
from node.cluster.placement import schema_of
from node.cluster.router import Router, unled
from node.wire import read_arrow_stream
from rowstore.db.database import Database
from rowstore.db.read.scans import ScanPage, merge_pages
from rowstore.errors import UnavailableError
from rowstore.reads.plan import ReadPlan, SegmentSlice
from rowstore.tables.definitions import TableDef
from rowstore.tables.key_check import check_key_lists, check_prefix
from rowstore.tables.keys import partitions_of

log = logging.getLogger("node.router")
DEFAULT_LIMIT = 10_000  # a scan page's rows when the request names no limit
L = TypeVar("L")  # a node's share of a read across nodes, asked of it
W = TypeVar("W")  # that share when the partitions' leader does not answer (from their objects)


class Spread:
    """Made with the router (``Api.open``), whose placement, snapshot and calls it uses."""

    def __init__(self, router: Router) -> None:
        self.router = router

    @property
    def db(self) -> Database:
        return self.router.db

    @property
    def cluster(self) -> Cluster:
        return self.router.cluster

    @property
    def multi(self) -> bool:
        return self.router.multi

    async def _spread(self, d: TableDef) -> dict[str, list[int]] | None:
        """node -> partitions, when ``d``'s partitions are on several nodes (else None)."""
        if not self.multi:
            return None
        by_node = (await self.router.placement(d, fresh=True)).by_node()
        return by_node if len(by_node) > 1 or self.cluster.node_id not in by_node else None

    async def _T(self, by_node: dict[str, list[int]], as_of: int | None) -> int:
        return await self.router.cluster_ts(sorted(by_node)) if as_of is None else await self.db.snapshot(as_of)

    async def _each(self, by_node: dict[str, list[int]], local: Callable[[list[int]], Awaitable[L]], path: str,
                    doc: dict[str, Any], without: Callable[[list[int]], Awaitable[W]] | None = None,
                    ) -> list[tuple[str, L | W | bytes]]:
        """``local(pids)`` here and ``path`` with ``doc`` + ``partitions`` on the other nodes,
        in parallel: [(node, answer)] (remote answers as raw bytes). ``without(pids)``: the
        answer for partitions whose node does not answer or does not lead them now."""
        async def ask(n: str, pids: list[int]) -> L | bytes:
            if n == self.cluster.node_id:
                return await local(pids)
            status, _, payload = await self.cluster.call(n, "POST", path, doc={**doc, "partitions": pids})
            if status != 200:
                raise_remote(status, payload, n)
            return payload

        async def one(n: str, pids: list[int]) -> L | W | bytes:
            try:
                return await ask(n, pids)
            except (ConnectionError, UnavailableError, RemoteError) as e:
                if without is None or not unled(e):
                    raise
                log.info("event=plan_without_leader node=%s partitions=%s error=%s", n, pids, e)
                return await without(pids)
        items = sorted(by_node.items())
        return list(zip([n for n, _ in items], await asyncio.gather(*(one(n, p) for n, p in items))))

    async def partials(self, d: TableDef, as_of: int | None, local: Callable[[list[int], int], Awaitable[L]], path: str,
                       doc: dict[str, Any], without: Callable[[list[int], int], Awaitable[W]] | None = None,
                       pids: list[int] | None = None) -> tuple[int, list[tuple[str, L | W | bytes]]]:
        """Every node's share at one T (RFC 0012), of ``pids`` (default all): (T, [(node, answer)]);
        ``local(pids, T)`` here, ``without(pids, T)`` for partitions whose leader does not answer
        (an ``as_of`` read)."""
        by_node = (await self.router.placement(d, fresh=True)).by_node(pids)
        T = await self._T(by_node, as_of)
        other = None if without is None or as_of is None else (lambda pids: without(pids, T))
        return T, await self._each(by_node, lambda pids: local(pids, T), path, {**doc, "as_of": T}, other)

    async def snapshot(self, table: str, as_of: int | None) -> tuple[int, int]:
        """(T, changed_ts) of the bridge's snapshot: every node's share when spread."""
        d = await self.db.describe(table)
        by_node = await self._spread(d)
        if by_node is None:
            T = await self.db.snapshot(as_of)
            return T, await self.db.changed_ts(d.table_id, T)
        T = await self._T(by_node, as_of)
        return T, await self.db.changed_ts(d.table_id, T)

    async def plan(self, table: str, as_of: int | None, where: Any, bbox: Any, sealed_only: bool, lease_s: float,
                   request_id: str | None = None) -> ReadPlan:
        """A read plan: one node's, or every node's share at one T, merged, with one lease (the
        same lease for every plan of one client ``request_id``)."""
        d = await self.db.describe(table)
        by_node = await self._spread(d)
        if by_node is None:
            if self.multi and len(await self.cluster.owns(d)) < d.partitions:  # see _all
                raise UnavailableError(f"table {table!r}: a partition is not taken over by its leader yet; retry")
            return await self.db.read_plan(table, as_of, where, bbox, sealed_only, lease_s, request_id=request_id)
        T = await self._T(by_node, as_of)

        async def local(pids: list[int]) -> ReadPlan:
            return await self.db.read_plan(table, T, where, bbox, False, lease_s, partitions=pids, trusted=True)

        async def without(pids: list[int]) -> list[SegmentSlice]:
            # their leader does not answer: from their objects, T at most their watermark
            if as_of is None:
                raise UnavailableError(f"table {table!r}: partitions {pids} have no leader answering; "
                                       "a plan without their leader needs an as_of")
            return list(await self.db.plan_without_leader(table, T, pids))
        got = await self._each(by_node, local, "/v1/internal/plan",
                               {"table": table, "as_of": T, "where": where, "bbox": bbox}, without)
        plans = [g if isinstance(g, ReadPlan) else ReadPlan.from_json(json.loads(g))
                 for _, g in got if not isinstance(g, list)]
        if not plans:  # every partition without its leader: the plan's frame (schema, versions) from here
            plans = [await self.db.read_plan(table, T, None, None, True, lease_s, partitions=[], trusted=True)]
        sealed = sorted([*(s for p in plans for s in p.sealed), *(s for _, g in got if isinstance(g, list) for s in g)],
                        key=lambda s: s.segid)
        tail = () if sealed_only else tuple(sorted({t for p in plans for t in p.tail}))
        segids = sorted({r.segid for _, r in await self.db.segment_records(table) if r.table == d.table_id})
        lease = await self.db.acquire_lease(segids, lease_s, request_id)
        return dataclasses.replace(plans[0], sealed=tuple(sealed), tail=tail, lease=lease)

    async def changes(self, table: str, after: int, upto: int | None) -> tuple[pa.Table, int]:
        """The change feed: one node's, or every node's share in (after, T], merged in commit
        order, then key."""
        d = await self.db.describe(table)
        by_node = await self._spread(d)
        if by_node is None:
            return await self.db.changes(table, after, upto, partitions=self.router.every_partition(d))
        T = await self._T(by_node, upto)

        async def local(pids: list[int]) -> pa.Table:
            t, _ = await self.db.changes(table, after, T, partitions=pids, trusted=True)
            return t
        got = await self._each(by_node, local, "/v1/internal/changes", {"table": table, "after": after, "upto": T})
        tables = [g if isinstance(g, pa.Table) else await asyncio.to_thread(read_arrow_stream, g) for _, g in got]
        t = pa.concat_tables(tables, promote_options="default")
        keys = schema_of(await self.db.describe(table, T, trusted=True)).pk.names
        return t.sort_by([("commit_ts", "ascending"), *((k, "ascending") for k in keys)]), T

    # -- ordered scans (docs/rfcs/0013-measurement-keys.md §4) -------------------------------------

    async def scan(self, request: web.Request, d: TableDef, req: dict[str, Any], as_of: int | None,
                   after: int | bytes | None) -> tuple[web.Response | None, ScanPage | None]:
        """One page of a scan: (forwarded response, None) when one other node serves what it
        reads, else (None, page). A scan whose prefix names the whole partition key reads one
        partition (on its node); otherwise every partition, each node's at one T, merged."""
        pk = schema_of(d).pk
        pids = self.db.scan_partitions(d, check_prefix(req.get("prefix"), pk, "prefix"))
        one = len(pids) == 1

        async def here() -> ScanPage:
            return await self.db.scan(d.name, **req, after=after, as_of=as_of,
                                      partitions=pids if one else self.router.every_partition(d))
        if not self.multi:
            return None, await here()

        async def across() -> ScanPage:
            by_node = (await self.router.placement(d, fresh=True)).by_node(pids)
            T = await self._T(by_node, as_of)
            doc = {"table": d.name, "as_of": T, "after": _key_json(after), **req}
            got = await self._each(by_node, lambda ps: self.db.scan(d.name, **req, after=after, as_of=T,
                                                                    partitions=ps, trusted=True),
                                   "/v1/internal/scan", doc)
            pages = [g if isinstance(g, ScanPage) else await asyncio.to_thread(page_of, g, T) for _, g in got]
            td = schema_of(await self.db.describe(d.name, T, trusted=True))
            return merge_pages(pages, req.get("limit", DEFAULT_LIMIT), td, req.get("columns"), T)
        resp, page = await self.router.dispatch(request, d, np.array(pids), here, across)
        return resp, page

    async def get_many(self, d: TableDef, keys: list[Any], columns: list[str] | None,
                       as_of: int | None) -> tuple[int, pa.Table]:
        """Many rows by key: (T, the rows found, each with ``__pos``, its key's place in
        ``keys``) — every node asked for its keys' rows at one T."""
        pk = schema_of(d).pk
        if not self.multi:
            t, T = await self.db.get_rows(d.name, keys, as_of, columns)
            return T, t
        karrs = check_key_lists(keys, pk)
        pids = partitions_of(pk, karrs, d.partitions)
        by_node = (await self.router.placement(d, fresh=True)).by_node(np.unique(pids).tolist())
        T = await self._T(by_node, as_of)

        async def one(n: str, ps: list[int]) -> pa.Table:
            at = np.flatnonzero(np.isin(pids, ps))
            mine = [keys[i] for i in at]
            if n == self.cluster.node_id:
                t, _ = await self.db.get_rows(d.name, mine, T, columns, ps, trusted=True)
            else:
                doc = {"table": d.name, "keys": mine, "as_of": T, "columns": columns, "partitions": ps}
                status, _, payload = await self.cluster.call(n, "POST", "/v1/internal/get", doc=doc)
                if status != 200:
                    raise_remote(status, payload, n)
                t = await asyncio.to_thread(read_arrow_stream, payload)
            return t.set_column(t.schema.get_field_index("__pos"), "__pos",
                                pa.array(at[t.column("__pos").to_numpy()], pa.int64()))
        got = await asyncio.gather(*(one(n, ps) for n, ps in sorted(by_node.items())))
        return T, pa.concat_tables(got, promote_options="default")


KEY_COLUMN = "__key"  # a node's share of a scan: each row's encoded key, for the merge


def page_arrow(page: ScanPage) -> pa.Table:
    """A node's share of a scan as Arrow: its rows, each row's encoded key, and ``more``."""
    keys = pa.array(page.keys.astype(np.uint64)) if page.keys.dtype == np.uint64 else \
        pa.array([bytes(k) for k in page.keys], pa.binary())
    t = page.rows.append_column(KEY_COLUMN, keys)
    return t.replace_schema_metadata({b"more": b"1" if page.more else b"0"})


def page_of(payload: bytes, T: int) -> ScanPage:
    """``page_arrow``'s table, read back."""
    t = read_arrow_stream(payload)
    col = t.column(KEY_COLUMN).combine_chunks()
    keys = col.to_numpy() if pa.types.is_uint64(col.type) else np.array(col.to_pylist() or [b""], dtype="S")[
        : len(col)]
    more = (t.schema.metadata or {}).get(b"more") == b"1"
    return ScanPage(t.drop_columns([KEY_COLUMN]).replace_schema_metadata(None), keys, T, more)


def _key_json(key: int | bytes | None) -> dict[str, Any] | None:
    return None if key is None else {"i": key} if isinstance(key, int) else {"b": key.hex()}


def key_of_json(doc: object) -> int | bytes | None:
    """``_key_json`` read back (another node's ``after``)."""
    if doc is None:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("i"), int) and not isinstance(doc["i"], bool):
        return int(doc["i"])
    if isinstance(doc, dict) and isinstance(doc.get("b"), str):
        try:
            return bytes.fromhex(doc["b"])
        except ValueError:
            pass
    raise ValueError(f"an encoded key is {{\"i\": int}} or {{\"b\": hex}}, not {doc!r}"[:200])
