"""The cluster's admin endpoints (docs/REFERENCE.md §3: `GET /v1/admin/cluster`, `terrascale admin cluster
add|remove`): the view, and Raft membership changes — a removal first moves the partitions
the node holds the only copy of (RFC 0010 §7, ``node/cluster/handoff.py``) and hands over the
leaderships it holds."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from catalog.errors import CatalogConfigError, CatalogError, CatalogTimeoutError, CatalogUnavailableError
from catalog.raft import RaftCatalog
from node.cluster.members import RemoteError
from node.cluster.handoff import call_hand_off, hand_off, single_copy_moves
from node.http.api import Api
from node.http.edge import one_line
from node.http.params import bound, json_object
from node.errors import ApiError
from rowstore.errors import RowstoreError
from node.http.answers import json_answer

log = logging.getLogger("terrascale.node")
HAND_OVER_TRIES = 3  # planned elections a leaving node's leadership gets before the forced one after it left


def add_membership_routes(api: Api, router: web.UrlDispatcher) -> None:
    router.add_get("/v1/admin/cluster", bound(api, cluster))
    router.add_get("/v1/admin/nodes", bound(api, nodes))
    router.add_post("/v1/admin/cluster/members", bound(api, add_member))
    router.add_delete("/v1/admin/cluster/members/{address}", bound(api, remove_member))


async def cluster(api: Api, request: web.Request) -> web.Response:
    api.db  # noqa: B018 - 503 before ready
    return json_answer(await api.views.cluster_view())


async def nodes(api: Api, request: web.Request) -> web.Response:
    """Every member's own ``/v1/admin/status`` (version, health, the partitions it leads and
    their followers' lag), asked by this node: a browser may call only the node that served
    the console. A member that does not answer within 3 s is listed with ``"status": null``."""
    api.db  # noqa: B018 - 503 before ready
    view = await api.views.cluster_view()
    return json_answer({"nodes": await asyncio.gather(*(_node_status(api, m) for m in view["members"]))})


async def _node_status(api: Api, member: dict[str, Any]) -> dict[str, Any]:
    out = {"id": member["id"], "address": member.get("address"), "alive": member["alive"]}
    try:
        if member["id"] == api.cfg.node_id:
            return {**out, "status": await api.views.status(), "error": None}
        code, _, body = await asyncio.wait_for(api.cluster.call(member["id"], "GET", "/v1/admin/status"), 3)
        if code != 200:
            return {**out, "status": None, "error": f"HTTP {code}: {body[:200].decode(errors='replace')}"}
        return {**out, "status": json.loads(body), "error": None}
    except (ApiError, CatalogError, ConnectionError, OSError, asyncio.TimeoutError, ValueError) as e:
        return {**out, "status": None, "error": one_line(e) or type(e).__name__}


async def add_member(api: Api, request: web.Request) -> web.Response:
    """Add one Raft member (a node started with the current members and ``self=`` its own
    address); one change at a time (docs/raft.md)."""
    doc = await json_object(request, {"raft_address"}, ("raft_address",))
    await _membership(api, "add", doc["raft_address"])
    if api.cluster.multi:  # a member removed earlier and added back without a restart: placeable again
        back = {n for n, m in (await api.cluster.members()).items() if m.get("raft") == doc["raft_address"]}
        await api.cluster.leaving(back, False)
    return json_answer(await api.views.cluster_view())


async def remove_member(api: Api, request: web.Request) -> web.Response:
    """Remove one Raft member. Partitions it holds the only copy of are moved to the
    others first (through objects, while it can still write the catalog); if one cannot
    be (the node does not answer), 409 and nothing more changes — unless ``force=true``,
    which removes it at once (those partitions are unreadable until it is added back)."""
    address = request.match_info["address"]
    force = request.query.get("force", "false")
    if force not in ("true", "false"):
        raise ApiError(400, "bad_request", "force is true or false")
    cluster, cat = api.cluster, api.serving.catalog
    leaving: set[str] = set()
    if force == "false" and cluster.multi:
        leaving = {n for n, m in (await cluster.members()).items() if m.get("raft") == address}
    if leaving and isinstance(cat, RaftCatalog) and (await cat.cluster_status()).get("leader") == address:
        raise ApiError(409, "membership_refused", f"{address} leads the catalog's Raft group: transfer its "
                                                  "leadership first (docs/raft.md); nothing moved or removed")
    removed = False
    try:
        if leaving:
            await cluster.leaving(leaving, True)  # nothing is moved onto it from now on
            await _move_only_copies(api, leaving)
            await _hand_over_leaderships(api, leaving)
        await _membership(api, "remove", address)
        removed = True
    finally:
        # A removed node stays marked: the members' Raft views learn of the removal one by one,
        # and a driver whose view still held it moved a leadership back onto it (the membership
        # benchmark's removal). Its mark goes when it starts again (Cluster.register).
        if leaving and not removed:
            await cluster.leaving(leaving, False)
    return json_answer(await api.views.cluster_view())


async def _move_only_copies(api: Api, leaving: set[str]) -> None:
    """Move every partition a leaving node holds the only copy of to the other members
    (rounds until none is left: a move the driver started meanwhile ends first)."""
    cluster, repl = api.cluster, api.replication
    for _ in range(5):
        moves = single_copy_moves(await repl._placed(), set(await cluster.placeable()) - repl.silent(), leaving)
        if not moves:
            return
        for table, pid, owner, to in moves:
            try:
                if owner == cluster.node_id:
                    await hand_off(api.serving, table, pid, to)
                else:
                    await call_hand_off(api.serving, owner, table, pid, to)
            except (ApiError, RemoteError, RowstoreError, CatalogError, ConnectionError,
                    asyncio.TimeoutError) as e:
                raise ApiError(409, "membership_refused",
                               f"node {owner} holds the only copy of partition {pid} of {table!r} and it could "
                               f"not be moved ({one_line(e)}); nothing removed. Remove it anyway with force=true "
                               "(terrascale admin cluster remove --force): its partitions return if it is added "
                               "back") from None
            log.warning("event=member_leaving_partition_moved table=%s partition=%d to=%s", table, pid, to)
        await asyncio.sleep(0.2)
    raise ApiError(409, "membership_refused", f"partitions of {sorted(leaving)} kept arriving; nothing removed")


async def _hand_over_leaderships(api: Api, leaving: set[str]) -> None:
    """Each replicated partition a leaving node leads gets another leader first, by a planned
    election (the leader fenced first, no lease to wait out): its writes pause for one election
    instead of the failure timeout and a forced election once the node is out of the catalog.
    Best effort: a hand-over refused (another replica down) is left to that forced election."""
    repl = api.replication
    for d, pl in await repl._placed():
        for pid, p in enumerate(pl.partitions):
            if p.leader not in leaving or len(p.replicas) < 2:
                continue
            moved, why = False, ""
            for attempt in range(HAND_OVER_TRIES):  # a fence that timed out on a loaded node is tried again
                try:
                    moved = await repl.elect(d, pid, exclude=set(), handoff=p.leader)
                except (RemoteError, RowstoreError, CatalogError, ConnectionError, asyncio.TimeoutError) as e:
                    why = one_line(e)
                if moved:
                    break
                await asyncio.sleep(0.2 * (attempt + 1))
            log.warning("event=member_leaving_leader_handed_over table=%s partition=%d from=%s moved=%s %s",
                        d.name, pid, p.leader, moved, why)


async def _membership(api: Api, op: str, address: object) -> None:
    api.db  # noqa: B018 - 503 before ready
    cat = api.serving.catalog
    if not isinstance(cat, RaftCatalog):
        raise ApiError(409, "not_a_cluster", "this node's catalog is trkv:// (one node); membership needs raft://")
    if not isinstance(address, str):
        raise ApiError(400, "bad_request", '"raft_address" is "host:port"')
    try:
        await (cat.add_member(address) if op == "add" else cat.remove_member(address))
    except CatalogConfigError as e:
        raise ApiError(400, "bad_request", one_line(e)) from None
    except (CatalogUnavailableError, CatalogTimeoutError):
        raise
    except CatalogError as e:
        raise ApiError(409, "membership_refused", one_line(e)) from None
