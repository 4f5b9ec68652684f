"""Replicated partitions across the cluster (docs/rfcs/0010-replication.md §5): heartbeats,
the placement driver's failure detection and elections, and each node's reconciliation of
what it leads with what the placement says.

* Every node bumps ``node/alive/<id>`` every ``cluster.heartbeat``.
* The node leading the catalog's Raft group is the **driver**: a node whose counter has not
  moved for ``cluster.failure_timeout`` is dead, and each partition it led is elected anew.
* Every node, every heartbeat, **reconciles**: it takes the partitions the placement names it
  leader of (directly when the placement's epoch came from an election naming it; through an
  election of its own after a restart, so a node that lost its disk never leads with a short
  log), and steps down from those it no longer leads.

An election (:meth:`NodeReplication.elect`) fences the live replicas with epoch + 1, takes the
greatest ``(last epoch, position)`` among a majority of answers, writes the placement by
compare-and-set and tells the chosen node to take the partition.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from catalog.abc import Check, Put
from catalog.errors import CatalogError
from catalog.raft import RaftCatalog
from node.cluster.members import RemoteError
from node.cluster.handoff import call_hand_off, hand_off, reconcile as take_placed, single_copy_moves
from node.tasks import cancel_all, watched
from node.cluster.placement import PLACE, PartitionPlace, Placement
from node.cluster.rebalance import Rebalancer
from node.cluster.serving import Serving
from node.cluster import election, suspicion
from node.cluster.leading import Step, Take, how_to_take, lead, reconcile_step
from node.cluster.transport import PROMISED, HttpTransport
from rowstore.errors import FencedError, RowstoreError, TableNotFoundError
from rowstore.replication.epochs import Epoch, History, epochs_key, replica_lasts
from rowstore.segments.position import NOTHING, REP_PREFIX, Position
from rowstore.replication.leader import Shipper
from rowstore.tables.definitions import TableDef
from terrafs.catalog_ops import commit
from terrafs.errors import TerrafsError

log = logging.getLogger("terrascale.node.driver")
ALIVE = "node/alive/"
PRUNE_EVERY_S = 5.0


class NodeReplication:
    def __init__(self, sv: Serving) -> None:
        self.sv, self.cfg, self.catalog = sv, sv.cfg, sv.catalog
        self.db, self.cluster = sv.db, sv.cluster
        self.me = self.cfg.node_id
        self.lease_s = self.db.replicas.lease_s  # failure_timeout / 2, given the database (node/daemon/lifecycle.py)
        self.transport = HttpTransport(self.cluster, max(self.cfg.failure_timeout_s, 1.0))
        self.counter = int(time.time() * 1000)  # grows across restarts too
        self._seen: dict[str, tuple[bytes, float]] = {}  # node -> (counter, monotonic when it moved)
        self._observed = -1e9  # monotonic time of the last look at every counter
        self._driving = False
        self._pruned = 0.0
        self._moving: asyncio.Task[None] | None = None  # the one-copy partition move under way, if any
        self._busy: set[tuple[str, int]] = set()
        self._outvoted: dict[tuple[str, int], int] = {}  # (table id, pid) -> epoch a follower fenced us with
        self._tasks: list[asyncio.Task[None]] = []
        self.elections = {"won": 0, "failed": 0}
        self.dead: set[str] = set()
        self._known: dict[str, int] = {}  # table id -> partitions (replication messages are checked against it)
        self.rebalancer = Rebalancer(self)
        self.suspected: list[list[str | int]] | None = None  # what this node last wrote under node/suspect/

    async def partitions_of(self, table_id: str) -> int | None:
        """How many partitions live table ``table_id`` has (None: no such table); the list of
        tables is read again when an id is not in it (a table created since)."""
        if table_id not in self._known:
            self._known = {d.table_id: d.partitions for d in await self.db.list_tables()}
        return self._known.get(table_id)

    @property
    def enabled(self) -> bool:
        return self.cluster.multi

    def start(self) -> None:
        if self.enabled:
            self._tasks = [asyncio.ensure_future(self._loop(self._beat)),
                           asyncio.ensure_future(self._loop(self._tick))]

    async def stop(self) -> None:
        await cancel_all(self._tasks)

    async def _loop(self, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:  # a step stuck (behind a partition it should fix, say) logs where it waits
                await watched(step(), step.__name__, max(10 * self.cfg.heartbeat_s, 5.0), log)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - logged; the next beat tries again
                log.warning("event=replication_step_failed step=%s error=%r", step.__name__, e)
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def _beat(self) -> None:
        """Say this node is alive; watch everyone's counters (every node does, driving or not:
        a node that becomes the driver — the catalog's leader died, say — then knows already
        for how long each counter has not moved, instead of watching a whole timeout first)."""
        self.counter += 1
        await self.catalog.txn([], [Put(ALIVE + self.me, str(self.counter).encode())])
        now = time.monotonic()
        for e in await self.catalog.scan(ALIVE):
            n = e.key[len(ALIVE):]
            if n not in self._seen or self._seen[n][0] != e.value:
                self._seen[n] = (e.value, now)
        self._observed = now

    async def _tick(self) -> None:
        await self.reconcile()
        if await self._is_driver():
            await self.drive()

    # -- the driver -----------------------------------------------------------------------------

    async def _is_driver(self) -> bool:
        assert isinstance(self.catalog, RaftCatalog)  # replication runs in a cluster: its catalog is Raft's
        try:
            st = await self.catalog.cluster_status()
        except (CatalogError, asyncio.TimeoutError):
            return False
        driving: bool = st.get("role") == "leader"
        self._driving = driving
        return driving

    async def drive(self) -> None:
        """Find dead nodes by their heartbeats; elect anew every partition one of them leads."""
        now = time.monotonic()
        if now - self._observed > 3 * self.cfg.heartbeat_s:
            return  # this node's own view is stale (it was paused or cut off): look again first
        self.dead = self.silent()
        placed = await self._placed()  # read once per tick: failover, then one rebalancing step
        replicated = [(d, pl) for d, pl in placed if pl.replicated]
        failed_over = False
        for d, pl in replicated if self.dead else ():
            for pid, p in enumerate(pl.partitions):
                if p.leader in self.dead:
                    failed_over |= await self.elect(d, pid, exclude=self.dead)
        for d, pid in await suspicion.unreachable(self, replicated, self.dead):
            leader = (await self.cluster.placement(d.name, d.partitions, fresh=True)).leader(pid)
            if leader == self.me:  # the driver itself: its fences would reach nobody either
                return await suspicion.step_aside(self)
            log.warning("event=leader_unreachable table=%s partition=%d leader=%s", d.name, pid, leader)
            failed_over |= await self.elect(d, pid, exclude={leader} | self.dead)
        if not failed_over and not await self.rebalancer.step(replicated):
            await self._move_single(self.dead, placed)

    # -- every node -----------------------------------------------------------------------------

    def silent(self) -> set[str]:
        """Members whose heartbeat counter has not moved for the failure timeout (every node
        watches them; the driver acts on it)."""
        now = time.monotonic()
        return {n for n, (_, t) in self._seen.items() if now - t > self.cfg.failure_timeout_s}

    async def _move_single(self, dead: set[str], placed: list[tuple[TableDef, Placement]]) -> None:
        """Even out one-copy partitions over the live members (a member joined), one move at a
        time in the background: a move seals and offloads a partition, which may take long,
        and must not hold up failure detection."""
        if self._moving is not None and not self._moving.done():
            return
        live = set(await self.cluster.placeable()) - dead
        moves = single_copy_moves(placed, live)
        if moves:
            table, pid, owner, to = moves[0]
            self._moving = self.db.tasks.spawn(self._move(table, pid, owner, to))

    async def _move(self, table: str, pid: int, owner: str, to: str) -> None:
        try:
            if owner == self.me:
                await hand_off(self.sv, table, pid, to)
            else:
                await call_hand_off(self.sv, owner, table, pid, to)
            self.rebalancer.moves["single_moved"] = self.rebalancer.moves.get("single_moved", 0) + 1
        except Exception as e:  # noqa: BLE001 - logged; the next tick tries again
            log.warning("event=single_move_failed table=%s partition=%d from=%s to=%s error=%r", table, pid, owner,
                        to, e)

    async def _placed(self) -> list[tuple[TableDef, Placement]]:
        """(TableDef, its placement, read fresh) for every table."""
        return [(d, await self.cluster.placement(d.name, d.partitions, fresh=True))
                for d in await self.db.list_tables()]

    async def reconcile(self) -> None:
        """Lead what the placement says this node leads; stop leading anything else; serve the
        one-copy partitions moved here."""
        seen: set[tuple[str, int]] = set()
        placed = await self._placed()
        await take_placed(self.sv, placed)
        tables = [(d, pl) for d, pl in placed if pl.replicated]
        for d, pl in tables:
            for pid, p in enumerate(pl.partitions):
                key = (d.table_id, pid)
                seen.add(key)
                sh = self.db.leadership.shipper(d.table_id, pid)
                step = reconcile_step(self.me, p.leader, p.epoch, p.replicas, sh)
                if step is Step.TAKE:
                    await self.take(d, pid, pl)
                elif step is Step.FOLLOWERS:
                    assert sh is not None  # a partition this node leads on
                    sh.set_followers(list(p.replicas[1:]))  # rebalancing added or dropped one
                elif step is Step.DEMOTE:
                    await self.db.leadership.demote(d.table_id, pid)
        for key in set(self.db.leadership.led()) - seen:
            await self.db.leadership.demote(*key)
        await suspicion.publish(self, tables, self.silent())
        if time.monotonic() - self._pruned > PRUNE_EVERY_S:
            self._pruned = time.monotonic()
            await self._prune(tables)

    async def _prune(self, tables: list[tuple[TableDef, Placement]]) -> None:
        """Drop this node's copies of segments their leaders offloaded or deleted, and every
        copy of a partition this node no longer replicates (moved away, or its table dropped)."""
        places = {d.table_id: pl for d, pl in tables}
        for e in await self.catalog.scan(REP_PREFIX):
            parts = e.key[len(REP_PREFIX):].split("/")
            if len(parts) != 3 or parts[2] != self.me or not parts[1].isdigit():
                continue
            tid, pid = parts[0], int(parts[1])
            pl = places.get(tid)
            if pl is not None and pid < len(pl.partitions) and pl.partitions[pid].leader == self.me:
                continue  # led here: its rows are segment rows now
            follows = pl is not None and pid < len(pl.partitions) and self.me in pl.partitions[pid].replicas
            if pl is None and any(d.table_id == tid for d in await self.db.list_tables()):
                continue  # a table not replicated (any more): leave it to a later pass
            with contextlib.suppress(RowstoreError, TerrafsError, CatalogError):
                if await self.db.leadership.prune(tid, pid, follows):
                    log.info("event=replica_pruned table=%s partition=%d follows=%s", tid, pid, follows)

    async def take_if_mine(self, table: str, pid: int) -> bool:
        """The driver says this node leads ``pid`` of ``table`` now: take it."""
        try:
            d = await self.db.describe(table)
        except TableNotFoundError:
            return False
        if not 0 <= pid < d.partitions:
            return False
        pl = await self.cluster.placement(d.name, d.partitions, fresh=True)
        if pl.leader(pid) != self.me:
            return False
        await self.take(d, pid, pl)
        return self.db.leadership.shipper(d.table_id, pid) is not None

    async def take(self, d: TableDef, pid: int, pl: Placement) -> None:
        """Lead ``pid``: at once when its epoch came from an election naming this node (or the
        table is new), else through an election (after a restart: another replica may hold
        more than this node, which may even have lost its disk)."""
        key = (d.table_id, pid)
        if key in self._busy:
            return
        self._busy.add(key)
        try:
            p = pl.partitions[pid]
            how = await how_to_take(self.db, self.me, d.table_id, pid, p.epoch, self._outvoted.get(key, 0),
                                    time.monotonic, self.cfg.failure_timeout_s)
            if how is Take.WAIT:
                return
            if how is Take.ELECT:
                await self.elect(d, pid, exclude=set())  # its take() of this node is refused: busy
                was, p = p.epoch, (await self.cluster.placement(d.name, d.partitions, fresh=True)).partitions[pid]
                if p.leader != self.me or p.epoch == was:
                    return
            await lead(self.db, d, pid, p.epoch, p.base, Position(*p.start), list(p.replicas[1:]),
                       self.transport, self.lease_s, self._fenced)
        finally:
            self._busy.discard(key)

    def _fenced(self, sh: Shipper) -> None:
        key = (sh.table_id, sh.pid)
        self._outvoted[key] = max(self._outvoted.get(key, 0), sh.fenced or 0)
        self.db.tasks.spawn(self.db.leadership.demote(sh.table_id, sh.pid))

    async def started(self, d: TableDef) -> None:
        """A replicated table was just created: each partition's leader takes it (epoch 1)."""
        pl = await self.cluster.placement(d.name, d.partitions, fresh=True)
        calls: list[Awaitable[None]] = []
        for pid, p in enumerate(pl.partitions):
            if p.leader == self.me:
                calls.append(self.take(d, pid, pl))
            else:
                calls.append(self._tell(p.leader, d.name, pid))
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, BaseException):
                log.warning("event=partition_start_failed table=%s error=%r", d.name, r)

    async def _tell(self, node: str, table: str, pid: int) -> None:
        status, _, payload = await asyncio.wait_for(
            self.cluster.call(node, "POST", "/v1/internal/repl/promote", doc={"table": table, "pid": pid}),
            self.cfg.failure_timeout_s * 2)
        if status != 200:
            raise ConnectionError(f"node {node} answered {status} to promote: {payload[:200]!r}")

    # -- elections ------------------------------------------------------------------------------

    async def elect(self, d: TableDef, pid: int, exclude: set[str], handoff: str | None = None, force: bool = False,
                    prefer: str | None = None) -> bool:
        """Fence ``pid``'s live replicas at the next epoch, choose the longest log among a
        majority, write the placement (CAS) and tell the chosen node to lead
        (:func:`node.cluster.election.elect`; ``handoff``, ``force`` and ``prefer`` as there)."""
        pl = await self.cluster.placement(d.name, d.partitions, fresh=True)
        p = pl.partitions[pid]
        voters = [n for n in p.replicas if n not in exclude]
        need = election.majority(len(p.replicas))
        if len(voters) < need:
            self.elections["failed"] += 1
            return False
        if handoff is not None and sum(1 for n in voters if n != handoff and n not in self.dead) < need:
            # A planned hand-over counts only the others' answers: with one of them dead it
            # cannot succeed, and fencing the leader first would leave the partition unled.
            log.info("event=handoff_deferred table=%s partition=%d dead=%s", d.name, pid, sorted(self.dead))
            return False
        won = await election.elect(p, voters, need, _Ballot(self, d, pid), self.lease_s, handoff=handoff,
                                   force=force, prefer=prefer, where=f"{d.name}/{pid}")
        if won is None:
            self.elections["failed"] += 1
            return False
        self.elections["won"] += 1
        new = won.place
        log.warning("event=partition_elected table=%s partition=%d epoch=%d leader=%s was=%s last=%d pos=%s",
                    d.name, pid, new.epoch, new.leader, p.leader, new.base, list(new.start))
        if new.leader == self.me:
            await self.take(d, pid, await self.cluster.placement(d.name, d.partitions, fresh=True))
        else:
            with contextlib.suppress(ConnectionError, asyncio.TimeoutError, RemoteError):
                await self._tell(new.leader, d.name, pid)  # else it takes it at its next reconcile
        return True

    async def _fence(self, node: str, table_id: str, pid: int, epoch: int, force: bool = False) -> dict[str, Any]:
        status, headers, payload = await asyncio.wait_for(
            self.cluster.call(node, "POST", "/v1/internal/repl/fence",
                              doc={"table": table_id, "pid": pid, "epoch": epoch, "force": force}),
            self.cfg.failure_timeout_s)
        doc: dict[str, Any] = json.loads(payload)
        promised = headers.get(PROMISED, "")
        if status == 409 and doc.get("error", {}).get("code") == "fenced" and promised.isdigit():
            raise FencedError(f"node {node}: {doc['error'].get('message', '')}"[:200], int(promised))
        if status != 200:
            raise ConnectionError(f"node {node}: {status} {doc.get('error', {}).get('message', '')}"[:200])
        Position.of(doc["pos"])
        return doc

    async def _write_place(self, name: str, pid: int, was: PartitionPlace, new: PartitionPlace,
                           table_id: str | None = None, floor: int = 0) -> bool:
        """Replace partition ``pid``'s entry by compare-and-set, if it is still ``was``. A new
        epoch (``table_id`` given) goes into the partition's epoch history in the same
        transaction (docs/format/replication.md, "Epoch history")."""
        key = PLACE + name
        for _ in range(20):
            e = await self.catalog.get(key)
            if e is None:
                return False
            cur = Placement.from_bytes(e.value, key)
            if cur.partitions[pid] != was:
                return False
            checks, ops = [Check(key, e.version)], [Put(key, cur.with_partition(pid, new).to_bytes())]
            if table_id is not None and new.epoch != was.epoch:
                hk = epochs_key(table_id, pid)
                he = await self.catalog.get(hk)
                h = History.from_bytes(he.value, hk) if he is not None else History([])
                checks.append(Check(hk, he.version if he is not None else 0))
                lasts = await replica_lasts(self.catalog, table_id, pid)
                ops.append(Put(hk, h.with_epoch(Epoch(new.epoch, new.base, Position(*new.start), floor),
                                                lasts).to_bytes()))
            res = await commit(self.catalog, checks, ops)
            if res.committed:
                await self.cluster.placement(name, len(cur.partitions), fresh=True)
                return True
        return False

    def status(self) -> dict[str, Any]:
        return {"driving": self._driving, "dead": sorted(self.dead), "elections": dict(self.elections),
                "moves": dict(self.rebalancer.moves), "led": self.db.leadership.status(),
                "transport": {"requests": self.transport.requests, "messages": self.transport.messages}}


__all__ = ["NodeReplication", "NOTHING"]


class _Ballot:
    """An election's fences and placement write, as the driver sends them (HTTP, the catalog)."""

    def __init__(self, repl: NodeReplication, d: TableDef, pid: int):
        self.repl, self.d, self.pid = repl, d, pid

    async def fence(self, node: str, epoch: int, force: bool) -> dict[str, Any]:
        return await self.repl._fence(node, self.d.table_id, self.pid, epoch, force)

    async def write(self, was: PartitionPlace, new: PartitionPlace, floor: int) -> bool:
        return await self.repl._write_place(self.d.name, self.pid, was, new, self.d.table_id, floor)
