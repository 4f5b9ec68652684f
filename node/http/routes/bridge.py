"""Endpoints for external readers — the Spark bridge (docs/rfcs/0006-external-reads.md).

Beyond the data API (docs/REFERENCE.md §3): a snapshot (the closed timestamp
and the schema at it), a read plan pinning a timestamp, the unsealed tail of one partition,
the change feed between two timestamps, and read leases. Errors go through the same edge as
every other endpoint (``node/http/api.py``); ``docs/openapi.yaml`` documents them.
"""
from __future__ import annotations

import asyncio
import base64
import re
from typing import Any

from aiohttp import web

from node.http.api import Api
from node.http.params import bound, as_of_param, as_of_value, off_loop_if_big, json_object, where_terms
from node.errors import ApiError
from node.wire import ARROW_STREAM, write_arrow_stream
from rowstore.reads.plan import SegmentSlice
from rowstore.reads.predicates import parse_bbox, parse_where
from rowstore.schema import SchemaVersion
from node.http.answers import json_answer
from terrafs.fs import TerrascaleFS
from terrafs.sealed import SealedFile

# A read plan's client request id: plans of one id share one lease, so the client may repeat one.
REQUEST_ID = re.compile(r"[A-Za-z0-9._~-]{1,64}")


def add_bridge_routes(api: Api, router: web.UrlDispatcher) -> None:
    h_snapshot, h_plan, h_tail, h_changes, h_renew, h_release = map(
        lambda h: bound(api, h), (snapshot, plan, tail, changes, renew, release))
    router.add_get("/v1/tables/{table}/snapshot", h_snapshot)
    router.add_post("/v1/tables/{table}/plan", h_plan)
    router.add_post("/v1/tables/{table}/tail", h_tail)
    router.add_post("/v1/tables/{table}/changes", h_changes)
    router.add_post("/v1/leases/{lease}/renew", h_renew)
    router.add_delete("/v1/leases/{lease}", h_release)


async def snapshot(api: Api, request: web.Request) -> web.Response:
    """The read timestamp T (the closed timestamp, or ``as_of`` once closed), the table's
    schema at T, and ``changed_ts``: the newest commit of the table's rows at or below T (a
    change feed's offset moves only when the table changes, not with an idle clock)."""
    as_of = as_of_param(request)
    T, changed = await api.spread.snapshot(request.match_info["table"], as_of)
    d = await api.db.describe(request.match_info["table"], T, trusted=True)  # T: the cluster's, checked
    assert d.schema is not None  # a live table's (Database.describe)
    return json_answer({"as_of": T, "table": d.name, "table_id": d.table_id, "schema": d.schema.to_json(),
                              "changed_ts": changed})


async def plan(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"as_of", "where", "bbox", "sealed_only", "lease_s", "typed", "presign", "keys",
                                      "request_id"})
    flags = {k: doc.get(k, False) for k in ("sealed_only", "typed", "presign", "keys")}
    for k, v in flags.items():
        if not isinstance(v, bool):
            raise ApiError(400, "bad_request", f'"{k}" is true or false')
    lease_s = _seconds(doc.get("lease_s", 600))
    rid = doc.get("request_id")
    if rid is not None and not (isinstance(rid, str) and REQUEST_ID.fullmatch(rid)):
        raise ApiError(400, "bad_request", '"request_id" is 1 to 64 letters, digits and ._~-')
    out = await api.spread.plan(request.match_info["table"], as_of_value(doc.get("as_of")),
                                where_terms(doc, request), doc.get("bbox"), flags["sealed_only"], lease_s, rid)
    body = out.to_json()  # rowstore.reads.plan.ReadPlan: "version" is the plan format's
    if flags["typed"]:
        body["predicates"] = typed_predicates(out.schema, doc.get("where"), doc.get("bbox"))
    if flags["presign"] and hasattr(api.db.fs.objects, "presign_get"):
        for s in body["sealed"]:  # executors read S3 objects over plain HTTPS: no SDK, no credentials
            s["url"] = await api.db.fs.objects.presign_get(s["key"], lease_s + 3600)
    if flags["keys"] and api.db.fs.kek is not None:
        keys = await asyncio.gather(*(_data_key(api.db.fs, s) for s in out.sealed))
        for s, key in zip(body["sealed"], keys):
            s["data_key"] = key
    return json_answer(body)


