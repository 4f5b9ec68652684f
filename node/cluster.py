"""Who is in the cluster and who owns which table; forwarding requests to the owner.

Catalog keys (the catalog is the one source of truth, contract §3 "any node accepts
any request and routes it to the owner of the data"):

* ``node/member/<node id>`` — ``{"http": "http://host:port", "raft": "host:port" | null}``,
  written by each node when it becomes ready (its address for forwarded requests);
* ``node/owner/<table name>`` — the node id that owns every partition of the table.
  Set by compare-and-set when the table is created, by the node that creates it
  (so two nodes racing to create one name cannot both think they own it).

The row store keeps a table's write-ahead log on the owner's durable block device,
so a table's partitions are served by that one node; ownership is per table, and
``partitions`` in ``GET /v1/admin/cluster`` maps each (table, partition) to it.

A request for a table owned elsewhere is sent on to the owner unchanged (method,
path, query, body, ``Authorization``), marked with ``X-Terrascale-Forwarded-By`` so
it is never forwarded twice: an owner that finds it does not own the table (the
map changed) answers 421, and the forwarding node refreshes its map and tries once
more. With a ``trkv://`` catalog there is exactly one node and nothing is looked up.
"""
from __future__ import annotations

import json
import logging
import time

import aiohttp

from catalog.abc import Check, Put
from rowstore.errors import ConflictError
from terrafs.catalog_ops import commit

log = logging.getLogger("terrascale.node")
MEMBER, OWNER = "node/member/", "node/owner/"
FORWARDED = "X-Terrascale-Forwarded-By"
OWNER_TTL_S = 2.0
_HOP_HEADERS = ("Authorization", "Content-Type", "Accept")


class NotOwner(Exception):
    """Raised when a forwarded request reaches a node that does not own the table."""


class Cluster:
    def __init__(self, catalog, node_id: str, http_url: str, raft_addr: str | None):
        self.catalog, self.node_id, self.http_url, self.raft_addr = catalog, node_id, http_url, raft_addr
        self.multi = raft_addr is not None
        self._owners: dict[str, tuple[str | None, float, int]] = {}  # table -> (owner, when, row version)
        self.on_change = None
        self._members: dict[str, dict] = {}
        self._session: aiohttp.ClientSession | None = None

    async def register(self) -> None:
        """Publish this node's addresses (a restart with a new address overwrites the old)."""
        if not self.multi:
            return
        doc = {"http": self.http_url, "raft": self.raft_addr}
        await commit(self.catalog, [], [Put(MEMBER + self.node_id, json.dumps(doc).encode())])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def members(self) -> dict[str, dict]:
        """node id -> {"http", "raft"} for every registered node."""
        if not self.multi:
            return {self.node_id: {"http": self.http_url, "raft": None}}
        got = {e.key[len(MEMBER):]: json.loads(e.value) for e in await self.catalog.scan(MEMBER)}
        self._members = got
        return got

    # -- ownership -----------------------------------------------------------------------------

    async def claim(self, table: str) -> None:
        """Make this node the owner of ``table`` before creating it (compare-and-set)."""
        if not self.multi:
            return
        key = OWNER + table
        cur = await self.catalog.get(key)
        res = await commit(self.catalog, [Check(key, cur.version if cur else 0)],
                           [Put(key, self.node_id.encode())])
        if not res.committed:
            raise ConflictError(f"table {table!r} is being created by another node; retry")
        await self.owner(table, fresh=True)

    async def owner(self, table: str, fresh: bool = False) -> str:
        """The node id owning ``table`` (this node when none is recorded: a table made
        before ownership existed, or the single-node case).

        Cached for OWNER_TTL_S — good enough to pick a node to forward to (a stale pick is
        answered 421 and retried). Serving a table locally asks with ``fresh=True``. When
        the owner row changed since it was last seen (the table was dropped and created
        again, perhaps elsewhere), ``on_change(table)`` lets the engine drop what it
        cached about the name."""
        if not self.multi:
            return self.node_id
        hit = self._owners.get(table)
        if hit is not None and not fresh and time.monotonic() - hit[1] < OWNER_TTL_S:
            return hit[0] or self.node_id
        e = await self.catalog.get(OWNER + table)
        who, version = (e.value.decode(), e.version) if e is not None else (None, 0)
        if hit is not None and hit[2] != version and self.on_change is not None:
            self.on_change(table)
        self._owners[table] = (who, time.monotonic(), version)
        return who or self.node_id

    async def partitions(self, tables) -> dict:
        """``{table: {partition: owner}}`` for the given TableDefs."""
        out = {}
        for d in tables:
            who = await self.owner(d.name, fresh=True)
            out[d.name] = {str(p): who for p in range(d.partitions)}
        return out

    # -- forwarding ----------------------------------------------------------------------------

    async def forward(self, request, owner: str, body: bytes):
        """Send the request to ``owner``; its answer as a Response (None: this node turned out
        to be the owner after all). An owner that does not answer is a ConnectionError (503)."""
        from aiohttp import web

        for attempt in (0, 1):
            members = self._members if owner in self._members else await self.members()
            m = members.get(owner)
            if m is None:
                raise ConnectionError(f"owner {owner} of this table has not registered an address")
            if self._session is None:
                self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
            headers = {h: request.headers[h] for h in _HOP_HEADERS if h in request.headers}
            headers[FORWARDED] = self.node_id
            try:
                async with self._session.request(request.method, m["http"] + request.path_qs, data=body or None,
                                                 headers=headers) as r:
                    status, rheaders, payload = r.status, r.headers, await r.read()
            except aiohttp.ClientError as e:  # the owner is down or unreachable: 503 to the caller
                raise ConnectionError(f"owner {owner} of this table ({m['http']}) does not answer: {e}") from e
            if status == 421 and attempt == 0:  # the owner moved: refresh and retry once
                owner = await self.owner(request.match_info["table"], fresh=True)
                if owner == self.node_id:
                    return None
                continue
            return web.Response(status=status, body=payload,
                                headers={k: v for k, v in rheaders.items()
                                         if k in ("Content-Type", "X-Terrascale-As-Of")})
        raise ConnectionError("the table's owner changed twice while forwarding")
