"""The coordinator's side of a batch across nodes (node/cluster/commit.py): when a reserve
fails — its call timed out, the node is slow or its lock queue long — the abort goes to that
node too, not only to the nodes that answered: its reserve may still take the partition's
locks later, and without the abort it then held them until its prepare timeout (simulation
seed 4747; the participant's side is tested in tests/rowstore/db/write/test_participant.py)."""
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from node.cluster import commit as commit_mod


class Placement:
    def by_node(self, pids):
        return {"a": [p for p in pids if p == 0], "b": [p for p in pids if p == 1]}


class Clock:
    last = 0

    def now_ms(self) -> int:
        return 1_700_000_000_000


async def test_a_reserve_that_timed_out_is_aborted_on_its_node_too():
    calls = []
    aborted_here = []

    async def reserve(*a, **k):  # this node's own share: reserved at once
        return SimpleNamespace(ts=5, rows=1, existed=0)

    async def abort(txn):
        aborted_here.append(txn)

    async def call(who, method, path, body=None, doc=None, headers=None):
        calls.append((who, path.split("?")[0]))
        if path.startswith("/v1/internal/txn/reserve"):
            raise ConnectionError(f"node {who}: no answer within the deadline")
        return 200, {}, b"{}"

    node = SimpleNamespace(cluster=SimpleNamespace(node_id="a", call=call), catalog=None,
                           db=SimpleNamespace(clock=Clock(), tasks=SimpleNamespace(spawn=None),
                                              participant=SimpleNamespace(reserve=reserve, abort=abort)))
    d = SimpleNamespace(name="t", table_id="T", schema=SimpleNamespace(version=1))
    batch = pa.record_batch({"id": pa.array([1, 2], pa.int64())})
    with pytest.raises(ConnectionError):
        await commit_mod.commit_across(node, d, batch, np.array([0, 1]), Placement(), delete=False)
    assert len(aborted_here) == 1  # the share reserved here
    assert ("b", "/v1/internal/txn/abort") in calls  # and the node whose reserve never answered
