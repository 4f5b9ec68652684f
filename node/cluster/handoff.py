"""Moving one-copy partitions between nodes (RFC 0010 §7): the node layer of
:mod:`rowstore.db.serving.handoff`.

``POST /v1/internal/handoff {"table", "pid", "to"}`` (:mod:`node.http.routes.handoff`) goes to
the partition's node: it releases the partition (every row into objects, writes refused
meanwhile), switches the placement to ``to`` by compare-and-set (epoch + 1), stops serving it
and tells ``to``, which takes it (``POST /v1/internal/take``; every node also takes what the
placement gives it at its next reconcile, so a lost message only delays it). Callers:
``admin cluster remove`` (before the node leaves the membership — afterwards it could not
write the catalog) and the placement controller's rebalancing when a member joins.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Set
from typing import Any

from catalog.abc import Check, Put
from catalog.errors import CatalogError
from node.cluster.members import LEAVING, RemoteError
from node.errors import ApiError
from node.cluster.serving import Serving
from node.cluster.placement import PLACE, PartitionPlace, Placement, counts
from terrafs.catalog_ops import commit
from rowstore.errors import TableNotFoundError
from rowstore.tables.definitions import TableDef

log = logging.getLogger("terrascale.node.handoff")
CALL_TIMEOUT_S = 600.0  # a release seals and offloads the partition's rows: bounded by their size


async def hand_off(sv: Serving, table: str, pid: int, to: str) -> dict[str, Any]:
    """Move one-copy partition ``pid`` of ``table`` from this node to ``to``."""
    db, cluster = sv.db, sv.cluster
    d = await db.describe(table)
    if not 0 <= pid < d.partitions:
        raise ApiError(400, "bad_request", f"table {table!r} has no partition {pid}")
    if to == cluster.node_id or to not in await cluster.placeable():
        raise ApiError(400, "bad_request", f"{to!r} is not another member of the cluster")
    pl = await cluster.placement(d.name, d.partitions, fresh=True)
    p = pl.partitions[pid]
    if p.replicas != (cluster.node_id,):
        raise ApiError(409, "conflict", f"partition {pid} of {table!r} is {list(p.replicas)}: not this node's one copy")
    await db.handoffs.release(d, pid)
    new = PartitionPlace((to,), p.epoch + 1)
    if not await db.handoffs.switch(d, pid, lambda: _switch(sv, d.name, pid, p, new)):
        raise ApiError(409, "conflict", f"the placement of {table!r} changed during the move (or {to} is "
                                        "leaving); retry")
    log.warning("event=partition_moved table=%s partition=%d from=%s to=%s", d.name, pid, cluster.node_id, to)
    with contextlib.suppress(ConnectionError, asyncio.TimeoutError, RemoteError):
        await asyncio.wait_for(cluster.call(to, "POST", "/v1/internal/take", doc={"table": d.name, "pid": pid}),
                               sv.cfg.failure_timeout_s * 2)  # else it takes it at its next reconcile
    return {"table": d.name, "pid": pid, "from": cluster.node_id, "to": to, "epoch": new.epoch}


async def _switch(sv: Serving, name: str, pid: int, was: PartitionPlace, new: PartitionPlace) -> bool:
    """Partition ``pid``'s entry ``was`` -> ``new`` by compare-and-set, and only while its new
    node is not leaving (``admin cluster remove`` marks it first: a move the driver began
    before cannot land on it after the remove looked)."""
    key, to = PLACE + name, new.leader
    e = await sv.catalog.get(key)
    if e is None:
        return False
    cur = Placement.from_bytes(e.value, key)
    if cur.partitions[pid] != was:
        return False
    res = await commit(sv.catalog, [Check(key, e.version), Check(LEAVING + to, 0)],
                       [Put(key, cur.with_partition(pid, new).to_bytes())])
    with contextlib.suppress(CatalogError, ConnectionError, asyncio.TimeoutError):  # done either way
        await sv.cluster.placement(name, len(cur.partitions), fresh=True)
    return res.committed


async def take_if_placed(sv: Serving, table: str, pid: int) -> bool:
    """Serve ``pid`` of ``table`` if its placement names this node as its one copy."""
    try:
        d = await sv.db.describe(table)
    except TableNotFoundError:
        return False
    if not 0 <= pid < d.partitions:
        return False
    pl = await sv.cluster.placement(d.name, d.partitions, fresh=True)
    if pl.partitions[pid].replicas != (sv.cluster.node_id,):
        return False
    return await sv.db.handoffs.take(d, pid, pl.partitions[pid].epoch)


async def reconcile(sv: Serving, tables: Iterable[tuple[TableDef, Placement]]) -> None:
    """Take the one-copy partitions ``tables`` (``[(TableDef, Placement)]``) place here that
    an open table of this node does not serve yet (a move whose message was lost)."""
    me = sv.cluster.node_id
    for d, pl in tables:
        t = sv.db.tables.get(d.table_id)
        if t is None:
            continue  # opened with the right partitions when first used
        for pid, p in enumerate(pl.partitions):
            if p.replicas == (me,) and pid not in t.owned:
                await sv.db.handoffs.take(d, pid, p.epoch)


async def call_hand_off(sv: Serving, owner: str, table: str, pid: int, to: str) -> dict[str, Any]:
    """Ask ``owner`` to move one of its one-copy partitions to ``to``."""
    status, _, payload = await asyncio.wait_for(
        sv.cluster.call(owner, "POST", "/v1/internal/handoff", doc={"table": table, "pid": pid, "to": to}),
        CALL_TIMEOUT_S)
    doc: dict[str, Any] = json.loads(payload or b"{}")
    if status != 200:
        msg = doc.get("error", {}).get("message", "") if isinstance(doc, dict) else ""
        raise RemoteError(status, (doc.get("error") or {}).get("code", "unavailable"), f"node {owner}: {msg}"[:300])
    return doc


def single_copy_moves(tables: Iterable[tuple[TableDef, Placement]], live: Set[str],
                      leaving: Set[str] = frozenset()) -> list[tuple[str, int, str, str]]:
    """One-copy partitions to move now, as ``(table, pid, from, to)``: every one on a node in
    ``leaving``, then (when nothing leaves) one from the member serving the most to the one
    serving the fewest while they differ by more than one. Targets are the least loaded."""
    tables = list(tables)
    led, _ = counts(pl for _, pl in tables)
    load = {m: sum(1 for _, pl in tables for p in pl.partitions if p.replicas == (m,)) for m in live - leaving}
    if not load:
        return []
    out: list[tuple[str, int, str, str]] = []
    for d, pl in tables:
        for pid, p in enumerate(pl.partitions):
            if len(p.replicas) == 1 and p.leader in leaving:
                to = min(load, key=lambda m: (load[m], led.get(m, 0), m))
                load[to] += 1
                out.append((d.name, pid, p.leader, to))
    if out or leaving:
        return out
    hi, lo = max(load, key=lambda m: (load[m], m)), min(load, key=lambda m: (load[m], m))
    if load[hi] - load[lo] > 1:
        for d, pl in tables:
            for pid, p in enumerate(pl.partitions):
                if p.replicas == (hi,):
                    return [(d.name, pid, hi, lo)]
    return []
