"""Who is in the cluster and where each table's partitions live; calls between nodes.

Catalog keys (the catalog is the one source of truth, docs/REFERENCE.md §3: "any node accepts
any request and routes it to the owner of the data"):

* ``node/member/<node id>`` — ``{"http": "http://host:port", "raft": "host:port" | null}``,
  written by each node when it becomes ready (its address for forwarded requests);
* ``node/place/<table name>`` — the placement of the table's partitions
  (``node/cluster/placement.py``, docs/rfcs/0010-replication.md), set by compare-and-set by the
  node that creates the table, before it creates it;
* ``node/owner/<table name>`` — RFC 0007's per-table owner, still read for tables made
  before placements (every partition on that node).
* ``node/leaving/<node id>`` — present while ``admin cluster remove`` moves the node's
  one-copy partitions off it: nothing is placed or moved onto it meanwhile.

A request is sent on to another node unchanged (method, path, query, body,
``Authorization``), marked with ``X-Terrascale-Forwarded-By`` so it is never forwarded
twice: a node that finds it does not serve what it was sent (the map changed) answers
421, and the forwarding node refreshes its map and tries once more. With a ``trkv://``
catalog there is exactly one node and nothing is looked up.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NoReturn

import aiohttp
from aiohttp import web

from catalog.abc import Catalog, Check, Delete, Put
from catalog.errors import CatalogError
from catalog.raft import RaftCatalog
from node.cluster.placement import PLACE, Placement, counts, plan
from node.errors import ApiError
from rowstore.errors import ConflictError, SchemaError, TableExistsError
from rowstore.tables.definitions import TableDef
from terrafs.failpoints import cut_to, slow_to
from terrafs.catalog_ops import commit

log = logging.getLogger("terrascale.node")
MEMBER, OWNER, LEAVING = "node/member/", "node/owner/", "node/leaving/"
FORWARDED = "X-Terrascale-Forwarded-By"
INCARNATION = "X-Terrascale-Incarnation"  # the calling process (a restarted node is a new one)
PLACE_TTL_S = 2.0
_HOP_HEADERS = ("Authorization", "Content-Type", "Accept")
_ANSWER_HEADERS = ("Content-Type", "X-Terrascale-As-Of", "X-Terrascale-Next")  # a forwarded answer keeps these


class RemoteError(ApiError):
    """Raised with another node's error answer, to be answered as it is."""


def raise_remote(status: int, payload: bytes, node: str) -> NoReturn:
    """Another node's error answer as a RemoteError (its status and code kept)."""
    try:
        err = json.loads(payload)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        code, message = "unavailable", f"node {node} answered {status}"
    if status == 421:
        raise ConnectionError(f"node {node} no longer serves these partitions; retry")
    raise RemoteError(status, code, message)


