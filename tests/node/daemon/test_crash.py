"""kill -9 and SIGTERM while 8 clients ingest concurrently over HTTP: after a restart every
acknowledged batch is there, whole, and no batch is there in part."""
import threading

import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import NodeProc, raft_cluster, start_all
from node.errors import ApiError
from tests.node.proc import eventually, holds

CLIENTS, BATCH = 8, 400


def batch(rnd: int, client: int, seq: int) -> tuple[int, pa.Table]:
    """A batch whose keys spread over every partition; its id is in every row (``b``)."""
    bid = (rnd * 100 + client) * 100_000 + seq
    keys = bid * BATCH + np.arange(BATCH, dtype=np.int64)
    return bid, pa.table({"id": keys, "b": pa.array(np.full(BATCH, bid), pa.int64()),
                          "x": pa.array(np.arange(BATCH, dtype=np.float64))})


class Load:
    """CLIENTS threads upserting batches until the node goes away (or ``stop`` is set)."""

    def __init__(self, node: NodeProc, rnd: int):
        self.node, self.rnd = node, rnd
        self.acked: set[int] = set()
        self.refused: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def _run(self, i: int) -> None:
        with self.node.client(timeout=60) as c:
            for seq in range(1_000_000):
                if self.stop.is_set():
                    return
                bid, t = batch(self.rnd, i, seq)
                try:
                    res = c.upsert("k", t)
                except ApiError as e:  # refused while stopping: a clean error, never partial
                    with self.lock:
                        self.refused.append(f"{e.status} {e.code}")
                    return
                except ConnectionError:
                    return
                assert res["committed"] == BATCH
                with self.lock:
                    self.acked.add(bid)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def wait_acked(self, n: int, timeout: float = 60) -> None:
        eventually(lambda: holds(len(self.acked) >= n, f"{n} batches acknowledged (only {len(self.acked)})"),
                   timeout, 0.01)

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(120)


def check_batches(node: NodeProc, acked: set[int]) -> int:
    """Every acknowledged batch whole; any other batch whole or absent. Returns batches seen."""
    with node.client() as c:
        t = c.query("k", columns=["id", "b", "x"], limit=100_000_000)
    ids, bids, xs = (t.column(n).to_numpy() for n in ("id", "b", "x"))
    assert (ids // BATCH == bids).all() and (xs == ids % BATCH).all()
    seen, counts = np.unique(bids, return_counts=True)
    partial = seen[counts != BATCH]
    assert not len(partial), f"partial batches {partial.tolist()}"
    missing = acked - set(seen.tolist())
    assert not missing, f"acknowledged batches lost: {sorted(missing)[:10]}"
    return len(seen)


def make_node(tmp_path) -> NodeProc:
    node = NodeProc(tmp_path, extra='shutdown_timeout = "20s"').start()
    with node.client() as c:
        c.create_table("k", [("id", "int64"), ("b", "int64"), ("x", "float64")], "id", indexes=["b"])
    return node


@pytest.mark.slow
def test_kill_9_during_concurrent_ingest_loses_nothing_acknowledged(tmp_path):
    node = make_node(tmp_path)
    acked: set[int] = set()
    try:
        for rnd in range(3):
            with Load(node, rnd) as load:
                load.wait_acked(20 + 10 * rnd)  # some batches in, many more in flight
                log = node.kill()
            acked |= load.acked
            assert "Traceback" not in log
            node.start()
            seen = check_batches(node, acked)
            assert seen >= len(acked)
        with node.client() as c:  # the node takes writes again after the last restart
            assert c.upsert("k", batch(9, 0, 0)[1])["committed"] == BATCH
    finally:
        node.ensure_stopped()


@pytest.mark.slow
def test_sigterm_under_load_finishes_requests_and_stops_cleanly(tmp_path):
    node = make_node(tmp_path)
    try:
        with Load(node, 0) as load:
            load.wait_acked(30)
            rc, log = node.stop()
        assert rc == 0, log
        assert "event=stopping" in log and "event=stopped" in log and "Traceback" not in log
        assert all(r == "503 not_ready" for r in load.refused), load.refused
        node.start()
        assert check_batches(node, load.acked) >= len(load.acked)
        # a clean stop checkpointed the key index: nothing (or little) is left to replay
        rc, log = node.stop()
        assert rc == 0 and "event=shutdown_checkpoint" in log
    finally:
        node.ensure_stopped()


@pytest.mark.slow
def test_kill_9_during_ingest_on_the_raft_catalog_loses_nothing_acknowledged(tmp_path):
    """The same on a 3-process Raft catalog: kill -9 the node the clients write through (it
    leads partition 0 and coordinates every batch) mid-ingest, then the catalog leader; each
    restarts and every acknowledged batch is there, whole. The table's partitions are spread
    over all three nodes (RFC 0010) with one copy each, so while either victim is down the
    batches, which span every partition, are refused — never acknowledged in part."""
    nodes = raft_cluster(tmp_path, 3, extra='shutdown_timeout = "20s"\n')
    try:
        start_all(nodes)
        with nodes[0].client() as c:
            c.create_table("k", [("id", "int64"), ("b", "int64"), ("x", "float64")], "id", indexes=["b"])
            owner = next(n for n in nodes if n.node_id == c.cluster()["partitions"]["k"]["0"])
        acked: set[int] = set()
        for rnd in range(2):
            with owner.client() as c:
                leader = c.cluster()["leader"]
            victim = owner if rnd == 0 else next(n for n in nodes if n.node_id == leader)
            with Load(owner, rnd) as load:
                load.wait_acked(15 + 10 * rnd)
                log = victim.kill()
            acked |= load.acked
            assert "Traceback" not in log
            victim.start()
            assert check_batches(owner, acked) >= len(acked)
        with owner.client() as c:
            assert c.upsert("k", batch(9, 0, 0)[1])["committed"] == BATCH
    finally:
        for n in nodes:
            n.ensure_stopped()
