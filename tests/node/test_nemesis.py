"""The nemesis suite: three real node processes, R = 3, writers batching across every partition
through every node, seal, offload, checkpoint and GC running on every node throughout, one
node's wall clock 2 s ahead — and seeded rounds of faults: kill -9 and restart, SIGSTOP and
SIGCONT, node-to-node links cut one way or both (``TERRASCALE_FAILPOINT_CUT_DIR``), a node
cut off over HTTP while its heartbeats go on, one node's block device filled to the last byte
(a tmpfs, root only) and freed again.

One checker for all of it, once every fault is healed and every follower caught up: every
acknowledged batch whole through every node and none half-applied or never written, every
``as_of`` read taken during the faults answering the same rows again, the change feed holding
every acknowledged batch's rows with no write twice — and once more after kill -9 of the node
leading the most partitions (what its replicas hold is the truth then).

``NEMESIS_ROUNDS`` (default 30) and ``NEMESIS_SEED`` (default: a fixed one; the seed is printed
with the trace of rounds) for the long mode."""
from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest

from tests.fixtures.tmpfs import SmallDisk, can_mount
from tests.node.proc import FAST_CLUSTER, eventually, raft_cluster
from tests.node.test_replication_faults import RETRY, Writers, caught_up, check_batches, counts

ROUNDS = int(os.environ.get("NEMESIS_ROUNDS", "30"))
SEED = int(os.environ.get("NEMESIS_SEED", "23"))
JOBS = """
[jobs]
seal_every = "1s"
offload_every = "1s"
checkpoint_every = "1s"
[gc]
interval = "2s"
grace = "0s"
min_garbage = 0.2
[segments]
seal_bytes = "256KiB"
"""


class Nemesis:
    def __init__(self, tmp_path, nodes, writers: Writers, rng: random.Random, disk: SmallDisk | None):
        self.nodes, self.w, self.rng, self.disk = nodes, writers, rng, disk
        self.cut_dirs = {n.node_id: tmp_path / f"cut-{n.node_id}" for n in nodes}
        self.trace: list[str] = []
        self.reads: list[tuple[int, dict[int, int]]] = []

    def log(self, what: str) -> None:
        self.trace.append(f"{time.monotonic():.2f} {what}")

    def cut(self, a: str, b: str) -> None:
        (self.cut_dirs[a] / b).touch()

    def heal_links(self) -> None:
        for d in self.cut_dirs.values():
            for f in d.iterdir():
                f.unlink()

    def round(self) -> None:
        kinds = ["kill", "pause", "cut_one_way", "cut_both_ways", "isolate"] + (["fill_disk"] if self.disk else [])
        kind = self.rng.choice(kinds)
        node = self.rng.choice(self.nodes)
        others = [n for n in self.nodes if n is not node]
        hold = self.rng.uniform(1.0, 2.5)
        self.log(f"{kind} {node.node_id} for {hold:.1f} s")
        if kind == "kill":
            node.kill()
            time.sleep(hold)
            node.start(wait=False)
            node.wait_ready(90)
        elif kind == "pause":
            self.w.paused.add(node.node_id)
            os.kill(node.proc.pid, signal.SIGSTOP)
            time.sleep(hold)
            os.kill(node.proc.pid, signal.SIGCONT)
            self.w.paused.discard(node.node_id)
        elif kind in ("cut_one_way", "cut_both_ways"):
            peer = self.rng.choice(others)
            self.cut(node.node_id, peer.node_id)
            if kind == "cut_both_ways":
                self.cut(peer.node_id, node.node_id)
            time.sleep(hold)
            self.heal_links()
        elif kind == "isolate":  # its HTTP path to and from every node; its Raft port still works
            for p in others:
                self.cut(node.node_id, p.node_id)
                self.cut(p.node_id, node.node_id)
            time.sleep(hold + 2)
            self.heal_links()
        elif kind == "fill_disk":
            ballast = os.path.join(self.disk.path, "ballast")
            try:
                with open(ballast, "wb") as f:  # to the last byte (it may be full already)
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
            except OSError:
                pass
            time.sleep(hold)
            if os.path.exists(ballast):
                os.unlink(ballast)
        self.read_present()
        time.sleep(0.3)

    def read_present(self) -> None:
        """A read of the present through a live node, kept with its T: read again at the end."""
        n = self.rng.choice([n for n in self.nodes if n.proc is not None and n.node_id not in self.w.paused])
        try:
            with n.client(timeout=10) as c:
                doc = c._call("POST", "/v1/tables/t/query", {"columns": ["b"], "limit": 10_000_000})
        except Exception as e:  # noqa: BLE001 - a fault may refuse it (503): nothing to keep then
            self.log(f"read refused: {e!r}"[:200])
            return
        b = np.array([r["b"] for r in doc["rows"]], np.int64)
        ids, n_ = np.unique(b, return_counts=True)
        self.reads.append((doc["as_of"], dict(zip(ids.tolist(), n_.tolist()))))


