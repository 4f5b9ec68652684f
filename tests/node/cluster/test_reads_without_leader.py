"""Sealed data from anywhere (RFC 0010 §6), with real processes: a partition whose node is
killed -9 keeps its offloaded rows readable through every other node — queries and read
plans as of a time its watermark covers — while a read that needs its unoffloaded rows
answers 503 instead of answering short."""
import numpy as np
import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.node.proc import FAST_CLUSTER, eventually
from tests.node.http.test_bridge_api import call, plan_rows
from tests.node.cluster.test_replication import counts, rows


@pytest.mark.slow
def test_a_dead_nodes_partitions_are_read_from_their_objects(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3)
        for bid in range(1, 11):
            eventually(lambda bid=bid: c1.upsert("t", rows(bid)))
        T = c1.delete("t", [int(k) for k in 2000 + np.arange(10)])["commit_ts"]  # 10 rows of batch 2 deleted
        for n in nodes:  # every partition's rows into objects
            with n.client(timeout=60) as c:
                c.admin("seal")
                c.admin("offload")
        # after T, not offloaded: batch 1 overwritten, batch 11 written
        c1.upsert("t", rows(1, b=111))
        after = c1.upsert("t", rows(11))["commit_ts"]
        want = {b: 40 for b in range(1, 11)} | {2: 30}
        assert counts(c1.query("t", columns=["b"], as_of=T, limit=100_000)) == want
        victim = next(n for n in nodes if n.node_id == c1.describe("t")["placement"][0]["leader"])
        others = [n for n in nodes if n is not victim]
        victim.kill()
        with others[0].client(timeout=60) as c:  # describe names each partition's watermark
            marks = [p["watermark"] for p in c.describe("t")["placement"]]
            assert all(T <= m < after for m in marks), (T, marks, after)
            got = eventually(lambda: c.query("t", columns=["b"], as_of=min(marks), limit=100_000))
            assert counts(got) == want  # nothing was written between T and the watermarks
        for n in others:
            with n.client(timeout=60) as c:
                # a query as of T: the dead node's partitions from their objects, the others as usual
                got = eventually(lambda c=c: c.query("t", columns=["b"], as_of=T, limit=100_000))
                assert counts(got) == want
                few = c.query("t", as_of=T, where=[["b", "=", 5]], limit=7)
                assert few.column("id").to_pylist() == list(range(5000, 5007))
                # a read plan as of T: every slice from the objects, nothing left to a tail
                plan = call(c, "/v1/tables/t/plan", {"as_of": T})
                assert not plan["tail"]
                assert counts(plan_rows(c, plan)) == want
                # now: the dead node's rows after T are only on its disk — refused, never short
                with pytest.raises(ApiError) as ei:
                    c.query("t", columns=["b"], limit=100_000)
                assert ei.value.status == 503, ei.value
                for as_of in (None, after):  # the present, or a time the objects do not cover
                    with pytest.raises(ApiError) as ei:
                        call(c, "/v1/tables/t/plan", {} if as_of is None else {"as_of": as_of})
                    assert ei.value.status == 503, ei.value
                with pytest.raises(ApiError) as ei:
                    c.query("t", columns=["b"], as_of=after, limit=100_000)
                assert ei.value.status == 503 and "needs its leader" in str(ei.value), ei.value
        # it returns: the rows after T are back, the same everywhere
        victim.start()
        for n in nodes:
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: counts(c.query("t", columns=["b"], limit=100_000)))
                assert got == {b: 40 for b in range(3, 12)} | {2: 30, 111: 40}
    finally:
        for n in nodes:
            n.ensure_stopped()
