"""Endpoints for external readers — the Spark bridge (docs/rfcs/0006-external-reads.md).

Beyond the contract's table (CONTRACT.md §3 allows more): a read plan pinning a timestamp,
the unsealed tail of one partition, the change feed between two timestamps, and read
leases. Errors go through the same edge as every other endpoint (``node/api.py``).
"""
from __future__ import annotations

from aiohttp import web

from node.api import ApiError, _as_of_value, _cpu, _json_object
from node.codec import ARROW_STREAM, write_arrow_stream


def add_bridge_routes(api, router) -> None:
    router.add_post("/v1/tables/{table}/plan", lambda r: plan(api, r))
    router.add_post("/v1/tables/{table}/tail", lambda r: tail(api, r))
    router.add_post("/v1/tables/{table}/changes", lambda r: changes(api, r))
    router.add_post("/v1/leases/{lease}/renew", lambda r: renew(api, r))
    router.add_delete("/v1/leases/{lease}", lambda r: release(api, r))


async def plan(api, request):
    doc = await _json_object(request, {"as_of", "where", "bbox", "sealed_only", "lease_s"})
    sealed_only = doc.get("sealed_only", False)
    if not isinstance(sealed_only, bool):
        raise ApiError(400, "bad_request", '"sealed_only" is true or false')
    out = await api.db.read_plan(request.match_info["table"], _as_of_value(doc.get("as_of")), doc.get("where"),
                                 doc.get("bbox"), sealed_only, _seconds(doc.get("lease_s", 600)))
    return web.json_response(out)


async def tail(api, request):
    doc = await _json_object(request, {"partition", "as_of", "where", "bbox"}, ("partition", "as_of"))
    p = doc["partition"]
    if isinstance(p, bool) or not isinstance(p, int):
        raise ApiError(400, "bad_request", '"partition" is an integer')
    t = await api.db.tail(request.match_info["table"], p, _as_of_value(doc["as_of"]), doc.get("where"),
                          doc.get("bbox"))
    return web.Response(body=await _cpu(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def changes(api, request):
    doc = await _json_object(request, {"after", "upto"}, ("after",))
    t, upto = await api.db.changes(request.match_info["table"], doc["after"], _as_of_value(doc.get("upto")))
    return web.Response(body=await _cpu(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM,
                        headers={"X-Terrascale-As-Of": str(upto)})


async def renew(api, request):
    doc = await _json_object(request, {"ttl_s"})
    await api.db.renew_lease(request.match_info["lease"], _seconds(doc.get("ttl_s", 600)))
    return web.json_response({"lease": request.match_info["lease"], "renewed": True})


async def release(api, request):
    await api.db.release_lease(request.match_info["lease"])
    return web.json_response({"lease": request.match_info["lease"], "released": True})


def _seconds(v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86_400:
        raise ApiError(400, "bad_request", f"a lease lasts 0..86400 seconds, not {v!r}")
    return float(v)
