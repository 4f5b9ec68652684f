"""The Spark bridge's endpoints over real HTTP: a read plan's offloaded segments read straight
from object storage plus the tails equal the query API at the same timestamp; the change
feed; leases; bad requests answer 4xx in the documented shape."""
import asyncio

import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.errors import ApiError
from rowstore.reads.external import SegmentSlice, read_segment, schemas_lookup
from rowstore.schema import SchemaVersion


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("bridge"))
    n.start()
    yield n
    n.stop()


def call(c, path, doc, arrow=False):
    return c._call("POST", path, doc, arrow=arrow)


def plan_rows(c, plan) -> pa.Table:
    target = SchemaVersion.from_json(plan["schema"])
    schemas = schemas_lookup([SchemaVersion.from_json(v) for v in plan["versions"]])

    async def sealed():
        out = []
        for s in plan["sealed"]:
            async for b in read_segment(plan["objects"], SegmentSlice.from_json(s), schemas, target):
                out.append(b)
        return out

    batches = asyncio.run(sealed())
    for p in plan["tail"]:
        batches += call(c, f"/v1/tables/{plan['table']}/tail", {"partition": p, "as_of": plan["as_of"]},
                        arrow=True).to_batches()
    t = pa.Table.from_batches(batches, schema=target.arrow())
    return t.sort_by([(k, "ascending") for k in target.pk.names])


def test_plan_tail_changes_and_leases(node):
    c = node.client()
    c.create_table("s", [{"name": "id", "type": "int64"}, {"name": "v", "type": "float64"}], "id")
    c.upsert("s", [{"id": i, "v": float(i)} for i in range(200)])
    c.admin("seal")
    c.admin("offload")
    r = c.upsert("s", [{"id": i, "v": -1.0} for i in range(50, 60)])
    c.delete("s", [3, 55])
    plan = call(c, "/v1/tables/s/plan", {})
    assert plan["sealed"] and plan["tail"]
    got = plan_rows(c, plan)
    want = c.query("s", as_of=plan["as_of"], limit=10_000)
    assert got.to_pylist() == want.to_pylist()
    old = call(c, "/v1/tables/s/plan", {"as_of": r["commit_ts"] - 1})
    assert plan_rows(c, old).column("v").to_pylist() == [float(i) for i in range(200)]
    ch = call(c, "/v1/tables/s/changes", {"after": r["commit_ts"] - 1}, arrow=True)
    assert ch.column("op").to_pylist() == ["upsert"] * 10 + ["delete"] * 2
    assert ch.column("commit_ts").to_pylist()[0] == r["commit_ts"]
    assert c._call("POST", f"/v1/leases/{plan['lease']}/renew", {"ttl_s": 30})["renewed"]
    assert c._call("DELETE", f"/v1/leases/{plan['lease']}")["released"]
    for path, doc in [("/v1/tables/s/plan", {"as_of": "x"}), ("/v1/tables/s/plan", {"nope": 1}),
                      ("/v1/tables/s/tail", {"as_of": 1}), ("/v1/tables/s/tail", {"partition": 99, "as_of": 0}),
                      ("/v1/tables/s/tail", {"partition": 0, "as_of": None}),
                      ("/v1/tables/s/changes", {"after": -1}), ("/v1/tables/zz/plan", {}),
                      ("/v1/tables/s/plan", {"where": [["v", "~", 1]]}),
                      ("/v1/tables/s/plan", {"request_id": ""}), ("/v1/tables/s/plan", {"request_id": 7}),
                      ("/v1/tables/s/plan", {"request_id": "a b"}), ("/v1/tables/s/plan", {"request_id": "x" * 65}),
                      (f"/v1/leases/{plan['lease']}/renew", {"ttl_s": 30})]:
        with pytest.raises(ApiError) as e:
            call(c, path, doc)
        assert 400 <= e.value.status < 500, (path, doc)
    c.close()


def test_plans_with_one_request_id_share_their_lease(node):
    """A client repeating a plan (its answer lost) with the same request_id gets the same lease."""
    c = node.client()
    c.create_table("rid", [{"name": "id", "type": "int64"}], "id")
    c.upsert("rid", [{"id": 1}])
    a = call(c, "/v1/tables/rid/plan", {"request_id": "0f3c-retry.1", "lease_s": 30})
    b = call(c, "/v1/tables/rid/plan", {"request_id": "0f3c-retry.1", "lease_s": 30, "as_of": a["as_of"]})
    assert b["lease"] == a["lease"] and b["as_of"] == a["as_of"]
    assert call(c, "/v1/tables/rid/plan", {"request_id": "another"})["lease"] != a["lease"]
    assert call(c, "/v1/tables/rid/plan", {})["lease"] != a["lease"]
    c.close()
