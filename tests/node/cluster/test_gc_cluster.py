"""Garbage collection in a cluster never loses or reverts an acknowledged write (RFC 0009,
"Who collects"): three real node processes on one Raft catalog and one object store, every
segment job and GC turned up so a minute shows what an hour of defaults would, writers
overwriting keys through random nodes, an admin GC on every node every few seconds, and —
in the kill variants — a node killed with SIGKILL and restarted every few seconds. Every
key must read its last acknowledged value (or a later write whose answer was lost)."""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.node.proc import FAST_CLUSTER, eventually, holds, metric

KEYS = 1500
JOBS = """
[segments]
seal_bytes = "256KiB"
[jobs]
seal_every = "1s"
offload_every = "1s"
checkpoint_every = "1s"
[gc]
interval = "1s"
min_garbage = 0.2
grace = "0s"
[history]
retention = "2s"
"""


class Ledger:
    """Per key: the sequence number of its last acknowledged write and of every later write
    whose answer was lost (it may or may not have been applied). One writer per key, so a
    key's writes are ordered."""

    def __init__(self):
        self.acked = np.zeros(KEYS, np.int64)  # 0: never acknowledged
        self.maybe: dict[int, set[int]] = {}
        self.seq = np.zeros(KEYS, np.int64)
        self.lock = threading.Lock()

    def next_values(self, keys: np.ndarray) -> np.ndarray:
        with self.lock:
            self.seq[keys] += 1
            return self.seq[keys].copy()

    def done(self, keys: np.ndarray, vals: np.ndarray, ok: bool) -> None:
        with self.lock:
            if ok:
                self.acked[keys] = vals
                for k in keys.tolist():
                    self.maybe.pop(k, None)
            else:
                for k, v in zip(keys.tolist(), vals.tolist()):
                    self.maybe.setdefault(k, set()).add(v)

    def wrong(self, got: dict[int, int]) -> list[tuple[int, int, int | None]]:
        """(key, last acknowledged, read) for every key that reads neither."""
        out = []
        for k in range(KEYS):
            a, v = int(self.acked[k]), got.get(k)
            if a == 0 and (v is None or v in self.maybe.get(k, ())):
                continue
            if v == a or (v is not None and v > a and v in self.maybe.get(k, ())):
                continue
            out.append((k, a, v))
        return out


def writer(nodes, w: int, ledger: Ledger, stop: threading.Event, errors: list, seed: int) -> None:
    rng = random.Random(seed)
    mine = np.arange(w, KEYS, 3, dtype=np.int64)  # one writer per key
    clients = {}
    while not stop.is_set():
        node = rng.choice(nodes)
        keys = np.sort(np.array(rng.sample(mine.tolist(), 25), np.int64))
        vals = ledger.next_values(keys)
        ok = False
        try:
            if node.proc is None:
                raise ConnectionError("node is down")
            c = clients.get(node.node_id)
            if c is None:
                c = clients[node.node_id] = node.client(timeout=20)
            c.upsert("t", pa.table({"id": keys, "v": pa.array(vals, pa.int64())}))
            ok = True
        except (ApiError, ConnectionError, OSError) as e:
            clients.pop(node.node_id, None)
            if isinstance(e, ApiError) and e.status >= 500 and e.status not in (503, 504):
                errors.append(repr(e))  # a server fault (a 409 of a batch aborted by a kill is a retry)
            time.sleep(0.05)
        finally:
            ledger.done(keys, vals, ok)
    for c in clients.values():
        c.close()


def read_all(node) -> dict[int, int]:
    with node.client(timeout=60) as c:
        t = c.query("t", columns=["id", "v"], limit=10_000_000)
    return dict(zip(t.column("id").to_pylist(), t.column("v").to_pylist()))


def run_workload(tmp_path, replicas: int, kill: bool, seconds: float = 20.0, seed: int = 0):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    rng = random.Random(seed)
    try:
        start_all(nodes)
        c1 = nodes[0].client(timeout=60)
        c1.create_table("t", [("id", "int64"), ("v", "int64")], "id", partitions=3, replicas=replicas)
        ledger, stop, errors = Ledger(), threading.Event(), []
        threads = [threading.Thread(target=writer, args=(nodes, w, ledger, stop, errors, seed * 10 + w))
                   for w in range(3)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        gcs = 0
        while time.monotonic() - t0 < seconds:
            time.sleep(4)
            for n in nodes:
                if n.proc is None:
                    continue
                try:
                    with n.client(timeout=30) as c:
                        c.gc()
                    gcs += 1
                except (ApiError, ConnectionError, OSError) as e:
                    if isinstance(e, ApiError) and e.status >= 500 and e.status not in (503, 504):
                        errors.append(f"gc on {n.node_id}: {e!r}")
            if kill:
                victim = rng.choice(nodes)
                victim.kill()
                time.sleep(0.5)
                victim.start(wait=False)
        stop.set()
        for t in threads:
            t.join(60)
        for n in nodes:
            n.wait_ready(90)
        # two more GC passes on every node over the settled data (gc.interval 2 s) before reading
        runs = {n.node_id: metric(n, "terrascale_gc_runs_total") for n in nodes}
        eventually(lambda: holds(all(metric(n, "terrascale_gc_runs_total") >= runs[n.node_id] + 2 for n in nodes),
                                 "two GC passes on every node"), 180, 0.5)  # a bound: a loaded CI machine is slow
        assert sum(ledger.acked > 0) > KEYS // 2, "too few writes were acknowledged to prove anything"
        for n in nodes:
            def right(n=n):
                bad = ledger.wrong(read_all(n))
                assert not bad, f"{len(bad)} keys wrong on {n.node_id}, e.g. (key, acked, read) {bad[:5]}"
            eventually(right, 60, every=1.0)
        assert not errors, errors[:5]
        logs = "".join(n.log() for n in nodes) + "".join("".join(n.logs) for n in nodes)
        assert "job_failed job=gc" not in logs and "broadcast" not in logs, \
            [ln for ln in logs.splitlines() if "gc" in ln and ("fail" in ln or "error" in ln)][:5]
        relocated = logs.count("event=gc_relocated")
        assert relocated > 0, "no collection pass moved anything: the test proves nothing"
        print(f"R={replicas} kill={kill}: {int((ledger.acked > 0).sum())} keys acknowledged, "
              f"{int(ledger.seq.sum())} writes, {gcs} admin gc passes, {relocated} partitions relocated")
    finally:
        for n in nodes:
            n.ensure_stopped()


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 3])
def test_gc_on_three_nodes_keeps_every_acknowledged_write(tmp_path, replicas):
    run_workload(tmp_path, replicas, kill=False)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 3])
def test_gc_on_three_nodes_with_kills_keeps_every_acknowledged_write(tmp_path, replicas):
    run_workload(tmp_path, replicas, kill=True, seed=replicas)
