"""Aggregates and histograms on 3 real node processes (RFC 0012), R=1 and R=3: whichever node
receives the request merges every node's partials at one T, and the answer equals a model of
the rows /query returns at that T through another node."""
import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.fixtures.aggregate_model import grouped, same
from tests.fixtures.ts_model import check
from tests.node.proc import FAST_CLUSTER, eventually

COLUMNS = [("id", "int64"), ("g", "string"), ("k", "int64"), ("v", "float64"), ("p", "point")]


def rows(ids, seed: int) -> pa.Table:
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": ids, "g": pa.array([f"g{i}" for i in rng.integers(0, 6, len(ids))]),
        "k": pa.array(rng.integers(0, 4, len(ids)), mask=rng.random(len(ids)) < 0.1),
        "v": pa.array(rng.integers(-40, 40, len(ids)) / 2.0),
        "p": pa.StructArray.from_arrays([pa.array(rng.integers(0, 50, len(ids)).astype(float)),
                                         pa.array(rng.integers(0, 50, len(ids)).astype(float))], names=["x", "y"]),
    })


REQUESTS = [
    ([], [{"fn": "count"}, {"fn": "sum", "column": "v"}], None, None),
    (["g"], [{"fn": "count"}, {"fn": "mean", "column": "v"}, {"fn": "count_distinct", "column": "k"}],
     [["v", ">", -5]], None),
    (["k"], [{"fn": "min", "column": "v"}, {"fn": "max", "column": "g"}, {"fn": "count", "column": "k"}], None,
     {"column": "p", "xmin": 5, "ymin": 5, "xmax": 30, "ymax": 40}),
]


@pytest.mark.parametrize("replicas", [1, 3])
def test_aggregates_across_nodes_equal_a_model(tmp_path, replicas):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        start_all(nodes)
        clients = [n.client(timeout=60) for n in nodes]
        clients[0].create_table("t", COLUMNS, "id", indexes=["g", "v", "p"], partitions=6, replicas=replicas)
        eventually(lambda: clients[1].describe("t"))
        clients[1].upsert("t", rows(range(3000), seed=1))
        for n in clients:
            n.admin("checkpoint")  # runs on every node; later writes stay in memtables
        clients[2].upsert("t", rows(range(2000, 3500), seed=2))
        clients[0].delete("t", list(range(0, 3500, 11)))
        for i, (group_by, aggs, where, bbox) in enumerate(REQUESTS):
            asked, other = clients[i % 3], clients[(i + 1) % 3]
            got = asked.aggregate("t", aggs, group_by=group_by or None, where=where, bbox=bbox)
            t = other.query("t", where=where, bbox=bbox, as_of=got["as_of"], limit=10**9)
            want = grouped(t.to_pylist(), group_by, aggs)
            assert same(got["rows"], want), (got["rows"], want)
            assert got["stats"]["partitions"] == 6 and got["stats"]["path"] == ("decode" if "k" in str(
                (group_by, aggs, where)) else "index")
        # buckets, sketches and picks: every node's partials (sketches serialized) merged by the asked one
        group_by = ["g", {"bucket": "v", "width": 5}]
        aggs = [{"fn": "count"}, {"fn": "quantile", "column": "v", "q": 0.9}, {"fn": "last", "column": "g", "by": "k"},
                {"fn": "approx_count_distinct", "column": "k", "as": "dk"}, {"fn": "first", "column": "v", "by": "v"}]
        got = clients[1].aggregate("t", aggs, group_by=group_by)
        check(got["rows"], clients[2].query("t", as_of=got["as_of"], limit=10**9).to_pylist(), group_by, aggs,
              {"v": "float64"})
        # per-partition answers (the Spark reader's partials), whichever node leads them, add up
        aggs = [{"fn": "count"}, {"fn": "max", "column": "v"}]
        whole = clients[0].aggregate("t", aggs, group_by=["g"])
        each = [clients[p % 3]._call("POST", "/v1/tables/t/aggregate", {
            "aggregates": aggs, "group_by": ["g"], "partitions": [p], "nan": "largest", "as_of": whole["as_of"]})
            for p in range(6)]
        assert all(a["stats"]["partitions"] == 1 for a in each)
        added: dict = {}
        for r in (r for a in each for r in a["rows"]):
            n, m = added.get(r["g"], (0, None))
            added[r["g"]] = (n + r["count"], r["max_v"] if m is None else max(m, r["max_v"]))
        assert added == {r["g"]: (r["count"], r["max_v"]) for r in whole["rows"]}
        # histograms: every node answers the same counts at one T, equal to the queried points
        bbox = {"xmin": 0, "ymin": 0, "xmax": 49, "ymax": 49}
        h = clients[0].histogram("t", "p", bbox, [5, 4])
        for c in clients[1:]:
            assert c.histogram("t", "p", bbox, [5, 4], as_of=h["as_of"])["counts"] == h["counts"]
        pts = clients[1].query("t", as_of=h["as_of"], limit=10**9).column("p").to_pylist()
        want = np.zeros((4, 5), int)
        for p in pts:
            want[min(int(p["y"] // (49 / 4)), 3), min(int(p["x"] // (49 / 5)), 4)] += 1
        assert h["counts"] == want.tolist()
        with pytest.raises(ApiError) as e:
            clients[2].aggregate("t", [{"fn": "sum", "column": "g"}])
        assert e.value.status == 400
        for c in clients:
            c.close()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.stop()


def test_a_dead_nodes_partitions_are_aggregated_from_their_objects(tmp_path):
    """As of a T their objects hold, the partitions of a node killed -9 are aggregated from
    their objects (decoded: stats.path "decode"); the present is refused, never short."""
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", COLUMNS, "id", indexes=["g", "v", "p"], partitions=3)
        eventually(lambda: c1.upsert("t", rows(range(900), seed=4)))
        T = c1.delete("t", list(range(0, 900, 10)))["commit_ts"]
        before = c1.query("t", as_of=T, limit=10**6)
        for n in nodes:
            with n.client(timeout=60) as c:
                c.admin("seal")
                c.admin("offload")
        victim = next(n for n in nodes if n.node_id == c1.describe("t")["placement"][0]["leader"])
        victim.kill()
        c = next(n for n in nodes if n is not victim).client(timeout=60)
        aggs = [{"fn": "count"}, {"fn": "sum", "column": "v"}, {"fn": "count_distinct", "column": "k"}]
        got = eventually(lambda: c.aggregate("t", aggs, group_by=["g"], as_of=T))
        assert same(got["rows"], grouped(before.to_pylist(), ["g"], aggs))
        assert got["stats"]["path"] == "decode" and got["stats"]["partitions"] == 3
        h = eventually(lambda: c.histogram("t", "p", {"xmin": 0, "ymin": 0, "xmax": 49, "ymax": 49}, [5, 4],
                                           as_of=T))
        assert sum(map(sum, h["counts"])) == before.num_rows
        with pytest.raises(ApiError) as e:
            c.aggregate("t", aggs)  # the present: the dead node's latest rows are only on its disk
        assert e.value.status == 503
        c.close()
        c1.close()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.stop()
