"""Commit timestamps never go backwards across a leader change, whatever the clocks (RFC 0010
§5, "Clocks"): three real node processes, the leader's wall clock 8 s ahead of the others'.
Its read of the present hands out a T from its clock; after kill -9 the new leader — whose
clock trails — must commit above that T (the election carries the old leader's clock to
it), so a read as of T answers the same rows before and after."""
import time

import pytest

from bench.node_proc import raft_cluster
from tests.node.proc import FAST_CLUSTER, eventually
from tests.node.cluster.test_replication import rows

SKEW = {"TERRASCALE_FAILPOINT_CLOCK_SKEW_MS": "8000"}


@pytest.mark.slow
def test_a_new_leader_whose_clock_trails_commits_above_every_T_the_old_one_handed_out(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        nodes[0].start(wait=False, env=SKEW)
        for n in nodes[1:]:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready(90)
        c0 = nodes[0].client(timeout=60)
        c0.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=1, replicas=3)
        assert c0.describe("t")["placement"][0]["leader"] == nodes[0].node_id  # the creating node leads
        eventually(lambda: c0.upsert("t", rows(1)))
        time.sleep(3)  # the leader's clock moves on; no other node observes it meanwhile
        T = c0._call("POST", "/v1/tables/t/query", {"limit": 100})["as_of"]
        before = c0.query("t", as_of=T).sort_by("id")
        nodes[0].kill()
        c1 = nodes[1].client(timeout=60)
        ts = eventually(lambda: c1.upsert("t", rows(2)), 60)["commit_ts"]
        assert ts > T, f"a commit at {ts} below the read T {T} the old leader handed out"
        assert eventually(lambda: c1.query("t", as_of=T).sort_by("id")).equals(before)
    finally:
        for n in nodes:
            n.ensure_stopped()


@pytest.mark.slow
def test_a_read_across_nodes_with_one_clock_ahead_is_answered_through_every_node(tmp_path):
    """A read of the present across nodes takes the largest closed timestamp — the fast
    clock's; the other nodes must read (and look the schema up) at that T, never answer
    409 future_timestamp because their own wall clock has not got there yet."""
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        nodes[0].start(wait=False, env={"TERRASCALE_FAILPOINT_CLOCK_SKEW_MS": "3000"})
        for n in nodes[1:]:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready(90)
        c0 = nodes[0].client(timeout=60)
        c0.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3)  # spread over the nodes
        assert len({p["leader"] for p in c0.describe("t")["placement"]}) == 3
        eventually(lambda: c0.upsert("t", rows(1)))
        for n in nodes:
            with n.client(timeout=60) as c:
                assert c.query("t", columns=["b"], limit=1000).num_rows == 40
                assert c._call("GET", "/v1/tables/t/snapshot")["table"] == "t"
    finally:
        for n in nodes:
            n.ensure_stopped()
