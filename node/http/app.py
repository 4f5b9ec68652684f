"""The node's HTTP application: the data API's endpoints (``node/http/routes/``: tables, rows,
admin, added by ``Api.app``), the Spark bridge's (``routes/bridge.py``) and the ones nodes call
on each other (``routes/internal.py``, ``routes/replication.py``, ...) — one handler style,
``async (api, request)``, and one error edge (``node/http/api.py``)."""
from __future__ import annotations

from aiohttp import web

from node.http.api import Api
from node.http.routes.aggregates import add_aggregate_routes
from node.http.routes.bridge import add_bridge_routes
from node.http.routes.console import add_console_routes
from node.http.routes.internal import add_internal_routes
from node.http.routes.membership import add_membership_routes
from node.http.routes.handoff import add_handoff_routes
from node.http.routes.replication import add_replication_routes, close_streams
from node.http.routes.scans import add_scan_routes
from node.http.routes.subscribe import add_subscribe_routes, end_subscriptions


def make_app(api: Api) -> web.Application:
    app = api.app()
    add_scan_routes(api, app.router)  # ordered scans by key with cursors, many rows by key (RFC 0013)
    add_aggregate_routes(api, app.router)  # aggregates and histograms, merged across nodes (RFC 0012)
    add_subscribe_routes(api, app.router)  # live subscriptions to a table's changes (RFC 0015)
    add_membership_routes(api, app.router)  # the cluster view and membership changes
    add_bridge_routes(api, app.router)  # read plans, tails, change feed, leases
    add_internal_routes(api, app.router)  # node to node: cross-node batches and reads
    add_replication_routes(api, app.router)  # leader to follower, driver to replicas (RFC 0010 §5)
    add_handoff_routes(api, app.router)  # one-copy partitions moved between nodes (RFC 0010 §7)
    add_console_routes(api, app.router)  # the admin console's files (docs/console.md)
    app.on_shutdown.append(lambda _app: close_streams(api))  # a stream would hold the shutdown
    app.on_shutdown.append(lambda _app: end_subscriptions(api))  # so would a subscription
    return app
