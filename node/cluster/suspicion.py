"""Leaders that heartbeat but do not reach their followers (docs/format/placement.md,
``node/suspect/<node>``): the catalog's Raft port works, the leader's HTTP path does not, so
the driver — which elects only for heartbeat-dead leaders — would leave the partition unled.

Every node lists, in its own catalog key, the partitions it follows whose leader is alive by
its heartbeat but has not reached this replica for ``failure_timeout``; the driver elects
anew, without that leader, a partition whose leader cannot count a majority any more: fewer
followers than it needs are left unsuspecting. A follower promises only after the lease, so
the old leader's reads have stopped by then (its rounds reach nobody)."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Protocol

from catalog.abc import Catalog, Put
from node.cluster.placement import Placement
from node.config import NodeConfig
from rowstore.db.database import Database
from rowstore.tables.definitions import TableDef
from terrafs.catalog_ops import commit

SUSPECT = "node/suspect/"


class Watcher(Protocol):
    """What suspicion reads and keeps of the node's replication (node/cluster/controller.py)."""

    me: str
    cfg: NodeConfig
    catalog: Catalog
    db: Database
    suspected: list[list[str | int]] | None  # what this node last wrote under node/suspect/


async def publish(repl: Watcher, tables: Iterable[tuple[TableDef, Placement]], silent: set[str]) -> None:
    """Write this node's list when it changed: ``[[table id, pid, epoch], ...]``."""
    mine: list[list[str | int]] = []
    for d, pl in tables:
        for pid, p in enumerate(pl.partitions):
            if repl.me not in p.replicas[1:] or p.leader in silent:
                continue
            await repl.db.replicas.replica(d.table_id, pid)  # loaded: contact counts from then
            st = repl.db.replicas.status(d.table_id, pid)
            if st is not None and st["contact_s"] > repl.cfg.failure_timeout_s:
                mine.append([d.table_id, pid, p.epoch])
    if mine != repl.suspected:
        await commit(repl.catalog, [], [Put(SUSPECT + repl.me, json.dumps(mine).encode())])
        repl.suspected = mine


async def unreachable(repl: Watcher, replicated: Iterable[tuple[TableDef, Placement]],
                      dead: set[str]) -> list[tuple[TableDef, int]]:
    """(table, pid) of every partition whose live leader too few of its followers hear."""
    said: dict[tuple[str, int, int], set[str]] = {}
    for e in await repl.catalog.scan(SUSPECT):
        try:
            entries = json.loads(e.value)
        except ValueError:
            continue
        for tid, pid, epoch in entries:
            said.setdefault((tid, pid, epoch), set()).add(e.key[len(SUSPECT):])
    out: list[tuple[TableDef, int]] = []
    for d, pl in replicated:
        for pid, p in enumerate(pl.partitions):
            if p.leader in dead:
                continue
            followers = set(p.replicas[1:])
            who = said.get((d.table_id, pid, p.epoch), set()) & followers
            needed = (len(followers) + 1) // 2  # followers a leader must hear from (Shipper.needed)
            if who and len(followers) - len(who) < needed:
                out.append((d, pid))
    return out