async def _data_key(fs: TerrascaleFS, part: SegmentSlice) -> str:
    """An encrypted object's data key, unwrapped (base64): a reader given it needs no key file.
    It opens that one object only — whoever may ask for the plan may read its rows anyway."""
    kek = fs.kek
    assert kek is not None  # asked only of a node that encrypts (plan)
    sf = await SealedFile.open(fs.objects, part.key, object_size=part.object_size, kek=kek)
    p = sf.params
    return base64.b64encode(kek.unwrap(p.wrapped_key, p.key_id, p.inode, sf.where)).decode()


def typed_predicates(schema: SchemaVersion, where: object, bbox: object) -> dict[str, Any]:
    """The plan's ``where``/``bbox`` as the node parsed them: each term's column id, op and value
    in the column's storage domain (integers, floats, booleans, strings; timestamps as µs and
    dates as days since the epoch; binary and uuid values base64), so an external reader
    evaluates exactly the node's predicates without parsing values itself."""
    terms: list[dict[str, Any]] = []
    for t in parse_where(schema, where):
        v = t.value
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode()
        terms.append({"column_id": t.column.id, "column": t.column.name, "op": t.op, "value": v})
    box = parse_bbox(schema, bbox)
    out: dict[str, Any] = {"terms": terms, "bbox": None}
    if box is not None:
        out["bbox"] = {"column_id": box.column.id, "column": box.column.name, "xmin": box.xmin, "ymin": box.ymin,
                       "xmax": box.xmax, "ymax": box.ymax}
    return out


async def tail(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"partition", "as_of", "where", "bbox", "sealed"}, ("partition", "as_of"))
    p = doc["partition"]
    if isinstance(p, bool) or not isinstance(p, int):
        raise ApiError(400, "bad_request", '"partition" is an integer')
    sealed = _segids(doc.get("sealed"))
    as_of = as_of_value(doc["as_of"])
    if as_of is None:  # required (the plan's T): null would read the tail as of now
        raise ApiError(400, "invalid_as_of", "as_of must be a commit timestamp (a non-negative integer), not None")
    t = await api.db.tail(request.match_info["table"], p, as_of, where_terms(doc, request), doc.get("bbox"), sealed)
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM)


async def changes(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"after", "upto"}, ("after",))
    t, upto = await api.spread.changes(request.match_info["table"], doc["after"], as_of_value(doc.get("upto")))
    return web.Response(body=await off_loop_if_big(t.nbytes, write_arrow_stream, t), content_type=ARROW_STREAM,
                        headers={"X-Terrascale-As-Of": str(upto)})


async def renew(api: Api, request: web.Request) -> web.Response:
    doc = await json_object(request, {"ttl_s"})
    ttl = _seconds(doc.get("ttl_s", 600))
    await api.db.renew_lease(request.match_info["lease"], ttl)  # an expired lease: 409 lease_expired
    return json_answer({"lease": request.match_info["lease"], "renewed": True})


async def release(api: Api, request: web.Request) -> web.Response:
    await api.db.release_lease(request.match_info["lease"])
    return json_answer({"lease": request.match_info["lease"], "released": True})


def _seconds(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 86_400:
        raise ApiError(400, "bad_request", f"a lease lasts 0..86400 seconds, not {v!r}")
    return float(v)


def _segids(raw: object) -> list[int] | None:
    """A request's ``sealed``: None, or the plan's sealed segment ids."""
    if raw is None:
        return None
    if not isinstance(raw, list) or any(isinstance(s, bool) or not isinstance(s, int) for s in raw):
        raise ApiError(400, "bad_request", '"sealed" is a list of segment ids (the plan\'s sealed segids)')
    return [int(s) for s in raw]
