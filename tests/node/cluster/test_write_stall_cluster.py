"""The memtables' write stall (docs/REFERENCE.md, ``tables.memtable_bytes``) on 3 real node
processes, R = 3, with every background job running (seal, offload, checkpoint, merge, GC every
second) and the leader of a partition killed -9 and restarted: with a budget of 8 KiB, writes
arriving faster than the scheduled checkpoints wait for one (single-node and cross-node batches
alike), and every acknowledged batch is read back through every member."""
from bench.node_proc import raft_cluster, start_all
from tests.node.cluster.test_aggregates_cluster import COLUMNS, rows
from tests.node.cluster.test_gc_cluster import JOBS
from tests.node.proc import FAST_CLUSTER, eventually, on_every, stop_all, metric

TINY = '[tables]\nmemtable_bytes = "8KiB"\n'


def test_writes_stall_for_checkpoints_and_lose_nothing_on_three_nodes(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS + TINY)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", COLUMNS, "id", indexes=["g", "v"], partitions=3, replicas=3)
        model: dict[int, dict] = {}

        def write(c, b: int) -> None:
            t = rows(range(b * 2000, b * 2000 + 3000), seed=b)  # overlapping ids: overwrites
            eventually(lambda: c.upsert("t", t), 60)
            model.update({r["id"]: r for r in t.to_pylist()})
        for b in range(8):  # back to back: faster than the checkpoint job's second
            write(c1, b)
        assert sum(metric(n, "terrascale_write_stalls_total") for n in nodes) > 0
        victim = next(n for n in nodes if n.node_id == c1.describe("t")["placement"][0]["leader"])
        victim.kill()
        with next(n for n in nodes if n is not victim).client(timeout=60) as c:
            for b in range(8, 12):
                write(c, b)

        def check(c) -> None:
            got = c.query("t", columns=["id", "g", "v"], limit=10**6)
            assert {r["id"]: (r["g"], r["v"]) for r in got.to_pylist()} == \
                {i: (r["g"], r["v"]) for i, r in model.items()}
            got = c.query("t", where=[["g", "=", "g2"]], columns=["id"], limit=10**6)
            assert sorted(got.column("id").to_pylist()) == sorted(i for i, r in model.items() if r["g"] == "g2")
        victim.start(wait=True)
        on_every(nodes, check)
        c1.close()
    finally:
        stop_all(nodes)
