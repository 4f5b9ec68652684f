"""Rebalancing replicated partitions when members join or leave (RFC 0010 §7).

Run by the placement driver, one step per tick, each step one compare-and-set of a
placement row, so a crash anywhere leaves a row the next driver continues from:

1. **start a move**: a partition has a replica on a node that left the membership (``admin
   cluster remove``), or the replicas held per member differ by more than one (``admin
   cluster add``): the least loaded live member not holding it joins as an extra follower and
   the replica to go is marked ``leaving``;
2. **wait**: the leader ships the newcomer everything (catch-up, as after a restart);
3. **hand over**: once the newcomer's lag is zero and the leaving replica is the leader, a
   planned election (the old leader fenced first) makes the newcomer or another caught-up
   replica leader;
4. **drop**: the leaving replica leaves the set; its node drops its copies at its next pass.

A move whose newcomer leaves the membership meanwhile, or whose leader left and cannot be
replaced with four replicas, is **given up** by dropping the newcomer; one whose third replica
leaves (or whose leaving replica leaves and dies) drops that one once the newcomer caught up —
never earlier: a write acknowledged before the move may be on two of the first three only. The
steps above start a new move if one is still needed.

Writes and reads go on throughout: a leader change is answered 421 / 503 once and retried.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from node.cluster.members import Cluster
from node.cluster.placement import PartitionPlace, Placement
from node.config import NodeConfig
from rowstore.tables.definitions import TableDef

log = logging.getLogger("terrascale.node.rebalance")
Placed = Sequence[tuple[TableDef, Placement]]  # the replicated tables with their placements, as read this tick


class Driver(Protocol):
    """What rebalancing asks of the placement driver: the node's replication (node/cluster/controller.py)."""

    cluster: Cluster
    cfg: NodeConfig
    dead: set[str]

    async def elect(self, d: TableDef, pid: int, exclude: set[str], handoff: str | None = None, force: bool = False,
                    prefer: str | None = None) -> bool: ...

    async def _write_place(self, name: str, pid: int, was: PartitionPlace, new: PartitionPlace,
                           table_id: str | None = None, floor: int = 0) -> bool: ...


