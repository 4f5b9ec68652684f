"""Keys outside their column's type against a real node, from every client: raw HTTP, the
Python client, the CLI and the Spark bridge's options. Each is 400 ``bad_request`` naming
the key, never another row, and changes nothing (docs/REFERENCE.md §4)."""
import json
import os
import subprocess
from urllib.parse import quote

import pytest

from bench.node_proc import TERRASCALE, NodeProc
from node.errors import ApiError
from spark_bridge.errors import BridgeError
from spark_bridge.options import Options
from spark_bridge.remote import Remote

U = "12345678-1234-5678-1234-567812345678"
MIN, MAX = -(2**63), 2**63 - 1
BAD = {
    "ki": [2**64 + 5, 2**64 - 5, MAX + 1, MIN - 1, "٥", "5.0", "1e3", " 5", "+-5", "0x5", "9" * 5000],
    "ks": ["x" * 1025, "é" * 513, "a\0b"],
    "ku": ["{" + U + "}", U.replace("-", ""), "urn:uuid:" + U, U[:-1], U + "0", "nope"],
}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("keys"))
    n.start()
    with n.client() as c:
        for t, kt in (("ki", "int64"), ("ks", "string"), ("ku", "uuid")):
            c.create_table(t, [{"name": "id", "type": kt}, {"name": "v", "type": "string"}], "id")
        c.upsert("ki", [{"id": 5, "v": "five"}, {"id": MIN, "v": "min"}, {"id": MAX, "v": "max"}])
        c.upsert("ks", [{"id": "x" * 1024, "v": "long"}, {"id": "a/b?c", "v": "slashy"},
                        {"id": "{a}", "v": "braces"}])
        c.upsert("ku", [{"id": U, "v": "u"}])
    yield n
    rc, log = n.stop()
    assert rc == 0 and "Traceback" not in log


def _state(c):
    return [c.query_json(t, limit=100)["rows"] for t in ("ki", "ks", "ku")]


def _bad_request(call):
    with pytest.raises(ApiError) as e:
        call()
    assert (e.value.status, e.value.code) == (400, "bad_request"), e.value
    assert "primary key 'id'" in e.value.message and len(e.value.message) < 400
    return e.value.message


def test_the_issue_reproduction_no_longer_answers_row_5(node):
    with node.client() as c:
        status, body, _ = c.request("GET", "/v1/tables/ki/rows/18446744073709551621")
        assert status == 400 and json.loads(body)["error"]["code"] == "bad_request"
        assert "18446744073709551621" in json.loads(body)["error"]["message"]
        assert c.get("ki", 5)["v"] == "five"


def test_boundary_keys_are_their_own_rows(node):
    with node.client() as c:
        assert c.get("ki", MIN)["v"] == "min" and c.get("ki", MAX)["v"] == "max"
        assert c.get("ki", "+5")["v"] == "five"
        assert c.get("ks", "x" * 1024)["v"] == "long" and c.get("ks", "a/b?c")["v"] == "slashy"
        assert c.get("ks", "{a}")["v"] == "braces"
        assert c.get("ku", U.upper())["v"] == "u"
        assert c.query_json("ki", where=[["id", ">=", str(MAX)]])["rows"] == [{"id": MAX, "v": "max"}]


@pytest.mark.parametrize("table", sorted(BAD))
def test_every_client_path_refuses_keys_outside_the_type(node, table):
    with node.client() as c:
        before = _state(c)
        for k in BAD[table]:
            _bad_request(lambda k=k: c.get(table, k))
            _bad_request(lambda k=k: c.delete(table, [k]))
            _bad_request(lambda k=k: c.query_json(table, where=[["id", "=", k]]))
            if isinstance(k, str):  # JSON rows take an int64 key as a number only
                _bad_request(lambda k=k: c.upsert(table, [{"id": k, "v": "overwritten"}]))
            status, body, _ = c.request("GET", f"/v1/tables/{table}/rows/{quote(str(k), safe='')}")
            assert status == 400 and json.loads(body)["error"]["code"] == "bad_request"
        for k in (True, 5.0, 5.5):  # JSON values of another type
            for call in (lambda k=k: c.delete(table, [k]), lambda k=k: c.query_json(table, where=[["id", "=", k]]),
                         lambda k=k: c.upsert(table, [{"id": k}])):
                _bad_request(call)
        assert _state(c) == before


def test_the_cli_answers_bad_request_in_one_line(node):
    env = {**os.environ, "TERRASCALE_ENDPOINT": node.base}
    for args in (["get", "ki", "18446744073709551621"], ["get", "ku", "{" + U + "}"],
                 ["query", "ki", "--where", "id = 18446744073709551621"]):
        r = subprocess.run([TERRASCALE, *args], capture_output=True, text=True, env=env, timeout=60)
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("terrascale: error:")]
        assert r.returncode == 1 and len(lines) == 1 and "bad_request" in lines[0], r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""


def test_the_spark_bridges_where_option_on_the_key_is_checked_by_the_node(node):
    opts = Options.parse({"endpoint": node.base, "table": "ki", "where": "id = 18446744073709551621"})
    with Remote(opts) as r:
        T = r.snapshot(None)["as_of"]
        with pytest.raises(BridgeError, match="bad_request"):
            r.plan(T, opts.where, None, False, 60)
        with pytest.raises(BridgeError, match="bad_request"):
            r.tail(0, T, opts.where, None, [])
    ok = Options.parse({"endpoint": node.base, "table": "ki", "where": f"id = {MAX}"})
    with Remote(ok) as r:
        r.plan(r.snapshot(None)["as_of"], ok.where, None, False, 60)
