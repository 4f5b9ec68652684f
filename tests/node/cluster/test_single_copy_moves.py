"""One-copy partitions (R = 1) moved between real node processes (RFC 0010 §7, node/cluster/handoff.py):
a joining member is given its share, a leaving one hands its partitions over before it leaves,
and writes go on throughout — every acknowledged batch reads back whole from every node."""
import threading
import time

import pytest

from bench.node_proc import joiner, raft_cluster, start_all
from node.errors import ApiError
from tests.node.proc import eventually
from tests.node.cluster.test_replication import FAST, batches, rows


def leaders(c) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in c.describe("t")["placement"]:
        assert len(p["replicas"]) == 1, p
        out[p["leader"]] = out.get(p["leader"], 0) + 1
    return out


@pytest.mark.slow
def test_one_copy_partitions_move_on_join_and_leave_under_load(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST)
    n4 = None
    acked, failed, stop = {}, [], threading.Event()
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=120)
        c1.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=8)

        def write():
            bid = 1
            with nodes[1].client(timeout=60) as c:
                while not stop.is_set():
                    try:
                        c.upsert("t", rows(bid))
                        acked[bid] = 1
                    except (ApiError, ConnectionError) as e:
                        if getattr(e, "status", 503) not in (421, 503):
                            failed.append(str(e))
                        time.sleep(0.05)
                    bid += 1

        w = threading.Thread(target=write)
        w.start()
        eventually(lambda: len(acked) >= 5, 30)
        n4 = joiner(tmp_path, nodes, FAST).start(wait=False)
        c1._call("POST", "/v1/admin/cluster/members", {"raft_address": n4.raft_address})
        n4.wait_ready(90)

        def spread():
            got = leaders(c1)
            assert got == {n: 2 for n in ("n1", "n2", "n3", "n4")}, got
        eventually(spread, 120, 0.5)
        before = len(acked)
        eventually(lambda: len(acked) > before + 5, 30)  # writes go on, n4's partitions included
        for n in [*nodes, n4]:
            snap = set(acked)  # acknowledged before the read began (the writer goes on)
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: batches(c))
                assert snap <= set(got) and all(v == 40 for v in got.values()), sorted(snap - set(got))[:5]
        # n4 leaves: its partitions go to the others first, then the membership changes
        c1._call("DELETE", f"/v1/admin/cluster/members/{n4.raft_address}")
        def gone():
            with nodes[2].client(timeout=60) as c3:  # any node, once its cached placement is refreshed
                got = leaders(c3)
                assert "n4" not in got and sum(got.values()) == 8, got
        eventually(gone, 10)
        before = len(acked)
        eventually(lambda: len(acked) > before + 5, 30)
        stop.set()
        w.join(60)
        n4.stop()  # its disk holds nothing any partition needs any more
        for n in nodes:
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: batches(c))
                # every acknowledged batch whole; one whose write failed (a 503 after the
                # decision) may be there too — whole, never in part
                assert set(acked) <= set(got) and all(v == 40 for v in got.values()), \
                    (sorted(set(acked) - set(got))[:5], {b: v for b, v in got.items() if v != 40})
        assert not failed, failed[:5]
        moves = c1.status()["replication"]["moves"]
        print("moves", moves, "batches acknowledged", len(acked))
    finally:
        stop.set()
        for n in [*nodes, *([n4] if n4 else [])]:
            n.ensure_stopped()


@pytest.mark.slow
def test_removing_a_dead_node_holding_only_copies_is_refused_unless_forced(tmp_path):
    """The node holding the only copy of some partitions is down: they cannot be moved, so
    `admin cluster remove` answers 409 and the node stays a member (nothing changed); with
    force it is removed, and its partitions are unreadable until it is added back."""
    nodes = raft_cluster(tmp_path, 3, extra=FAST)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=120)
        c1.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3)
        c1.upsert("t", rows(1))
        leader = c1.cluster()["leader"]
        victim = next(n for n in reversed(nodes) if n.node_id != leader)
        live = next(n for n in nodes if n is not victim)
        victim.kill()
        with live.client(timeout=120) as c:
            with pytest.raises(ApiError) as ei:
                c._call("DELETE", f"/v1/admin/cluster/members/{victim.raft_address}")
            assert ei.value.status == 409 and ei.value.code == "membership_refused", ei.value
            assert f"node {victim.node_id} holds the only copy" in str(ei.value)
            members = {m["raft_address"] for m in c.cluster()["members"]}
            assert victim.raft_address in members
            assert victim.node_id in leaders(c)  # its partition was not moved
            with pytest.raises(ApiError) as ei:
                c._call("DELETE", f"/v1/admin/cluster/members/{victim.raft_address}?force=maybe")
            assert ei.value.status == 400
            c._call("DELETE", f"/v1/admin/cluster/members/{victim.raft_address}?force=true")
            assert victim.raft_address not in {m["raft_address"] for m in c.cluster()["members"]}
    finally:
        for n in nodes:
            n.ensure_stopped()