class Rebalancer:
    def __init__(self, repl: Driver) -> None:
        self.repl = repl
        self.moves = {"started": 0, "handed_over": 0, "finished": 0, "given_up": 0, "leaders_moved": 0}
        self._waits: dict[tuple[str, int], tuple[object, ...]] = {}  # what each waiting move last logged
        self._seen = ""  # what the last leader asked about a move's followers answered (for the log)

    async def step(self, tables: Placed) -> bool:
        """At most one step of one move over ``tables`` (the replicated ones with their
        placements, as the driver read them this tick); whether something was done."""
        repl = self.repl
        members = set(await repl.cluster.placeable())
        live = members - repl.dead
        held = {m: 0 for m in live}
        for _, pl in tables:
            for p in pl.partitions:
                for r in p.replicas:
                    if r in held:
                        held[r] += 1
        for d, pl in tables:  # a leader that left the membership cannot serve: elect another
            for pid, p in enumerate(pl.partitions):  # (first: a move waits on its leader's word)
                if p.leader not in members:
                    if await repl.elect(d, pid, exclude={p.leader}, force=True):
                        return True
                    if p.leaving:  # four replicas, one gone, too few of the rest answer
                        return await self._give_up(d, pid, p, p.replicas[-1])
        for d, pl in tables:  # moves in progress
            for pid, p in enumerate(pl.partitions):
                if p.leaving:
                    return await self._advance(d, pid, p, members)
        for d, pl in tables:  # replicas on nodes that left
            for pid, p in enumerate(pl.partitions):
                gone = [r for r in p.replicas if r not in members]
                if gone:
                    return await self._start(d, pid, p, gone[-1], held, live)
        if len(held) < 2:
            return False
        hi, lo = max(held, key=lambda m: (held[m], m)), min(held, key=lambda m: (held[m], m))
        if held[hi] - held[lo] > 1:
            for prefer_follower in (True, False):
                for d, pl in tables:
                    for pid, p in enumerate(pl.partitions):
                        if hi in p.replicas and lo not in p.replicas and (p.leader != hi or not prefer_follower):
                            return await self._start(d, pid, p, hi, held, {lo})
        return await self._balance_leaders(tables, live)

    async def _balance_leaders(self, tables: Placed, live: set[str]) -> bool:
        """Leadership back to a node that returned (failovers pile leaders on the survivors):
        a planned hand-over from the node leading the most partitions to a caught-up follower
        leading the fewest, while they differ by more than one."""
        led = {m: 0 for m in live}
        for _, pl in tables:
            for p in pl.partitions:
                if p.leader in led:
                    led[p.leader] += 1
        if len(led) < 2:
            return False
        hi, lo = max(led, key=lambda m: (led[m], m)), min(led, key=lambda m: (led[m], m))
        if led[hi] - led[lo] <= 1:
            return False
        for d, pl in tables:
            for pid, p in enumerate(pl.partitions):
                if p.leader == hi and lo in p.replicas and not p.leaving and \
                        await self._caught_up(d, pid, hi, [lo]):
                    if await self.repl.elect(d, pid, exclude=set(), handoff=hi, prefer=lo):
                        self.moves["leaders_moved"] += 1
                        log.warning("event=leader_moved table=%s partition=%d from=%s to=%s", d.name, pid, hi, lo)
                        return True
        return False

    async def _start(self, d: TableDef, pid: int, p: PartitionPlace, leaving: str, held: dict[str, int],
                     candidates: Iterable[str]) -> bool:
        pool = [m for m in candidates if m not in p.replicas]
        if not pool:
            return False
        target = min(pool, key=lambda m: (held.get(m, 0), m))
        new = PartitionPlace((*p.replicas, target), p.epoch, p.base, p.start, leaving)
        if not await self.repl._write_place(d.name, pid, p, new):
            return False
        self.moves["started"] += 1
        log.warning("event=replica_move_started table=%s partition=%d from=%s to=%s", d.name, pid, leaving, target)
        return True

    async def _advance(self, d: TableDef, pid: int, p: PartitionPlace, members: set[str]) -> bool:
        repl = self.repl
        # The newcomer or a third replica left while the move ran; the leaving one stays until
        # its successor caught up (a copy more meanwhile), unless it is dead too.
        gone = [r for r in p.replicas[1:] if r not in members and (r != p.leaving or r in repl.dead)]
        newcomer = p.replicas[-1]
        if newcomer in gone:
            return await self._give_up(d, pid, p, newcomer)
        at_end = await self._at_end(d, pid, p)
        if gone:  # one of the first three: once another follower that stays holds the whole log
            drop = gone[-1]
            if not at_end - {drop}:
                return self._waiting(d, pid, p, f"{drop} gone; no follower that stays is at the log end", at_end)
            return await self._give_up(d, pid, p, drop)
        if newcomer not in at_end:
            return self._waiting(d, pid, p, f"newcomer {newcomer} not at the log end", at_end)
        if p.leader == p.leaving:
            if await repl.elect(d, pid, exclude=set(), handoff=p.leaving):
                self.moves["handed_over"] += 1
                return True
            return False
        rest = tuple(r for r in p.replicas if r != p.leaving)
        new = PartitionPlace(rest, p.epoch, p.base, p.start)
        if not await repl._write_place(d.name, pid, p, new):
            return False
        self.moves["finished"] += 1
        log.warning("event=replica_move_finished table=%s partition=%d from=%s to=%s", d.name, pid, p.leaving,
                    newcomer)
        return True

    def _waiting(self, d: TableDef, pid: int, p: PartitionPlace, why: str, at_end: set[str]) -> bool:
        """A move that cannot take its next step yet: logged when what it waits for changes
        (a move stuck for good shows why once, not every tick). Nothing was done: False."""
        state = (d.table_id, pid, p.replicas, p.epoch, why, tuple(sorted(at_end)))
        if self._waits.get((d.table_id, pid)) != state:
            self._waits[(d.table_id, pid)] = state
            log.warning("event=replica_move_waiting table=%s partition=%d replicas=%s leaving=%s why=%r at_end=%s "
                        "leader_says=%r", d.name, pid, ",".join(p.replicas), p.leaving, why,
                        ",".join(sorted(at_end)) or "-", self._seen)
        return False

    async def _give_up(self, d: TableDef, pid: int, p: PartitionPlace, drop: str) -> bool:
        """End a move that cannot finish as planned (a replica left the membership, or the
        leader left and the others cannot elect with four): ``drop`` (a follower) leaves the
        set and ``leaving`` is cleared. The callers keep the invariant of RFC 0010 §7: ``drop``
        is the newcomer (every acknowledged write is on two of the first three: acknowledged
        before the move, by a majority of them; after it, by three of the four), or one of the
        first three once the leader, shipping to all four, reported another follower that stays
        at its log end (every write acknowledged before is on the leader and on that follower,
        two of the three that stay; every later one on three of the four). Dropping one of the
        first three earlier lost acknowledged writes (the nemesis suite's seed 140). The next
        steps start a move again if the placement needs one."""
        new = PartitionPlace(tuple(r for r in p.replicas if r != drop), p.epoch, p.base, p.start)
        if drop == p.leader or not await self.repl._write_place(d.name, pid, p, new):
            return False
        self.moves["given_up"] += 1
        log.warning("event=replica_move_given_up table=%s partition=%d leaving=%s dropped=%s", d.name, pid,
                    p.leaving, drop)
        return True

    async def _at_end(self, d: TableDef, pid: int, p: PartitionPlace) -> set[str]:
        """The followers the leader of a move reports at its log end — none unless it ships to
        all of ``p``'s followers (it counts its majority over the four: a write acknowledged
        from then on is on three of them)."""
        fs = await self._followers(d, pid, p.leader)
        if fs is None:
            self._seen = f"leader {p.leader} did not answer, or leads it no more"
            return set()
        self._seen = "lag bytes " + ",".join(f"{n}={f['lag_bytes']}" for n, f in sorted(fs.items()))
        if not set(p.replicas[1:]) <= set(fs):
            return set()
        return {n for n, f in fs.items() if f["lag_bytes"] == 0}

    async def _caught_up(self, d: TableDef, pid: int, leader: str, followers: list[str]) -> bool:
        """Whether the leader reports every one of ``followers`` at its own log end."""
        fs = await self._followers(d, pid, leader)
        return fs is not None and all(n in fs and fs[n]["lag_bytes"] == 0 for n in followers)

    async def _followers(self, d: TableDef, pid: int, leader: str) -> dict[str, dict[str, Any]] | None:
        """The leader's followers of the partition as its status reports them; None when it
        does not answer or does not lead it."""
        try:
            status, _, payload = await asyncio.wait_for(
                self.repl.cluster.call(leader, "GET", "/v1/admin/status"), self.repl.cfg.failure_timeout_s)
        except (ConnectionError, asyncio.TimeoutError):
            return None
        if status != 200:
            return None
        led = ((json.loads(payload).get("replication") or {}).get("led") or {}).get(f"{d.name}/{pid}")
        return led["followers"] if led else None
