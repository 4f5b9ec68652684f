"""Leaders that heartbeat but do not reach their followers (docs/format/placement.md,
``node/suspect/<node>``): the catalog's Raft port works, the leader's HTTP path does not, so
the driver — which elects only for heartbeat-dead leaders — would leave the partition unled.

Every node lists, in its own catalog key, the partitions it follows whose leader is alive by
its heartbeat but has not reached this replica for ``failure_timeout``; the driver elects
anew, without that leader, a partition whose leader cannot count a majority any more: fewer
followers than it needs are left unsuspecting. A follower promises only after the lease, so
the old leader's reads have stopped by then (its rounds reach nobody). When that leader is
the driver itself, its elections could not reach the followers either: it hands the driving
on (:func:`step_aside`)."""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Protocol

from catalog.abc import Catalog, Put
from catalog.errors import CatalogError
from catalog.raft import RaftCatalog
from node.cluster.placement import Placement
from node.config import NodeConfig
from rowstore.db.database import Database
from rowstore.tables.definitions import TableDef
from terrafs.catalog_ops import commit

SUSPECT = "node/suspect/"

log = logging.getLogger("node.cluster.suspicion")


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


async def step_aside(repl: Watcher) -> None:
    """This node drives (it leads the catalog's Raft group) and its followers say they do not
    hear it over HTTP: the fences of an election it ran would reach nobody, and the partition
    would stay unled. It hands the catalog's leadership — and with it the driving — to the
    most caught-up other member, which then elects without it (RFC 0010 §5)."""
    log.warning("event=driver_unreachable_steps_aside node=%s", repl.me)
    assert isinstance(repl.catalog, RaftCatalog)  # replication runs in a cluster: its catalog is Raft's
    try:
        await repl.catalog.transfer_leadership()
    except CatalogError as e:  # the next tick tries again
        log.warning("event=driver_step_aside_failed node=%s error=%r", repl.me, e)