class Cluster:
    def __init__(self, catalog: Catalog, node_id: str, http_url: str, raft_addr: str | None, token: str | None = None,
                 incarnation: str = "") -> None:
        self.catalog, self.node_id, self.http_url, self.raft_addr = catalog, node_id, http_url, raft_addr
        self.token, self.incarnation = token, incarnation
        self.multi = raft_addr is not None
        self._places: dict[str, tuple[Placement | None, float, int]] = {}  # table -> (placement, when, version)
        self._forget: Callable[[str], None] | None = None  # the engine's hooks (``open``)
        self._leads: Callable[[str, int], bool] | None = None
        self._members: dict[str, dict[str, Any]] = {}
        self._session: aiohttp.ClientSession | None = None

    def open(self, forget: Callable[[str], None], leads: Callable[[str, int], bool]) -> None:
        """The engine's hooks, given once the engine exists (``Node.open``: the engine is made
        after this object, whose ``gone`` it asks about batches' coordinators): ``forget(table)``
        drops what the engine cached of a name whose table changed; ``leads(table id, pid)``
        says whether this process leads that replicated partition."""
        self._forget, self._leads = forget, leads

    async def register(self) -> None:
        """Publish this node's addresses (a restart with a new address overwrites the old), and
        drop a leaving mark an earlier removal left (a node started again is placeable once it
        is in the Raft membership)."""
        if not self.multi:
            return
        doc = {"http": self.http_url, "raft": self.raft_addr}
        await commit(self.catalog, [], [Put(MEMBER + self.node_id, json.dumps(doc).encode()),
                                        Delete(LEAVING + self.node_id)])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def members(self) -> dict[str, dict[str, Any]]:
        """node id -> {"http", "raft"} for every registered node."""
        if not self.multi:
            return {self.node_id: {"http": self.http_url, "raft": None}}
        got = {e.key[len(MEMBER):]: json.loads(e.value) for e in await self.catalog.scan(MEMBER)}
        self._members = got
        return got

    # -- placement ------------------------------------------------------------------------------

    async def place(self, table: str, partitions: int, exists: Callable[[], Awaitable[bool]],
                    replicas: int = 1) -> Placement:
        """Place a new table's partitions over the members (balanced by count, RFC 0010 §1)
        before creating it, by compare-and-set; ``await exists()`` says whether the name is
        taken (then nothing is written: the live table's placement stays)."""
        if not self.multi:
            return Placement.single(self.node_id, partitions)
        key = PLACE + table
        cur = await self.catalog.get(key)
        if await exists():
            raise TableExistsError(f"table {table!r} exists")
        members = await self.placeable()
        others = [Placement.from_bytes(e.value, e.key) for e in await self.catalog.scan(PLACE) if e.key != key]
        led, held = counts(others)
        try:
            pl = plan(members or [self.node_id], partitions, replicas, led, held, first=self.node_id)
        except ValueError as e:
            raise SchemaError(f"table {table!r}: {e}") from None
        res = await commit(self.catalog, [Check(key, cur.version if cur else 0)], [Put(key, pl.to_bytes())])
        if not res.committed:
            raise ConflictError(f"table {table!r} is being created by another node; retry")
        await self.placement(table, partitions, fresh=True)
        return pl

    async def leaving(self, nodes: set[str], on: bool) -> None:
        """Mark (or unmark) ``nodes`` as leaving: nothing is placed or moved onto them while
        their partitions are moved off before they leave the membership."""
        ops = [Put(LEAVING + n, b"1") if on else Delete(LEAVING + n) for n in sorted(nodes)]
        if ops:
            await commit(self.catalog, [], ops)

    async def placeable(self) -> list[str]:
        """The members new partitions may go to: registered, in the catalog's Raft membership
        (a removed node would leave them unserved) and not leaving — all registered ones when
        the catalog cannot tell. Not whether a member is reachable right now: that changes by
        the second, and a table's placement stays."""
        gone = {e.key[len(LEAVING):] for e in await self.catalog.scan(LEAVING)} if self.multi else set()
        members = {n: m for n, m in (await self.members()).items() if n not in gone}
        if not isinstance(self.catalog, RaftCatalog):
            return sorted(members)
        try:
            st = await self.catalog.cluster_status()
            live = {m["address"] for m in st["members"]}
        except (CatalogError, asyncio.TimeoutError, KeyError, TypeError):
            return sorted(members)
        ok = sorted(n for n, m in members.items() if m.get("raft") in live)
        return ok or sorted(members)

    async def placement(self, table: str, partitions: int, fresh: bool = False) -> Placement:
        """Where ``table``'s ``partitions`` partitions live. Cached for PLACE_TTL_S — good
        enough to pick a node to send a request to (a stale pick is answered 421 and
        retried); serving locally asks with ``fresh=True``. When the row changed since it was
        last seen (the table was dropped and created again), ``forget(table)`` lets the
        engine drop what it cached about the name."""
        if not self.multi:
            return Placement.single(self.node_id, partitions)
        hit = self._places.get(table)
        if hit is not None and not fresh and time.monotonic() - hit[1] < PLACE_TTL_S:
            pl = hit[0]
        else:
            e = await self.catalog.get(PLACE + table)
            if e is not None:
                pl, version = Placement.from_bytes(e.value, e.key), e.version
            else:  # RFC 0007's per-table owner (a table from before placements), or none yet
                o = await self.catalog.get(OWNER + table)
                pl, version = (Placement.single(o.value.decode(), partitions), -o.version) if o else (None, 0)
            if hit is not None and hit[2] != version and self._forget is not None:
                self._forget(table)
            self._places[table] = (pl, time.monotonic(), version)
        if pl is None or len(pl.partitions) != partitions:
            return Placement.single(self.node_id, partitions)
        return pl

    async def owns(self, d: TableDef) -> dict[int, int]:
        """The partitions of table ``d`` this node serves now (fresh), with their placement
        epochs: those it leads — a replicated one only once promoted in this process
        (``leads(table id, pid)``)."""
        pl = await self.placement(d.name, d.partitions, fresh=True)
        return {p: pl.partitions[p].epoch for p in pl.led_by(self.node_id)
                if len(pl.partitions[p].replicas) == 1 or (self._leads is not None and self._leads(d.table_id, p))}

    async def partitions(self, tables: Iterable[TableDef]) -> dict[str, dict[str, str]]:
        """``{table: {partition: leader}}`` for the given TableDefs."""
        out = {}
        for d in tables:
            pl = await self.placement(d.name, d.partitions, fresh=True)
            out[d.name] = {str(p): who for p, who in enumerate(pl.leaders())}
        return out

    # -- calls between nodes --------------------------------------------------------------------

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        return self._session

    async def address(self, node: str) -> str:
        members = self._members if node in self._members else await self.members()
        m = members.get(node)
        if m is None:
            raise ConnectionError(f"node {node} has not registered an address")
        url: str = m["http"]
        return url

    async def call(self, node: str, method: str, path: str, *, body: bytes | None = None, doc: Any = None,
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One internal request to ``node`` (with this node's token when it has one): (status,
        headers, body). A node that does not answer is a ConnectionError (503 to callers)."""
        url = await self.address(node) + path
        await self.fault(node)
        h = self._internal(headers)
        if doc is not None:
            body, h["Content-Type"] = json.dumps(doc).encode(), "application/json"
        try:
            async with self.session().request(method, url, data=body, headers=h) as r:
                return r.status, dict(r.headers), await r.read()
        except aiohttp.ClientError as e:
            raise ConnectionError(f"node {node} ({url}) does not answer: {e}") from e

    async def open_stream(self, node: str, path: str, max_msg_size: int) -> aiohttp.ClientWebSocketResponse:
        """A websocket to ``node``'s ``path``, opened as an internal call (token, caller, process).
        aiohttp.WSServerHandshakeError when the node answers the upgrade with an error status
        (404: a node of an older version); ConnectionError when it does not answer."""
        url = await self.address(node) + path
        await self.fault(node)
        try:
            return await self.session().ws_connect(url, headers=self._internal(None), max_msg_size=max_msg_size,
                                                   compress=0, autoping=True)
        except aiohttp.WSServerHandshakeError:
            raise
        except (aiohttp.ClientError, OSError) as e:
            raise ConnectionError(f"node {node} ({url}) does not answer: {e}") from e

    async def fault(self, node: str) -> None:
        """A test's fault file for the link to ``node``: cut (ConnectionError) or slow (a sleep)."""
        if cut_to(node):
            raise ConnectionError(f"node {node} does not answer: cut by a test")
        delay = slow_to(node)
        if delay:
            await asyncio.sleep(delay)

    def _internal(self, headers: dict[str, str] | None) -> dict[str, str]:
        h = dict(headers or {})
        h[FORWARDED] = self.node_id
        h[INCARNATION] = self.incarnation
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    async def gone(self, who: tuple[str, str]) -> bool:
        """Whether the process ``(node id, incarnation)`` is gone: its node does not answer,
        is restarting, or answers as another incarnation."""
        node, incarnation = who
        try:
            status, _, payload = await asyncio.wait_for(self.call(node, "GET", "/v1/internal/closed"), 2.0)
        except ConnectionError:
            return True
        except asyncio.TimeoutError:  # paused or overloaded: cannot tell (the prepare timeout decides)
            return False
        if status == 503:
            return True
        return status == 200 and json.loads(payload).get("incarnation") != incarnation

    async def forward(self, request: web.Request, owner: str, body: bytes,
                      again: Callable[[], Awaitable[str]] | None = None) -> web.Response | None:
        """Send the request to ``owner``; its answer as a Response (None: ``again()``, asked
        after a 421, found this node is the owner after all). A node that does not answer is
        a ConnectionError (503)."""
        for attempt in (0, 1):
            url = await self.address(owner)
            headers = {h: request.headers[h] for h in _HOP_HEADERS if h in request.headers}
            headers[FORWARDED] = self.node_id
            try:
                async with self.session().request(request.method, url + request.path_qs, data=body or None,
                                                  headers=headers) as r:
                    status, rheaders, payload = r.status, r.headers, await r.read()
            except aiohttp.ClientError as e:  # the owner is down or unreachable: 503 to the caller
                raise ConnectionError(f"node {owner} serving this ({url}) does not answer: {e}") from e
            if status == 421 and attempt == 0 and again is not None:  # the map moved: refresh, retry once
                owner = await again()
                if owner == self.node_id:
                    return None
                continue
            if status == 421:
                raise ConnectionError(f"node {owner} no longer serves this and the placement moved again; retry")
            return web.Response(status=status, body=payload,
                                headers={k: v for k, v in rheaders.items() if k in _ANSWER_HEADERS})
        raise ConnectionError("the placement changed twice while forwarding")
