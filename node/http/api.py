"""The HTTP API (docs/REFERENCE.md §3; OpenAPI: docs/openapi.yaml): what every handler
shares — the node, its router and write coalescer — and the edge every request passes:
the bearer token, whole-table requests sent to the node serving them, metrics, and errors
translated once (``node/http/edge.py``) into ``{"error": {"code", "message"}}``. The
handlers live in ``node/http/routes/``, one module per route set, each ``async (api,
request)``."""
from __future__ import annotations

import hmac
import logging
import time

from aiohttp import web

from node.cluster.router import Router
from node.cluster.stream import STREAM
from node.errors import ApiError
from node.http.coalesce import Coalescer
from node.http.edge import answer, error
from node.http.params import CONFIG, parse_json
from node.http.routes.admin import add_admin_routes
from node.http.routes.console import public
from node.http.routes.rows import add_row_routes
from node.http.routes.tables import add_table_routes

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
        self.streams: set = set()  # open replication streams from leader nodes (closed at shutdown)

    @property
    def writes(self) -> Coalescer:
        """Small writes coalesce here (node/http/coalesce.py); one per opened engine."""
        db = self.db
        if self._writes is None or self._writes.db is not db:
            self._writes = Coalescer(db, self.node.metrics)
        return self._writes

    def parsed(self, body: bytes):
        """A small JSON body parsed on the loop (its time counted as the write's parse stage)."""
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
        """The data API's routes (``node/http/routes/``: tables, rows, admin); the other route
        sets join them in ``node/http/app.py``. Every handler is ``async (api, request)``."""
        app = web.Application(middlewares=[self._edge], client_max_size=self.node.cfg.max_body)
        app[CONFIG] = self.node.cfg
        add_admin_routes(self, app.router)
        add_table_routes(self, app.router)
        add_row_routes(self, app.router)
        return app

    # -- the edge: auth, routing to the owner, errors, metrics ------------------------------------

    @web.middleware
    async def _edge(self, request: web.Request, handler):
        self.node.guard.headed(request.transport)  # a request head arrived: no longer pending
        m = self.node.metrics
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        if route == STREAM:  # a connection's lifetime, not a request: neither in flight nor timed
            return await self._guarded(request, handler)
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
            if request.path != "/healthz" and not public(request) and not self._authorized(request):
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
