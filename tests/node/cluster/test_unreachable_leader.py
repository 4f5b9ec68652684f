"""A leader that heartbeats but reaches nobody over HTTP (its Raft port works) is replaced (S8 of
the cluster's failure list; docs/format/replication.md, ``node/suspect/``): three real nodes,
R = 3, the leader's node-to-node requests and everyone's requests to it cut by fault files
(``TERRASCALE_FAILPOINT_CUT_DIR``) while its heartbeats go on through the catalog. Its
followers say they do not hear it, the driver elects another — or, when the cut leader is the
driver itself, hands the driving to another member, which elects — writes go on through the
other two with every acknowledged batch kept; once the cut is lifted the old leader follows
again."""
import pytest

from bench.node_proc import raft_cluster
from tests.node.proc import FAST_CLUSTER, eventually
from tests.node.cluster.test_replication import batches, upsert_retrying


@pytest.mark.slow
@pytest.mark.parametrize("cut_driver", [False, True], ids=["a-follower-drives", "the-driver-itself"])
def test_a_leader_cut_off_over_http_but_heartbeating_is_replaced(tmp_path, cut_driver):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    cuts = {n.node_id: tmp_path / f"cut-{n.node_id}" for n in nodes}
    try:
        for n in nodes:
            cuts[n.node_id].mkdir()
            n.start(wait=False, env={"TERRASCALE_FAILPOINT_CUT_DIR": str(cuts[n.node_id])})
        for n in nodes:
            n.wait_ready(90)
        def raft_leader():
            got = nodes[0].client(timeout=60).cluster()["leader"]
            assert got is not None
            return got
        driver = eventually(raft_leader)  # the node leading the catalog's Raft group drives
        lead = next(n for n in nodes if (n.node_id == driver) == cut_driver)
        other = next(n for n in nodes if n is not lead)
        cl, co = lead.client(timeout=60), other.client(timeout=60)
        cl.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=1, replicas=3)
        assert cl.describe("t")["placement"][0]["leader"] == lead.node_id  # the creating node leads
        acked = {b: upsert_retrying(co, b)["commit_ts"] for b in range(1, 11)}
        (cuts[lead.node_id] / "all").touch()  # it reaches nobody ...
        for n in nodes:
            if n is not lead:
                (cuts[n.node_id] / lead.node_id).touch()  # ... and nobody reaches it

        def led_elsewhere():
            assert co.describe("t")["placement"][0]["leader"] != lead.node_id, "\n".join(
                f"{n.node_id}: " + "\n".join(x for x in n.log().splitlines()[-400:] if "event=" in x and
                                              ("elect" in x or "unreachable" in x or "step" in x))[-1500:]
                for n in nodes)
        eventually(led_elsewhere, 45)
        for b in range(11, 21):
            acked[b] = upsert_retrying(co, b)["commit_ts"]
        assert batches(co) == {b: 40 for b in acked}
        if cut_driver:  # it handed the driving on, and says why
            assert co.cluster()["leader"] != driver
            assert "event=driver_unreachable_steps_aside" in lead.log()
        else:
            assert co.cluster()["leader"] == driver  # (the driver did not change meanwhile)
        for f in cuts.values():  # the cut is lifted: the old leader follows the new one
            for x in f.iterdir():
                x.unlink()
        assert eventually(lambda: batches(cl), 30) == {b: 40 for b in acked}
        assert cl.describe("t")["placement"][0]["leader"] != lead.node_id
    finally:
        for n in nodes:
            n.ensure_stopped()
