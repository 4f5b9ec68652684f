"""Aggregates and histograms on 3 real node processes (RFC 0012), R=1 and R=3: whichever node
receives the request merges every node's partials at one T, and the answer equals a model of
the rows /query returns at that T through another node."""
import time

import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.fixtures.aggregate_model import grouped, same
from tests.fixtures.ts_model import check
from tests.node.proc import FAST_CLUSTER, eventually, on_every, stop_all, unavailable_retried

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


def _last_per_sensor(rows: pa.Table) -> dict[str, tuple[int, float]]:
    """The model: per sensor, its newest ts and that row's v."""
    out: dict[str, tuple[int, float]] = {}
    for s, ts, v in zip(rows.column("sensor").to_pylist(), rows.column("ts").cast(pa.int64()).to_pylist(),
                        rows.column("v").to_pylist()):
        if s not in out or ts > out[s][0]:
            out[s] = (ts, v)
    return out


def _readings(rng: np.random.Generator, n: int, sensors: int, t0_us: int) -> pa.Table:
    s = rng.integers(0, sensors, n)
    ts = t0_us + rng.integers(0, 600, n) * 1_000_000
    key = {(int(a), int(b)): float(rng.integers(-100, 100)) for a, b in zip(s, ts)}
    return pa.table({"sensor": [f"s{a:02d}" for a, _ in key], "ts": pa.array([b for _, b in key],
                                                                          pa.timestamp("us", tz="UTC")),
                     "v": list(key.values())})


def test_last_per_sensor_from_the_key_index_on_three_nodes_with_jobs_and_a_kill(tmp_path):
    """``last`` by the key's time column per sensor (a (sensor, ts) key, R = 3) is read from
    each partition's key index — one row per sensor (stats.rows), not every row's ts — while
    seal, offload, checkpoint, merges and GC run every second, overwrites and deletes of a
    sensor's newest reading land after a checkpoint, and a partition's leader is killed -9:
    every answer equals the newest readings of a query at its T on another node."""
    from tests.node.cluster.test_gc_cluster import JOBS

    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    rng = np.random.default_rng(5)
    t0 = 1_767_225_600_000_000
    aggs = [{"fn": "last", "column": "v", "by": "ts"}, {"fn": "last", "column": "ts", "by": "ts", "as": "at"}]

    def agree(asked, other) -> None:
        got = asked.aggregate("m", aggs, group_by=["sensor"])
        want = _last_per_sensor(other.query("m", as_of=got["as_of"], limit=10**9))
        assert {r["sensor"]: r["last_v"] for r in got["rows"]} == {s: v for s, (_, v) in want.items()}
        assert got["stats"]["rows"] == len(want)  # one row read per sensor: the key index chose them
    try:
        start_all(nodes)
        clients = [n.client(timeout=60) for n in nodes]
        clients[0].create_table("m", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")],
                                ["sensor", "ts"], partitions=4, replicas=3)
        eventually(lambda: clients[1].describe("m"))
        for i in range(6):  # the first may find a partition still opening (503): retried
            batch = _readings(rng, 800, 40, t0 + i * 100_000_000)
            eventually(lambda c=clients[i % 3], b=batch: c.upsert("m", b))
        for c in clients:
            c.admin("checkpoint")
            c.admin("seal")
        unavailable_retried(lambda: agree(clients[0], clients[1]))
        newest = _last_per_sensor(clients[2].query("m", limit=10**9))
        gone = sorted(newest)[:5]  # their newest readings deleted: the one before answers
        clients[1].delete("m", [[s, newest[s][0]] for s in gone])
        clients[2].upsert("m", pa.table({"sensor": sorted(newest)[5:10], "ts": pa.array(
            [newest[s][0] for s in sorted(newest)[5:10]], pa.timestamp("us", tz="UTC")), "v": [1000.0] * 5}))
        unavailable_retried(lambda: agree(clients[1], clients[2]))
        leader = clients[0].describe("m")["placement"][0]["leader"]
        victim = next(n for n in nodes if n.node_id == leader)
        victim.kill()
        alive = [n.client(timeout=60) for n in nodes if n is not victim]
        eventually(lambda: alive[0].upsert("m", _readings(rng, 400, 40, t0 + 900_000_000)), timeout=60)
        eventually(lambda: agree(alive[1], alive[0]), timeout=60)
        victim.start()
        eventually(lambda: agree(victim.client(timeout=60), alive[1]), timeout=90)
        for c in clients + alive:
            c.close()
    finally:
        for n in nodes:
            if n.proc is not None:
                n.stop()


def test_indexed_reads_on_three_nodes_with_every_job_and_a_kill(tmp_path):
    """Paged column-index runs (docs/format/column-run.md, version 2) written by checkpoints,
    merges and GC on every node every second, R = 3; the leader of partition 0 killed -9 and
    restarted: queries through the column index (a string, a number, a box) and an aggregate
    answer exactly what the rows written say, through every member."""
    from tests.node.cluster.test_gc_cluster import JOBS
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", COLUMNS, "id", indexes=["g", "v", "p"], partitions=3, replicas=3)
        model: dict[int, dict] = {}
        for b in range(6):  # batches between checkpoints and merges of the jobs
            t = rows(range(b * 300, b * 300 + 400), seed=b)  # overlapping ids: overwrites
            eventually(lambda t=t: c1.upsert("t", t))
            model.update({r["id"]: r for r in t.to_pylist()})
            time.sleep(0.6)
        victim = next(n for n in nodes if n.node_id == c1.describe("t")["placement"][0]["leader"])
        victim.kill()
        rest = [n for n in nodes if n is not victim]

        def check(c) -> None:
            got = c.query("t", where=[["g", "=", "g3"]], columns=["id"], limit=10**6)
            assert sorted(got.column("id").to_pylist()) == sorted(i for i, r in model.items() if r["g"] == "g3")
            got = c.query("t", where=[["v", ">", 15.0]], columns=["id"], limit=10**6)
            assert sorted(got.column("id").to_pylist()) == sorted(i for i, r in model.items() if r["v"] > 15.0)
            got = c.query("t", bbox={"column": "p", "xmin": 5, "ymin": 5, "xmax": 20, "ymax": 30}, columns=["id"],
                          limit=10**6)
            assert sorted(got.column("id").to_pylist()) == sorted(
                i for i, r in model.items() if 5 <= r["p"]["x"] <= 20 and 5 <= r["p"]["y"] <= 30)
            agg = c.aggregate("t", [{"fn": "count"}], where=[["g", "=", "g1"]])
            assert list(agg["rows"][0].values()) == [sum(1 for r in model.values() if r["g"] == "g1")]
        on_every(rest, check)
        victim.start(wait=True)
        on_every(nodes, check)
        c1.close()
    finally:
        stop_all(nodes)
