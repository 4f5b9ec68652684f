"""docs/openapi.yaml is a valid OpenAPI 3.1 document and documents exactly the routes the node serves."""
import os

import yaml
from openapi_spec_validator import validate

from node.daemon.lifecycle import Node
from node.http.app import make_app
from node.config import NodeConfig

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "openapi.yaml")


def load():
    with open(DOC) as f:
        return yaml.safe_load(f)


def test_openapi_document_is_valid():
    validate(load())


def test_documented_routes_are_the_served_routes():
    spec = {(m.upper(), p) for p, ops in load()["paths"].items() for m in ops if m != "parameters"}
    app = make_app(Node(NodeConfig()).api)
    served = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    assert spec == served
