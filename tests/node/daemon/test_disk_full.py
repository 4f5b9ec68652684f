"""A node whose block device fills up (a real 24 MB tmpfs): writes answer 507
``insufficient_storage`` and change nothing, reads go on, /readyz says writes are off, and once
the device grows writes resume by themselves — no restart — with nothing acknowledged lost
(kill -9 and restart afterwards: every acknowledged batch is back)."""
import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from node.errors import ApiError
from tests.fixtures.tmpfs import SmallDisk, can_mount
from tests.node.proc import eventually

pytestmark = pytest.mark.skipif(not can_mount(), reason="mounting a tmpfs needs root (CAP_SYS_ADMIN)")
ROWS = 500


def batch(bid: int) -> pa.Table:
    rng = np.random.default_rng(bid)
    return pa.table({"id": np.arange(bid * ROWS, (bid + 1) * ROWS, dtype=np.int64),
                     "b": pa.array(np.full(ROWS, bid), pa.int64()),
                     "pad": pa.array([rng.bytes(200).hex() for _ in range(ROWS)])})


def batches(c) -> set[int]:
    t = c.query("t", columns=["b"], limit=10_000_000)
    ids, n = np.unique(t.column("b").to_numpy(), return_counts=True)
    assert (n == ROWS).all(), "a batch is partly there"
    return set(ids.tolist())


@pytest.mark.slow
def test_a_full_block_device_is_507_reads_go_on_and_writes_resume_when_it_grows(tmp_path):
    node = NodeProc(tmp_path, extra='[jobs]\noffload_every = "0s"\nseal_every = "0s"\n')
    disk = SmallDisk(node.data / "block", 24)
    try:
        node.start()
        c = node.client(timeout=60)
        c.create_table("t", [("id", "int64"), ("b", "int64"), ("pad", "string")], "id", partitions=2)
        acked, bid = set(), 0
        while True:
            try:
                c.upsert("t", batch(bid))
            except ApiError as e:
                assert (e.status, e.code) == (507, "insufficient_storage"), e
                break
            acked.add(bid)
            bid += 1
            assert bid < 1000, "the device never filled"
        refused = bid
        for _ in range(3):
            with pytest.raises(ApiError) as e:
                c.upsert("t", batch(refused))
            assert e.value.status == 507
        assert batches(c) == acked  # reads go on, nothing refused is visible
        assert c._call("GET", "/readyz")["writes"] is False
        with pytest.raises(ApiError) as e:
            c._call("GET", "/readyz?for=writes")
        assert e.value.status == 503
        disk.grow(256)
        eventually(lambda: c.upsert("t", batch(refused)), 30)  # no restart
        acked.add(refused)
        for b in range(refused + 1, refused + 5):
            c.upsert("t", batch(b))
            acked.add(b)
        assert c._call("GET", "/readyz")["writes"] is True
        assert batches(c) == acked
        node.kill()
        node.start()
        with node.client(timeout=60) as c2:
            assert batches(c2) == acked
    finally:
        node.ensure_stopped()
        disk.remove()


@pytest.mark.slow
def test_a_leader_whose_disk_fills_steps_down_and_the_others_take_the_writes(tmp_path):
    """R = 3, the leader's block device is a 24 MB tmpfs: once it fills, the leader steps down
    (a disk error is a reason to), an election passes it over, and writes go on through the
    other two with nothing acknowledged lost; once its disk grows it follows again."""
    from bench.node_proc import raft_cluster
    from tests.node.proc import FAST_CLUSTER

    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + '[jobs]\noffload_every = "0s"\n')
    disk = SmallDisk(nodes[0].data / "block", 24)
    try:
        for n in nodes:
            n.start(wait=False)
        for n in nodes:
            n.wait_ready(90)
        c0, c1 = nodes[0].client(timeout=60), nodes[1].client(timeout=60)
        c0.create_table("t", [("id", "int64"), ("b", "int64"), ("pad", "string")], "id", partitions=1, replicas=3)
        assert c0.describe("t")["placement"][0]["leader"] == nodes[0].node_id
        acked, errors = set(), []
        for bid in range(400):
            try:
                c1.upsert("t", batch(bid))
                acked.add(bid)
            except ApiError as e:
                assert e.status in (503, 507), e  # stepping down, or refused at the full disk
                errors.append(e.code)
                break
        assert errors, "the device never filled"

        def led_elsewhere():
            leader = c1.describe("t")["placement"][0]["leader"]
            assert leader != nodes[0].node_id, nodes[0].log()[-3000:]
        eventually(led_elsewhere, 30)
        for b in range(1000, 1010):  # writes go on through the others
            eventually(lambda b=b: c1.upsert("t", batch(b)), 30)
            acked.add(b)
        assert c1.describe("t")["placement"][0]["leader"] != nodes[0].node_id
        got = eventually(lambda: batches(c1))
        assert acked <= got and got - acked <= set(range(400)), sorted(acked ^ got)[:10]  # refused ones may land
        disk.grow(256)
        for n in nodes:
            with n.client(timeout=60) as c:
                assert eventually(lambda c=c: batches(c)) == got
    finally:
        for n in nodes:
            n.ensure_stopped()
        disk.remove()
