"""The node's HTTP application: the contract's endpoints (``node/api.py``) and the Spark
bridge's (``node/bridge_api.py``), which share the same error edge."""
from __future__ import annotations

from aiohttp import web

from node.api import Api
from node.bridge_api import add_bridge_routes


def make_app(node) -> web.Application:
    api = Api(node)
    app = api.app()
    add_bridge_routes(api, app.router)  # read plans, tails, change feed, leases
    return app
