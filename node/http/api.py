"""The HTTP API (docs/REFERENCE.md §3; OpenAPI: docs/openapi.yaml).

Errors from the engine are translated once, here, into the documented shape
``{"error": {"code", "message"}}``; nothing else reaches a client. JSON bodies
are parsed and converted to Arrow in a worker thread once they are large, and
so are large responses, so one big request never stalls the others.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import time

from aiohttp import web

from catalog.errors import (CatalogError)
from node.http.coalesce import Coalescer
from node.http.edge import one_line, answer, error
from node.wire import (ARROW_STREAM, read_arrow_stream, row_to_json, rows_to_table,
                        schema_to_json, table_to_rows, write_arrow_stream)
from node.config import MAX_REPLICAS
from node.http.params import (CONFIG, THREAD_BYTES, THREAD_ROWS, as_of_param, as_of_value, off_loop_if_big, json_body,
                              json_object, parse_json, rows_of, schema_from_json, where_terms)
from node.errors import ApiError
from node.cluster.router import Router
from rowstore.db.read.reader import MAX_LIMIT
from rowstore.errors import (TableNotFoundError)
from rowstore.tables.key_check import show
from rowstore.schema import _check_name

log = logging.getLogger("terrascale.node")


# whole-table endpoints sent to the node serving every partition (RFC 0010 §2); row
# endpoints route inside their handlers, where the keys are known
_WHOLE_TABLE = {"/v1/tables/{table}/snapshot", "/v1/tables/{table}/plan", "/v1/tables/{table}/tail",
                "/v1/tables/{table}/changes"}
class Api:
    def __init__(self, node):
        self.node = node
        self.router = Router(node)
        self._writes: Coalescer | None = None

    @property
    def writes(self) -> Coalescer:
        """Small writes coalesce here (node/http/coalesce.py); one per opened engine."""
        db = self.db
        if self._writes is None or self._writes.db is not db:
            self._writes = Coalescer(db, self.node.metrics)
        return self._writes

    def _parsed(self, body: bytes):
        t0 = time.perf_counter()
        doc = parse_json(body, self.node.cfg.max_json_depth)
        self.node.metrics.write_stage.labels("parse").inc(time.perf_counter() - t0)
        return doc

    @property
    def db(self):
        if not self.node.ready:
            raise ApiError(503, "not_ready", "the node is starting or stopping (see /readyz)")
        return self.node.db

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._edge], client_max_size=self.node.cfg.max_body)
        app[CONFIG] = self.node.cfg
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_get("/readyz", self.readyz)
        r.add_get("/metrics", self.metrics)
        r.add_post("/v1/tables", self.create_table)
        r.add_get("/v1/tables", self.list_tables)
        r.add_get("/v1/tables/{table}", self.describe)
        r.add_delete("/v1/tables/{table}", self.drop_table)
        r.add_post("/v1/tables/{table}/columns", self.add_column)
        r.add_delete("/v1/tables/{table}/columns/{column}", self.drop_column)
        r.add_patch("/v1/tables/{table}/columns/{column}", self.rename_column)
        r.add_post("/v1/tables/{table}/rows", self.upsert)
        r.add_post("/v1/tables/{table}/delete", self.delete_rows)
        r.add_get("/v1/tables/{table}/rows/{key:[^/]+}", self.get_row)  # braces too: "[^{}/]+" is the default
        r.add_post("/v1/tables/{table}/query", self.query)
        r.add_get("/v1/admin/status", self.status)
        r.add_get("/v1/admin/segments", self.segments)
        for job in ("seal", "offload", "checkpoint"):
            r.add_post(f"/v1/admin/{job}", self._job(job))
        r.add_post("/v1/admin/gc", self.gc)
        return app

    # -- the edge: auth, routing to the owner, errors, metrics ------------------------------------

    @web.middleware
    async def _edge(self, request: web.Request, handler):
        self.node.guard.headed(request.transport)  # a request head arrived: no longer pending
        m = self.node.metrics
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        t0 = time.perf_counter()
        m.in_flight.inc()
        try:
            resp = await self._guarded(request, handler)
        finally:
            m.in_flight.dec()
        m.requests.labels(request.method, route, str(resp.status)).inc()
        m.latency.labels(request.method, route).observe(time.perf_counter() - t0)
        return resp

    async def _guarded(self, request: web.Request, handler) -> web.StreamResponse:
        try:
            if request.path != "/healthz" and not self._authorized(request):
                return error(401, "unauthorized", "missing or wrong bearer token")
            table = request.match_info.get("table")
            if table is not None and request.match_info.route.resource.canonical in _WHOLE_TABLE:
                self.db  # noqa: B018 - 503 before ready (the placement needs the catalog)
                forwarded = await self.router.whole_table(request, table)
                if forwarded is not None:
                    return forwarded
            return await handler(request)
        except Exception as e:  # noqa: BLE001 - every failure becomes one error answer (node/http/edge.py)
            return answer(request, e)

    def _authorized(self, request) -> bool:
        tok = self.node.cfg.token
        if tok is None:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {tok}".encode())

    # -- health -----------------------------------------------------------------------------------

    async def healthz(self, request):
        return web.json_response({"status": "ok"})

    async def readyz(self, request):
        if not self.node.ready:
            return error(503, "not_ready", "recovery has not finished" if not self.node.stopping
                         else "the node is stopping")
        try:
            await asyncio.wait_for(self.node.catalog.revision(), 5)  # the catalog answers
        except (CatalogError, asyncio.TimeoutError) as e:
            return error(503, "not_ready", f"the catalog does not answer: {one_line(e)}")
        space = self.node.db.space()
        if not space["writable"] and request.query.get("for") == "writes":
            return error(503, "not_ready", f"the block device is full ({space['partitions_full']} partitions "
                         "stopped); reads are served, writes resume once space is freed")
        return web.json_response({"status": "ready", "writes": space["writable"]})

    async def metrics(self, request):
        body, ctype = await self.node.render_metrics()
        return web.Response(body=body, headers={"Content-Type": ctype})

    # -- tables -----------------------------------------------------------------------------------

    async def create_table(self, request):
        doc = await json_object(request, {"name", "columns", "primary_key", "indexes", "partitions", "replicas",
                                           "cluster_by"},
                                 required=("name", "columns", "primary_key"))
        name = doc["name"]
        if not isinstance(name, str):
            raise ApiError(400, "invalid_schema", '"name" must be a string')
        _check_name(name)
        schema = schema_from_json(doc["columns"], doc["primary_key"])
        indexes = doc.get("indexes") or []
        if not isinstance(indexes, list) or not all(isinstance(i, str) for i in indexes):
            raise ApiError(400, "invalid_schema", '"indexes" must be a list of column names')
        partitions = doc.get("partitions")
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)):
            raise ApiError(400, "invalid_schema", '"partitions" must be an integer')
        replicas = doc.get("replicas", self.node.cfg.replicas)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise ApiError(400, "invalid_schema", f'"replicas" must be an integer 1..{MAX_REPLICAS}')
        multi = self.node.cluster is not None and self.node.cluster.multi
        if replicas > 1 and not multi:
            raise ApiError(400, "invalid_schema", f'"replicas": {replicas} copies need a cluster of at least '
                                                  f'{replicas} nodes (this node runs alone, catalog trkv://)')
        cluster_by = doc.get("cluster_by")
        if cluster_by is not None and not isinstance(cluster_by, str):
            raise ApiError(400, "invalid_schema", '"cluster_by" must be a column name')
        db = self.db
        if self.node.cluster is not None and self.node.cluster.multi:
            db.forget_cached_definitions(name)
            await self.node.cluster.place(name, partitions or db.cfg.partitions, lambda: _exists(db, name), replicas)
        d = await db.create_table(name, schema, indexes=indexes, partitions=partitions, cluster_by=cluster_by)
        if replicas > 1:
            await self.node.replication.started(d)  # each leader takes its partitions at epoch 1
        log.info("event=table_created table=%s partitions=%d", name, d.partitions)
        return web.json_response(_table_json(d), status=201)

    async def list_tables(self, request):
        as_of = as_of_param(request)
        db = self.db
        if self.node.cluster is not None and self.node.cluster.multi:
            db.forget_cached_definitions()  # other nodes change the catalog too
        return web.json_response({"tables": [_table_json(d) for d in await db.list_tables(as_of)]})

    async def describe(self, request):
        d = await self.db.describe(request.match_info["table"], as_of_param(request))
        out = _table_json(d)
        if self.node.cluster is not None:  # each partition's leader and replicas (RFC 0010)
            out["placement"] = (await self.node.cluster.placement(d.name, d.partitions)).json()
            marks = await self.db.watermarks(d.table_id)
            for p in out["placement"]:  # reads as of T <= it are served without the leader (RFC 0010 §6)
                p["watermark"] = marks.get(p["partition"])
        return web.json_response(out)

    async def drop_table(self, request):
        d = await self.db.drop_table(request.match_info["table"])
        await self._announce(d.name)
        log.info("event=table_dropped table=%s", d.name)
        return web.json_response({"dropped": d.name, "commit_ts": d.ts})

    async def add_column(self, request):
        doc = await json_object(request, {"name", "type", "nullable"}, required=("name", "type"))
        name, type_text = doc["name"], doc["type"]
        if not isinstance(name, str) or not isinstance(type_text, str):
            raise ApiError(400, "invalid_schema", '"name" and "type" must be strings')
        if doc.get("nullable", True) is not True:
            raise ApiError(400, "invalid_schema", "an added column is nullable (existing rows have no value)")
        d = await self.db.alter_table(request.match_info["table"], lambda s: s.add_column(name, type_text))
        await self._announce(d.name)
        return web.json_response(_table_json(d))

    async def drop_column(self, request):
        col = request.match_info["column"]
        d = await self.db.alter_table(request.match_info["table"], lambda s: s.drop_column(col))
        await self._announce(d.name)
        return web.json_response(_table_json(d))

    async def rename_column(self, request):
        doc = await json_object(request, {"name"}, required=("name",))
        new, old = doc["name"], request.match_info["column"]
        if not isinstance(new, str):
            raise ApiError(400, "invalid_schema", '"name" must be a string')
        d = await self.db.alter_table(request.match_info["table"], lambda s: s.rename_column(old, new))
        await self._announce(d.name)
        return web.json_response(_table_json(d))

    async def _announce(self, name: str) -> None:
        """A table's definition changed: every other member drops its cached one (best effort —
        a member that misses it reads the catalog again when its placement row is re-read)."""
        cluster = self.node.cluster
        if cluster is None or not cluster.multi:
            return
        others = [n for n in await cluster.members() if n != cluster.node_id]
        got = await asyncio.gather(*(cluster.call(n, "POST", "/v1/internal/forget", doc={"table": name})
                                     for n in others), return_exceptions=True)
        for n, g in zip(others, got):
            if isinstance(g, BaseException) or g[0] != 200:
                log.warning("event=forget_unsent table=%s node=%s error=%r", name, n, g)

    # -- rows -------------------------------------------------------------------------------------

    async def upsert(self, request):
        table = request.match_info["table"]
        db = self.db
        body = await request.read()
        small = None
        if request.content_type == ARROW_STREAM:
            data = await off_loop_if_big(len(body), read_arrow_stream, body)
        elif request.content_type in ("application/json", "application/octet-stream", ""):
            d = await db.describe(table)
            if len(body) <= THREAD_BYTES:  # small: on the loop, and coalesced with its neighbours
                rows = rows_of(self._parsed(body))
                if not self.router.multi:  # in a cluster the router first finds where they go
                    res = await self.writes.upsert(d, rows)
                    if res is not None:
                        self.node.metrics.rows_written.labels("upsert").inc(res.count)
                        return web.json_response({"committed": res.count, "commit_ts": res.commit_ts})
                small = functools.partial(self.writes.upsert, d, rows)
                data = rows_to_table(rows, d.schema)
            else:
                depth = self.node.cfg.max_json_depth
                data = await asyncio.to_thread(lambda: rows_to_table(rows_of(parse_json(body, depth)), d.schema))
        else:
            raise ApiError(415, "unsupported_media_type",
                           f"rows come as application/json or {ARROW_STREAM}, not {request.content_type}")
        t0 = time.perf_counter()
        forwarded, res = await self.router.upsert(request, table, data, small)
        if forwarded is not None:
            return forwarded
        count, ts = res
        m = self.node.metrics
        m.write_wait.observe(time.perf_counter() - t0)
        m.batch_rows.observe(data.num_rows)
        m.rows_written.labels("upsert").inc(count)
        return web.json_response({"committed": count, "commit_ts": ts})

    async def delete_rows(self, request):
        doc = await json_object(request, {"keys"}, required=("keys",))
        if not isinstance(doc["keys"], list):
            raise ApiError(400, "invalid_rows", '"keys" must be a list')
        table, db = request.match_info["table"], self.db
        d = await db.describe(table)
        forwarded, res = await self.router.delete(request, table, doc["keys"],
                                                  small=lambda: self.writes.delete(d, doc["keys"]))
        if forwarded is not None:
            return forwarded
        self.node.metrics.rows_written.labels("delete").inc(len(doc["keys"]))
        return web.json_response({"deleted": res[0], "commit_ts": res[1]})

    async def get_row(self, request):
        table, raw = request.match_info["table"], request.match_info["key"]
        as_of = as_of_param(request)
        db = self.db
        d = await db.describe(table)
        forwarded = await self.router.get(request, d, raw)  # to the node serving the key's partition
        if forwarded is not None:
            return forwarded
        row = await db.get(table, raw, as_of)  # the key's text, checked against its type there
        if row is None:
            raise ApiError(404, "row_not_found", f"no row with key {show(raw)} in {table!r}"
                           + (f" as of {as_of}" if as_of is not None else ""))
        schema = d.schema
        if as_of is not None or set(row) != {c.name for c in schema.columns}:
            schema = (await db.describe(table, as_of)).schema
        return web.json_response(row_to_json(row, schema))

    async def query(self, request):
        table = request.match_info["table"]
        body = await request.read()
        doc = await json_body(request) if body and not body.isspace() else {}  # no body: every row
        if not isinstance(doc, dict):
            raise ApiError(400, "invalid_query", "the query is a JSON object")
        extra = set(doc) - {"where", "bbox", "as_of", "columns", "limit"}
        if extra:
            raise ApiError(400, "invalid_query", f"unknown field(s): {', '.join(sorted(extra))}")
        as_of = as_of_value(doc.get("as_of"))
        limit = doc.get("limit", 10_000)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ApiError(400, "invalid_query", f'"limit" must be a non-negative integer, not {limit!r}')
        self.db  # noqa: B018 - 503 before ready
        forwarded, res = await self.router.query(request, table, where_terms(doc, request), doc.get("bbox"),
                                                 doc.get("columns"), limit if limit <= MAX_LIMIT else None, as_of)
        if forwarded is not None:
            return forwarded
        t, T = res
        if t.num_rows > limit:
            t = t.slice(0, limit)
        if ARROW_STREAM in request.headers.get("Accept", ""):
            payload = await off_loop_if_big(t.nbytes, write_arrow_stream, t)
            return web.Response(body=payload, content_type=ARROW_STREAM, headers={"X-Terrascale-As-Of": str(T)})
        text = await off_loop_if_big(t.num_rows * (THREAD_BYTES // THREAD_ROWS),
                          lambda: json.dumps({"rows": table_to_rows(t), "as_of": T}, allow_nan=False))
        return web.Response(text=text, content_type="application/json", headers={"X-Terrascale-As-Of": str(T)})

    # -- admin ------------------------------------------------------------------------------------

    async def status(self, request):
        self.db  # noqa: B018 - 503 before ready
        return web.json_response(await self.node.status())

    async def segments(self, request):
        table = request.query.get("table")
        db = self.db
        recs = await db.segment_records(table)
        return web.json_response({"segments": [_segment_json(name, r) for name, r in recs]})

    def _job(self, name: str):
        async def run(request):
            self.db  # noqa: B018 - 503 before ready
            return web.json_response({"job": name, **await self.node.jobs.run(name)})
        return run

    async def gc(self, request):
        """One garbage-collection pass now (RFC 0009); ``{"table": T, "dry_run": bool}`` optional."""
        self.db  # noqa: B018 - 503 before ready
        doc = await json_object(request, {"table", "dry_run"}) if await request.read() else {}
        table, dry = doc.get("table"), doc.get("dry_run", False)
        if table is not None and not isinstance(table, str):
            raise ApiError(400, "bad_request", '"table" must be a table name')
        if not isinstance(dry, bool):
            raise ApiError(400, "bad_request", '"dry_run" must be true or false')
        return web.json_response(await self.node.jobs.run("gc", table=table, dry_run=dry))

# -- helpers --------------------------------------------------------------------------------------


async def _exists(db, name: str) -> bool:
    try:
        await db.describe(name)
        return True
    except TableNotFoundError:
        return False


def _table_json(d) -> dict:
    return {"name": d.name, "table_id": d.table_id, "columns": schema_to_json(d.schema),
            "primary_key": d.schema.key.name, "indexes": d.index_names(), "partitions": d.partitions,
            "cluster_by": d.cluster_column.name if d.cluster_column is not None else d.schema.key.name,
            "schema_version": d.schema.version, "ts": d.ts}


def _segment_json(table: str, r) -> dict:
    """A segment row as the node sees it now (``Database.segment_records``: an active segment
    of this node reports its durable rows and bytes so far)."""
    return {"segid": r.segid, "table": table, "partition": r.partition, "state": r.state.value,
            "rows": r.rows, "live_rows": r.live_rows, "bytes": r.bytes, "live_bytes": r.live_bytes,
            "location": r.location, "owner": r.owner, "min_ts": r.min_ts, "max_ts": r.max_ts,
            "garbage_ratio": round(1 - r.live_rows / r.rows, 4) if r.rows and r.state.value != "active" else 0.0,
            "cluster": r.cluster}
