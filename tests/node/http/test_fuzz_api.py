"""Property-based fuzzing of the HTTP API from docs/openapi.yaml (schemathesis) against a
real node process: no input gets a 5xx, every error is the documented JSON shape
``{"error": {"code", "message"}}``, and every answer conforms to the document (status
codes, content types, bodies). Bounded: a fixed seed (derandomized), at most
``EXAMPLES`` generated cases per operation, each sent twice — as generated, and aimed at
a real table of every type (generated table names almost never exist).

Every input this found answering a 5xx or the wrong thing is now a case in
tests/node/http/test_malformed.py (the corpus keeps them fixed even if generation changes)."""
from __future__ import annotations

import json
import os
import zlib

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import load_all_checks
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from bench.node_proc import NodeProc
from bench.ports import free_port
from tests.node.http.test_api import ALL_TYPES, ROW

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "openapi.yaml")
TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("TERRASCALE_FUZZ_EXAMPLES", "100"))  # ~75 s on a shared 2-core machine
TABLE = "fz"  # the real table cases are aimed at
# operations that would drop or reshape the real table: sent as generated only
DESTRUCTIVE = {("DELETE", "/v1/tables/{table}"), ("DELETE", "/v1/tables/{table}/columns/{column}"),
               ("PATCH", "/v1/tables/{table}/columns/{column}"), ("POST", "/v1/tables/{table}/columns")}

load_all_checks()
# Arrow IPC bodies are generated as bytes (the document says format: binary): garbage, truncated or
# empty streams reach the Arrow decoder; tests/node/http/test_hostile_bodies.py damages real streams.
schemathesis.serializer.alias("application/vnd.apache.arrow.stream", "application/octet-stream")


def documented_error_shape(ctx, response, case):
    """Every 4xx/5xx is JSON ``{"error": {"code": snake_case, "message": str}}`` and nothing else."""
    if response.status_code < 400:
        return None
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
    doc = json.loads(response.content)
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    err = doc["error"]
    assert isinstance(err, dict) and set(err) == {"code", "message"}, doc
    assert isinstance(err["code"], str) and err["code"].replace("_", "").isalpha() and err["code"].islower(), doc
    assert isinstance(err["message"], str) and err["message"] and "Traceback" not in err["message"], doc
    return True


def no_server_error(ctx, response, case):
    assert response.status_code < 500, (response.status_code, response.content[:500])
    return True


CHECKS = [no_server_error, documented_error_shape, status_code_conformance, content_type_conformance,
          response_schema_conformance]


PORT = free_port()  # known when the schema is built (schemathesis' lazy fixture loader fails on pytest 9)
schema = schemathesis.openapi.from_path(DOC)
schema.config.update(base_url=f"http://127.0.0.1:{PORT}")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("fuzz"), token=TOKEN, extra='max_body = "1MiB"', port=PORT)
    n.start()
    with n.client() as c:
        c.create_table(TABLE, [{"name": k, "type": t} for k, t in ALL_TYPES], "id", indexes=["p", "s", "i32"])
        c.upsert(TABLE, [ROW, {**ROW, "id": 8, "s": "other"}, {"id": 9}])
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log, log[-3000:]


COLUMNS = [name for name, _ in ALL_TYPES]


def _column(name) -> str:
    """A generated column name mapped onto one of the real table's columns (stable: crc32)."""
    return COLUMNS[zlib.crc32(repr(name).encode("utf-8", "surrogatepass")) % len(COLUMNS)]


def _aimed(body):
    """The body with its column names mapped onto the real table's, so generated values meet
    every column type (and rows carry a key: generated ids go through the key check)."""
    if not isinstance(body, dict):
        return body
    b = {k: v for k, v in body.items() if k != "as_of"}  # a generated as_of is almost always purged (410)
    if isinstance(b.get("where"), list):
        b["where"] = [[_column(t[0]), *t[1:]] if isinstance(t, list) and t else t for t in b["where"]]
    if isinstance(b.get("rows"), list):
        b["rows"] = [{"id": zlib.crc32(repr(r).encode("utf-8", "surrogatepass")) % 1000,
                      **{_column(k): v for k, v in r.items()}} if isinstance(r, dict) else r for r in b["rows"]]
    if isinstance(b.get("bbox"), dict):
        b["bbox"] = {**b["bbox"], "column": "p" if zlib.crc32(repr(b["bbox"]).encode()) % 2 else "bx"}
    if isinstance(b.get("columns"), list):
        b["columns"] = list(dict.fromkeys(_column(c) for c in b["columns"]))
    return b


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_input_gets_a_5xx_and_every_answer_is_documented(case, node):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    case.call_and_validate(headers=headers, checks=CHECKS, timeout=30)
    if "table" in (case.path_parameters or {}) and (case.method, case.path) not in DESTRUCTIVE:
        case.path_parameters = {**case.path_parameters, "table": TABLE}
        case.body = _aimed(case.body)
        if case.query and "as_of" in case.query:
            case.query = {k: v for k, v in case.query.items() if k != "as_of"}
        case.call_and_validate(headers=headers, checks=CHECKS, timeout=30)
