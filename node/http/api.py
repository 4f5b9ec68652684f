"""The HTTP API (docs/REFERENCE.md §3; OpenAPI: docs/openapi.yaml): what every handler
shares — the engine once open, its router and write coalescer — and the edge every request passes:
the bearer token, whole-table requests sent to the node serving them, metrics, and errors
translated once (``node/http/edge.py``) into ``{"error": {"code", "message"}}``. The
handlers live in ``node/http/routes/``, one module per route set, each ``async (api,
request)``."""
from __future__ import annotations

import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from node.cluster.controller import NodeReplication
from node.cluster.members import Cluster
from node.cluster.router import Router
from node.cluster.spread import Spread
from node.cluster.serving import Serving
from node.config import NodeConfig
from node.metrics import Metrics
from node.phase import Readiness
from node.http.limits import ConnectionGuard
from node.http.ports import JobRunner, NodeViews
from rowstore.db.database import Database
from node.cluster.stream import STREAM
from node.errors import ApiError
from node.http.coalesce import Coalescer
from node.http.frames import FrameStream
from node.http.cursors import CursorKeys
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


# routes whose answer lasts as long as the connection: a replication stream, a subscription
_LIFETIMES = {STREAM, "/v1/tables/{table}/subscribe", "/v1/internal/subscribe"}


@dataclass(frozen=True)
class _Opened:
    """What requests reach once the node's stores are open (``Api.open``)."""

    sv: Serving
    router: Router
    spread: Spread
    cursor_keys: CursorKeys
    replication: NodeReplication
    jobs: JobRunner


class Api:
    """Made with the node, before its stores open (``/healthz`` answers and ``/readyz`` says
    503 while it recovers); ``open`` hands it the engine, once, when recovery is done."""

    def __init__(self, cfg: NodeConfig, readiness: Readiness, metrics: Metrics, guard: ConnectionGuard,
                 incarnation: str, views: NodeViews):
        self.cfg, self.readiness, self.metrics, self.guard = cfg, readiness, metrics, guard
        self.incarnation = incarnation  # this process, as other nodes tell it from a restart
        self.views = views
        self._opened: _Opened | None = None
        self._writes: Coalescer | None = None
        # open replication streams from leader nodes (closed at shutdown)
        self.streams: set[web.WebSocketResponse] = set()
        # subscriptions open through this node's HTTP surface (ended at shutdown; RFC 0015)
        self.subscriptions: set[FrameStream] = set()

    def open(self, sv: Serving, replication: NodeReplication, jobs: JobRunner) -> None:
        """The node's stores are open and recovered: requests may reach them (``Node.open``)."""
        router = Router(sv, self.readiness, self.metrics)
        self._opened = _Opened(sv, router, Spread(router), CursorKeys(sv.catalog), replication, jobs)

    @property
    def _parts(self) -> _Opened:
        if self._opened is None:
            raise ApiError(503, "not_ready", "the node is starting or stopping (see /readyz)")
        return self._opened

    @property
    def serving(self) -> Serving:
        return self._parts.sv

    @property
    def router(self) -> Router:
        return self._parts.router

    @property
    def cursor_keys(self) -> CursorKeys:
        """The cluster's key for scan cursors (node/http/cursors.py)."""
        return self._parts.cursor_keys

    @property
    def spread(self) -> Spread:
        """Reads of a whole table across the nodes (node/cluster/spread.py)."""
        return self._parts.spread

    @property
    def replication(self) -> NodeReplication:
        return self._parts.replication

    @property
    def jobs(self) -> JobRunner:
        return self._parts.jobs

    @property
    def cluster(self) -> Cluster:
        return self._parts.sv.cluster

    @property
    def multi(self) -> bool:
        """A cluster of nodes (catalog raft://), not one node alone."""
        return self._opened is not None and self._opened.sv.cluster.multi

    @property
    def writes(self) -> Coalescer:
        """Small writes coalesce here (node/http/coalesce.py); one per opened engine."""
        db = self.db
        if self._writes is None or self._writes.db is not db:
            self._writes = Coalescer(db, self.metrics)
        return self._writes

    def parsed(self, body: bytes) -> Any:
        """A small JSON body parsed on the loop (its time counted as the write's parse stage)."""
        t0 = time.perf_counter()
        doc = parse_json(body, self.cfg.max_json_depth)
        self.metrics.write_stage.labels("parse").inc(time.perf_counter() - t0)
        return doc

    @property
    def db(self) -> Database:
        if not self.readiness.ready:
            raise ApiError(503, "not_ready", "the node is starting or stopping (see /readyz)")
        return self._parts.sv.db

    def app(self) -> web.Application:
        """The data API's routes (``node/http/routes/``: tables, rows, admin); the other route
        sets join them in ``node/http/app.py``. Every handler is ``async (api, request)``."""
        app = web.Application(middlewares=[self._edge], client_max_size=self.cfg.max_body)
        app[CONFIG] = self.cfg
        add_admin_routes(self, app.router)
        add_table_routes(self, app.router)
        add_row_routes(self, app.router)
        return app

    # -- the edge: auth, routing to the owner, errors, metrics ------------------------------------

    @web.middleware
    async def _edge(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.guard.headed(request.transport)  # a request head arrived: no longer pending
        m = self.metrics
        resource = request.match_info.route.resource
        route = resource.canonical if resource else "unmatched"
        if route in _LIFETIMES:  # a connection's lifetime, not a request: neither in flight nor timed
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

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.path != "/healthz" and not public(request) and not self._authorized(request):
                return error(401, "unauthorized", "missing or wrong bearer token")
            table, resource = request.match_info.get("table"), request.match_info.route.resource
            if table is not None and resource is not None and resource.canonical in _WHOLE_TABLE:
                self.db  # noqa: B018 - 503 before ready (the placement needs the catalog)
                forwarded: web.StreamResponse | None = await self.router.whole_table(request, table)
                if forwarded is not None:
                    return forwarded
            return await handler(request)
        except Exception as e:  # noqa: BLE001 - every failure becomes one error answer (node/http/edge.py)
            return answer(request, e)

    def _authorized(self, request: web.Request) -> bool:
        tok = self.cfg.token
        if tok is None:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {tok}".encode())
