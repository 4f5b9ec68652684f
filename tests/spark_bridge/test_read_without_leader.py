"""Spark, with a real local SparkSession, reads a table of a three-node cluster as of a past
time while the node leading one of its partitions is dead (kill -9): that partition's rows
come from its objects alone (RFC 0010 §6), in both readers, equal to what the table held."""
from __future__ import annotations

import pytest

from bench.node_proc import raft_cluster, start_all
from tests.node.proc import FAST_CLUSTER, eventually
from tests.node.cluster.test_replication import rows
from tests.spark_bridge.test_jvm_reader import read


@pytest.mark.slow
def test_spark_reads_a_dead_nodes_partitions_from_their_objects(spark, tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3)
        for bid in range(1, 7):
            T = eventually(lambda bid=bid: c1.upsert("t", rows(bid, 50)))["commit_ts"]
        for n in nodes:
            with n.client(timeout=60) as c:
                c.admin("seal")
                c.admin("offload")
        c1.upsert("t", rows(7, 50))  # after T, on the nodes' disks only
        victim = next(n for n in nodes if n.node_id == c1.describe("t")["placement"][1]["leader"])
        victim.kill()
        other = next(n for n in nodes if n is not victim)
        for reader in ("python", "jvm"):
            df = read(spark, other, "t", reader, as_of=T)
            got = sorted(df.toArrow().to_pylist(), key=lambda r: r["id"])
            assert got == [{"id": bid * 1000 + i, "b": bid} for bid in range(1, 7) for i in range(50)], reader
    finally:
        for n in nodes:
            n.ensure_stopped()
