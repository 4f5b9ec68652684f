"""The node's own endpoints (docs/REFERENCE.md §3): health and readiness, metrics, status,
segments, and the background jobs run now — seal, offload, checkpoint, GC (RFC 0009)."""
from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from catalog.errors import CatalogError
from node.errors import ApiError
from node.http.edge import error, one_line
from node.http.params import bound, json_object
from node.http.ports import HandlerApi
from rowstore.segments.records import SegmentRecord
from node.http.answers import json_answer

JOBS = ("seal", "offload", "checkpoint")


def add_admin_routes(api: HandlerApi, router: web.UrlDispatcher) -> None:
    router.add_get("/healthz", bound(api, healthz))
    router.add_get("/readyz", bound(api, readyz))
    router.add_get("/metrics", bound(api, metrics))
    router.add_get("/v1/admin/status", bound(api, status))
    router.add_get("/v1/admin/segments", bound(api, segments))
    for name in JOBS:
        router.add_post(f"/v1/admin/{name}", bound(api, job))
    router.add_post("/v1/admin/gc", bound(api, gc))


async def healthz(api: HandlerApi, request: web.Request) -> web.Response:
    return json_answer({"status": "ok"})


async def readyz(api: HandlerApi, request: web.Request) -> web.Response:
    if not api.readiness.ready:
        return error(503, "not_ready", "recovery has not finished" if not api.readiness.stopping
                     else "the node is stopping")
    try:
        await asyncio.wait_for(api.serving.catalog.revision(), 5)  # the catalog answers
    except (CatalogError, asyncio.TimeoutError) as e:
        return error(503, "not_ready", f"the catalog does not answer: {one_line(e)}")
    space = api.db.space()
    if not space["writable"] and request.query.get("for") == "writes":
        return error(503, "not_ready", f"the block device is full ({space['partitions_full']} partitions "
                     "stopped); reads are served, writes resume once space is freed")
    return json_answer({"status": "ready", "writes": space["writable"]})


async def metrics(api: HandlerApi, request: web.Request) -> web.Response:
    body, ctype = await api.views.render_metrics()
    return web.Response(body=body, headers={"Content-Type": ctype})


async def status(api: HandlerApi, request: web.Request) -> web.Response:
    api.db  # noqa: B018 - 503 before ready
    return json_answer(await api.views.status())


async def segments(api: HandlerApi, request: web.Request) -> web.Response:
    table = request.query.get("table")
    db = api.db
    recs = await db.segment_records(table)
    return json_answer({"segments": [_segment_json(name, r) for name, r in recs]})


async def job(api: HandlerApi, request: web.Request) -> web.Response:
    """``POST /v1/admin/{seal,offload,checkpoint}``: the job now, on this node."""
    name = request.path.rsplit("/", 1)[1]
    api.db  # noqa: B018 - 503 before ready
    return json_answer({"job": name, **await api.jobs.run(name)})


async def gc(api: HandlerApi, request: web.Request) -> web.Response:
    """One garbage-collection pass now (RFC 0009); ``{"table": T, "dry_run": bool}`` optional."""
    api.db  # noqa: B018 - 503 before ready
    doc = await json_object(request, {"table", "dry_run"}) if await request.read() else {}
    table, dry = doc.get("table"), doc.get("dry_run", False)
    if table is not None and not isinstance(table, str):
        raise ApiError(400, "bad_request", '"table" must be a table name')
    if not isinstance(dry, bool):
        raise ApiError(400, "bad_request", '"dry_run" must be true or false')
    return json_answer(await api.jobs.run("gc", table=table, dry_run=dry))


def _segment_json(table: str, r: SegmentRecord) -> dict[str, Any]:
    """A segment row as the node sees it now (``Database.segment_records``: an active segment
    of this node reports its durable rows and bytes so far)."""
    return {"segid": r.segid, "table": table, "partition": r.partition, "state": r.state.value,
            "rows": r.rows, "live_rows": r.live_rows, "bytes": r.bytes, "live_bytes": r.live_bytes,
            "location": r.location, "owner": r.owner, "min_ts": r.min_ts, "max_ts": r.max_ts,
            "garbage_ratio": round(1 - r.live_rows / r.rows, 4) if r.rows and r.state.value != "active" else 0.0,
            "cluster": r.cluster}
