"""The node's HTTP application: the contract's endpoints (``node/api.py``), the Spark
bridge's (``node/bridge_api.py``) and the ones nodes call on each other
(``node/internal_api.py``, ``node/replication_api.py``), which share the same error edge."""
from __future__ import annotations

from aiohttp import web

from node.api import Api
from node.bridge_api import add_bridge_routes
from node.internal_api import add_internal_routes
from node.membership_api import add_membership_routes
from node.handoff import add_handoff_routes
from node.replication_api import add_replication_routes


def make_app(node) -> web.Application:
    api = Api(node)
    app = api.app()
    add_membership_routes(api, app.router)  # the cluster view and membership changes
    add_bridge_routes(api, app.router)  # read plans, tails, change feed, leases
    add_internal_routes(api, app.router)  # node to node: cross-node batches and reads
    add_replication_routes(api, app.router)  # leader to follower, driver to replicas (RFC 0010 §5)
    add_handoff_routes(api, app.router)  # one-copy partitions moved between nodes (RFC 0010 §7)
    return app
