"""A batch spanning nodes in the simulation, through the node layer's own coordinator
(``node.cluster.commit.Coordinator``): it runs on the node the client sent the batch to, as a
task of that node's process (a crash of the node ends it mid-way), and reaches the
participants over the simulated network (``SimParticipants``) — reserve, prepare (given up
after ``PREPARE_S``: then every node a reserve went to is told to abort, often while a prepare's
append still waits for a majority), the decision in the node's own view of the catalog, commit.
Now and then the coordinator vanishes before or after its decision: from then on nothing it
sends arrives (``Vanished``)."""
from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from catalog.abc import Catalog, Check, Entry, Op, TxnResult
from node.cluster.commit import Coordinator
from tests.history.batches import Write
from tests.sim.loop import in_process

if TYPE_CHECKING:
    from tests.sim.world import World

PREPARE_S = 0.4  # a prepare not answered this long is given up: the batch is aborted
VANISH = 0.03  # the share of batches whose coordinator vanishes before, and after, its decision


class Vanished(ConnectionError):
    """The coordinator is gone: what it would send next never arrives."""


class SimParticipants:
    """The participants of one batch as its coordinator node ``me`` reaches them: its own
    share in process, the others through the simulated network."""

    def __init__(self, world: World, me: str, shares: dict[str, pa.Table], op: Write, rng: random.Random):
        self.w, self.me, self.shares, self.op, self.rng = world, me, shares, op, rng
        self.gone = False

    def _at(self, who: str):
        return self.w.nodes[who].db.participant  # called on arrival: the node's present incarnation

    async def _call(self, who: str, handler):
        if self.gone:
            raise Vanished(f"{self.me}: the coordinator vanished")
        if who == self.me:
            return await handler()
        return await self.w.net.call(self.me, who, handler)

    async def reserve(self, who: str, floor: int, txn: int) -> dict[str, Any]:
        self.op.txn = txn  # what resolves the batch once the faults healed, if no answer comes
        self.w.ledger.txns.setdefault(self.op.batch, set()).add(txn)
        d = self.w.table
        r = await self._call(who, lambda: self._at(who).reserve("t", d.table_id, d.schema.version, self.shares[who],
                                                                  floor, txn))
        return {"ts": r.ts, "rows": r.rows, "existed": r.existed}

    async def prepare(self, who: str, txn: int, ts: int) -> int:
        if who == self.me:  # its own share: in process, waited for (no request to give up on)
            return await self._call(who, lambda: self._at(who).prepare(txn, ts))
        try:  # the request is given up on; the prepare itself runs on at its node
            return await asyncio.wait_for(self._call(who, lambda: self._at(who).prepare(txn, ts)), PREPARE_S)
        except asyncio.TimeoutError:
            raise ConnectionError(f"{self.me} -> {who}: prepare not answered within {PREPARE_S:g} s") from None

    async def commit(self, who: str, txn: int) -> int:
        if not self.gone and self.rng.random() < VANISH:
            self.vanish(decided=True)
        return await self._call(who, lambda: self._at(who).commit(txn))

    async def abort(self, who: str, txn: int) -> None:
        await self._call(who, lambda: self._at(who).abort(txn))

    def vanish(self, decided: bool) -> None:
        self.gone = True
        self.w.log("coordinator_vanished", batch=self.op.batch, node=self.me, decided=decided)


class Deciding(Catalog):
    """The coordinator node's catalog as the coordinator sees it: the decision's transaction
    may find the coordinator vanished (``VANISH``), and then it is never written."""

    def __init__(self, inner: Catalog, parts: SimParticipants):
        self.inner, self.parts, self.deciding = inner, parts, True

    async def open(self) -> None:
        """The node's catalog is opened with the node."""

    async def close(self) -> None:
        """Closed with the node."""

    async def get(self, key: str) -> Entry | None:
        return await self.inner.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        return await self.inner.get_many(keys)

    async def scan(self, prefix: str = "", *, start: str | None = None, end: str | None = None,
                   limit: int | None = None, reverse: bool = False) -> list[Entry]:
        return await self.inner.scan(prefix, start=start, end=end, limit=limit, reverse=reverse)

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        p = self.parts
        if self.deciding and not p.gone and p.rng.random() < VANISH:  # the decision (the first transaction)
            p.vanish(decided=False)
        self.deciding = False
        if p.gone:
            raise Vanished(f"{p.me}: the coordinator vanished before its decision")
        return await self.inner.txn(checks, ops, request_id=request_id)

    def request_id(self) -> str:
        return self.inner.request_id()

    async def outcome(self, request_id: str) -> TxnResult | None:
        return await self.inner.outcome(request_id)

    async def revision(self) -> int:
        return await self.inner.revision()


async def coordinate(world: World, me: str, shares: dict[str, pa.Table], op: Write, rng: random.Random) -> int:
    """Batch ``op`` (``shares``: each participant node's rows) through the coordinator of node
    ``me``, in its process; the commit timestamp once acknowledged."""
    node = world.nodes[me]
    parts = SimParticipants(world, me, shares, op, rng)
    c = Coordinator(Deciding(node.catalog, parts), node.db.clock, lambda coro: in_process(node.process, coro),
                    randbits=rng.getrandbits)
    out, _ = await c.run("t", sorted(shares), parts)
    return out.commit_ts
