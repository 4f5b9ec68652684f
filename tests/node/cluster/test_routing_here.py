"""How the router confirms that partitions are served here (node/cluster/router.py ``_where``):
one-copy partitions the engine serves need no linearizable placement read (a Raft barrier per
request); anything else — one the engine released, a replicated one without a lease, a request
forwarded here — still takes the fresh look. The placement is a counting double; the moves
themselves run between real processes in test_single_copy_moves.py."""
import asyncio
from types import SimpleNamespace

import pytest

from node.cluster.members import FORWARDED
from node.cluster.placement import PartitionPlace, Placement
from node.cluster.router import Misdirected, Router
from node.metrics import Metrics
from node.phase import Readiness


class Cluster:
    def __init__(self, pl: Placement):
        self.node_id, self.multi, self.pl, self.fresh_reads = "n1", True, pl, 0

    async def placement(self, name, partitions, fresh=False):
        self.fresh_reads += fresh
        return self.pl


def router(owned: set, pl: Placement) -> tuple[Router, Cluster]:
    cluster = Cluster(pl)
    table = SimpleNamespace(owned=owned)
    db = SimpleNamespace(tables=SimpleNamespace(get=lambda tid: table if tid == "T1" else None),
                         leadership=SimpleNamespace(shipper=lambda tid, pid: None))
    readiness = Readiness()
    readiness.serve()
    return Router(SimpleNamespace(cluster=cluster, db=db), readiness, Metrics()), cluster


D = SimpleNamespace(name="t", table_id="T1", partitions=3)
PL = Placement((PartitionPlace(("n1",), 1), PartitionPlace(("n1", "n2", "n3"), 2), PartitionPlace(("n2",), 1)))


def where(r, pids, headers=None):
    return asyncio.run(r._where(SimpleNamespace(headers=headers or {}), D, pids))


def test_one_copy_partitions_the_engine_serves_take_no_fresh_placement_read():
    r, c = router({0, 1}, PL)
    assert where(r, [0]) == "n1" and c.fresh_reads == 0


@pytest.mark.parametrize("pids, owned", [
    ([0], set()),  # released here (a hand-off under way): the placement decides
    ([1], {0, 1}),  # replicated, led here without a lease
    ([0, 1], {0, 1}),  # one of them replicated
])
def test_anything_else_takes_the_fresh_look(pids, owned):
    r, c = router(owned, PL)
    assert where(r, pids) == "n1" and c.fresh_reads == 1


def test_a_forwarded_request_is_checked_freshly_and_misdirected_when_elsewhere():
    r, c = router({0}, PL)
    assert where(r, [0], {FORWARDED: "n2"}) == "n1" and c.fresh_reads == 1
    with pytest.raises(Misdirected):
        where(r, [2], {FORWARDED: "n2"})


def test_partitions_elsewhere_are_routed_there_from_the_cached_placement():
    r, c = router({0}, PL)
    assert where(r, [2]) == "n2" and c.fresh_reads == 0
    assert where(r, [0, 2]) is None  # several nodes: a batch across them


def test_a_prepared_write_served_here_builds_no_arrow_batch_and_one_across_nodes_builds_it_once():
    """A small JSON write comes to the router prepared by the coalescer (rows encoded, a
    partition per row): served here it is committed as prepared — its rows are never converted
    to Arrow (that conversion and the conform cost the cluster's write path 40% of its loop);
    spanning nodes, the Arrow batch is built once, for the batch across them."""
    r, _ = router({0}, PL)
    built, committed, across = [], [], []

    async def commit():
        committed.append(1)
        return SimpleNamespace(count=1, commit_ts=7)

    async def fake_across(d, batch, pids, delete):
        across.append((batch, sorted(set(pids.tolist())), delete))
        return SimpleNamespace(rows=2, existed=0, commit_ts=9)
    r._across = fake_across
    req = SimpleNamespace(headers={})
    got = asyncio.run(r.write(req, D, [0], commit, lambda: built.append(1) or "batch", False))
    assert got == (None, (1, 7)) and committed == [1] and built == [] and across == []
    got = asyncio.run(r.write(req, D, [0, 2], commit, lambda: built.append(1) or "batch", False))
    assert got == (None, (2, 9)) and built == [1] and across == [("batch", [0, 2], False)]