def feed_check(c, acked: set[int], rows_per: int) -> None:
    t = c._call("POST", "/v1/tables/t/changes", {"after": 0}, arrow=True)
    pairs = list(zip(t.column("id").to_pylist(), t.column("commit_ts").to_pylist()))
    assert len(pairs) == len(set(pairs)), "the change feed holds a write twice"
    ids = set(t.column("id").to_pylist())
    missing = [b for b in acked if any(b * rows_per + i not in ids for i in range(rows_per))]
    assert not missing, f"the change feed lacks acknowledged batches {sorted(missing)[:10]}"


@pytest.mark.slow
def test_nemesis_rounds_lose_nothing_and_agree(tmp_path):
    rng = random.Random(SEED)
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    disk = SmallDisk(nodes[2].data / "block", 256) if can_mount() else None
    nem = w = None
    try:
        for n in nodes:
            (tmp_path / f"cut-{n.node_id}").mkdir()
            env = {"TERRASCALE_FAILPOINT_CUT_DIR": str(tmp_path / f"cut-{n.node_id}")}
            if n is nodes[1]:
                env["TERRASCALE_FAILPOINT_CLOCK_SKEW_MS"] = "2000"  # its wall clock runs 2 s ahead
            n.start(wait=False, env=env)
        for n in nodes:
            n.wait_ready(90)
        with nodes[0].client(timeout=60) as c:
            c.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=3, replicas=3)
        w = Writers(nodes, n=4, retry=RETRY | {507}).start()
        w.wait_acks(8)
        nem = Nemesis(tmp_path, nodes, w, rng, disk)
        for _ in range(ROUNDS):
            nem.round()
        nem.log("heal")
        w.stop()
        assert not w.bad, f"answers no fault excuses: {w.bad[:5]}"
        acked = w.acked_ids()
        eventually(lambda: caught_up(nodes, 3), 90)
        for n in nodes:
            with n.client(timeout=60) as c:
                got = eventually(lambda c=c: counts(c), 30)
                check_batches(got, acked)
                assert set(got) <= w.tried, f"batches never written: {sorted(set(got) - w.tried)[:5]}"
        with nodes[0].client(timeout=60) as c:
            for T, seen in nem.reads:
                assert eventually(lambda T=T: counts(c, as_of=T), 30) == seen, f"as_of {T} changed"
            feed_check(c, acked, 12)
        # the replicas hold it all: kill -9 the node leading the most partitions, read again
        led = caught_up(nodes, 3)
        top = max(nodes, key=lambda n: sum(1 for who, _ in led.values() if who == n.node_id))
        top.kill()
        nem.log(f"final kill -9 of {top.node_id}")
        for n in nodes:
            if n is not top:
                with n.client(timeout=60) as c:
                    check_batches(eventually(lambda c=c: counts(c), 60), acked)
        print(f"nemesis seed {SEED}: {ROUNDS} rounds, {len(acked)} batches acknowledged, "
              f"{len(nem.reads)} as_of reads, errors {w.errors}")
    except BaseException:
        if nem is not None:
            print(f"nemesis seed {SEED}, rounds:\n" + "\n".join(nem.trace))
        raise
    finally:
        if w is not None:
            w.stop_ev.set()
        for n in nodes:
            if n.proc is not None:
                try:
                    os.kill(n.proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            n.ensure_stopped()
        if disk is not None:
            disk.remove()
