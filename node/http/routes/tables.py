"""Tables (docs/REFERENCE.md §3): create — placed across the members first in a cluster (RFC
0010) — list, describe (with each partition's placement and watermark), drop, and schema
changes, announced to the other members so none keeps a stale definition."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from node.config import MAX_REPLICAS
from node.errors import ApiError
from node.http.params import as_of_param, bound, json_object, schema_from_json
from node.http.ports import HandlerApi
from node.wire import schema_to_json
from rowstore.db.database import Database
from rowstore.errors import TableNotFoundError
from rowstore.reads.retention import parse_retention, retention_json
from rowstore.schema import _check_name
from rowstore.tables.definitions import TableDef
from node.http.answers import json_answer

log = logging.getLogger("terrascale.node")


def add_table_routes(api: HandlerApi, router: web.UrlDispatcher) -> None:
    router.add_post("/v1/tables", bound(api, create_table))
    router.add_get("/v1/tables", bound(api, list_tables))
    router.add_get("/v1/tables/{table}", bound(api, describe))
    router.add_delete("/v1/tables/{table}", bound(api, drop_table))
    router.add_patch("/v1/tables/{table}", bound(api, change_table))
    router.add_post("/v1/tables/{table}/columns", bound(api, add_column))
    router.add_delete("/v1/tables/{table}/columns/{column}", bound(api, drop_column))
    router.add_patch("/v1/tables/{table}/columns/{column}", bound(api, rename_column))


async def create_table(api: HandlerApi, request: web.Request) -> web.Response:
    doc = await json_object(request, {"name", "columns", "primary_key", "partition_key", "indexes", "partitions",
                                       "replicas", "cluster_by", "retention"},
                             required=("name", "columns", "primary_key"))
    name = doc["name"]
    if not isinstance(name, str):
        raise ApiError(400, "invalid_schema", '"name" must be a string')
    _check_name(name)
    schema = schema_from_json(doc["columns"], doc["primary_key"], doc.get("partition_key"))
    indexes = doc.get("indexes") or []
    if not isinstance(indexes, list) or not all(isinstance(i, str) for i in indexes):
        raise ApiError(400, "invalid_schema", '"indexes" must be a list of column names')
    partitions = doc.get("partitions")
    if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)):
        raise ApiError(400, "invalid_schema", '"partitions" must be an integer')
    replicas = doc.get("replicas", api.cfg.replicas)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
        raise ApiError(400, "invalid_schema", f'"replicas" must be an integer 1..{MAX_REPLICAS}')
    multi = api.multi
    if replicas > 1 and not multi:
        raise ApiError(400, "invalid_schema", f'"replicas": {replicas} copies need a cluster of at least '
                                              f'{replicas} nodes (this node runs alone, catalog trkv://)')
    cluster_by = doc.get("cluster_by")
    if cluster_by is not None and not isinstance(cluster_by, str):
        raise ApiError(400, "invalid_schema", '"cluster_by" must be a column name')
    parse_retention(schema, doc.get("retention"))  # refused before the placement is written
    db = api.db
    if api.multi:
        db.forget_cached_definitions(name)
        await api.cluster.place(name, partitions or db.cfg.partitions, lambda: _exists(db, name), replicas)
    d = await db.create_table(name, schema, indexes=indexes, partitions=partitions, cluster_by=cluster_by,
                              retention=doc.get("retention"))
    if replicas > 1:
        await api.replication.started(d)  # each leader takes its partitions at epoch 1
    log.info("event=table_created table=%s partitions=%d", name, d.partitions)
    return json_answer(_table_json(d), status=201)


async def list_tables(api: HandlerApi, request: web.Request) -> web.Response:
    as_of = as_of_param(request)
    db = api.db
    if api.multi:
        db.forget_cached_definitions()  # other nodes change the catalog too
    return json_answer({"tables": [_table_json(d) for d in await db.list_tables(as_of)]})


async def describe(api: HandlerApi, request: web.Request) -> web.Response:
    d = await api.db.describe(request.match_info["table"], as_of_param(request))
    out = _table_json(d)
    out["placement"] = (await api.cluster.placement(d.name, d.partitions)).json()  # leaders, replicas
    marks = await api.db.watermarks(d.table_id)
    for p in out["placement"]:  # reads as of T <= it are served without the leader (RFC 0010 §6)
        p["watermark"] = marks.get(p["partition"])
    return json_answer(out)


async def drop_table(api: HandlerApi, request: web.Request) -> web.Response:
    d = await api.db.drop_table(request.match_info["table"])
    await _announce(api, d.name)
    log.info("event=table_dropped table=%s", d.name)
    return json_answer({"dropped": d.name, "commit_ts": d.ts})


async def change_table(api: HandlerApi, request: web.Request) -> web.Response:
    """``{"retention": {"column", "keep"} | null}``: a new definition version (RFC 0016 §5)."""
    doc = await json_object(request, {"retention"}, required=("retention",))
    d = await api.db.set_retention(request.match_info["table"], doc["retention"])
    await _announce(api, d.name)
    log.info("event=table_changed table=%s retention=%s", d.name, retention_json(d))
    return json_answer(_table_json(d))


async def add_column(api: HandlerApi, request: web.Request) -> web.Response:
    doc = await json_object(request, {"name", "type", "nullable"}, required=("name", "type"))
    name, type_text = doc["name"], doc["type"]
    if not isinstance(name, str) or not isinstance(type_text, str):
        raise ApiError(400, "invalid_schema", '"name" and "type" must be strings')
    if doc.get("nullable", True) is not True:
        raise ApiError(400, "invalid_schema", "an added column is nullable (existing rows have no value)")
    d = await api.db.alter_table(request.match_info["table"], lambda s: s.add_column(name, type_text))
    await _announce(api, d.name)
    return json_answer(_table_json(d))


async def drop_column(api: HandlerApi, request: web.Request) -> web.Response:
    col = request.match_info["column"]
    d = await api.db.alter_table(request.match_info["table"], lambda s: s.drop_column(col))
    await _announce(api, d.name)
    return json_answer(_table_json(d))


async def rename_column(api: HandlerApi, request: web.Request) -> web.Response:
    doc = await json_object(request, {"name"}, required=("name",))
    new, old = doc["name"], request.match_info["column"]
    if not isinstance(new, str):
        raise ApiError(400, "invalid_schema", '"name" must be a string')
    d = await api.db.alter_table(request.match_info["table"], lambda s: s.rename_column(old, new))
    await _announce(api, d.name)
    return json_answer(_table_json(d))


async def _announce(api: HandlerApi, name: str) -> None:
    """A table's definition changed: every other member drops its cached one (best effort —
    a member that misses it reads the catalog again when its placement row is re-read)."""
    if not api.multi:
        return
    cluster = api.cluster
    others = [n for n in await cluster.members() if n != cluster.node_id]
    got = await asyncio.gather(*(cluster.call(n, "POST", "/v1/internal/forget", doc={"table": name})
                                 for n in others), return_exceptions=True)
    for n, g in zip(others, got):
        if isinstance(g, BaseException) or g[0] != 200:
            log.warning("event=forget_unsent table=%s node=%s error=%r", name, n, g)


async def _exists(db: Database, name: str) -> bool:
    try:
        await db.describe(name)
        return True
    except TableNotFoundError:
        return False


def _table_json(d: TableDef) -> dict[str, Any]:
    schema = d.schema
    assert schema is not None  # a live table's (Database.describe, list_tables, create_table, alter_table)
    pk = schema.pk
    key: str | list[str] = pk.names[0] if len(pk.names) == 1 else pk.names  # a key of one column: its name
    return {"name": d.name, "table_id": d.table_id, "columns": schema_to_json(schema),
            "primary_key": key, "partition_key": pk.partition_names, "indexes": d.index_names(),
            "partitions": d.partitions,
            "cluster_by": d.cluster_column.name if d.cluster_column is not None else key,
            "retention": retention_json(d), "schema_version": schema.version, "ts": d.ts}
