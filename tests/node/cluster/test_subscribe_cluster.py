"""A subscription across three nodes (R = 3, docs/rfcs/0015-subscriptions.md §8): the node a
subscriber reaches merges every leader's share; a leader killed with -9 while subscribed, and
later restarted (taking leaderships back), ends shares — the Python client resumes from its
last closed T by itself — and no acknowledged change is lost or repeated."""
from __future__ import annotations

import threading

import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from tests.node.proc import FAST_CLUSTER, eventually, holds, metric

COLUMNS = [("id", "int64"), ("n", "int64"), ("v", "float64")]
EXTRA = FAST_CLUSTER + '[subscriptions]\nprogress_every = "100ms"\n'


class Writes:
    """Upserts of rows whose ``n`` (``id % 3``) never changes, so a subscription to ``n = 0``
    takes every change of its keys; each attempt's rows are kept, acknowledged or not (a write
    that failed may still have been applied)."""

    def __init__(self):
        self.acked: set[tuple[int, int, float]] = set()  # (commit_ts, id, v)
        self.tried: set[tuple[int, float]] = set()  # (id, v) of every attempt
        self.k = 0

    def write(self, node, rounds: int) -> None:
        with node.client(timeout=30) as c:
            for _ in range(rounds):
                rows = [{"id": (self.k * 7 + j) % 90, "n": ((self.k * 7 + j) % 90) % 3, "v": float(self.k)}
                        for j in range(6)]
                self.k += 1
                while True:
                    self.tried |= {(r["id"], r["v"]) for r in rows}
                    try:
                        ts = c.upsert("t", rows)["commit_ts"]
                        break
                    except (ApiError, ConnectionError):
                        continue
                self.acked |= {(ts, r["id"], r["v"]) for r in rows}


def _leaders(c) -> dict[int, str]:
    return {p["partition"]: p["leader"] for p in c.describe("t")["placement"]}


@pytest.mark.slow
def test_a_subscription_across_nodes_survives_kill_9_of_a_leader(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=EXTRA)
    try:
        start_all(nodes)
        c = nodes[0].client(timeout=60)
        c.create_table("t", COLUMNS, "id", partitions=6, replicas=3)
        eventually(lambda: holds(len(set(_leaders(c).values())) == 3, "leaders on every node"), 60)
        w = Writes()
        w.write(nodes[1], 5)
        start = c.status()["closed_ts"]
        got: list[tuple[int, int, float]] = []
        closed: list[int] = []
        until: list[int] = []

        def follow():
            with nodes[0].client() as sc:
                for item in sc.subscribe("t", where=[["n", "=", 0]], columns=["v"], from_ts=start, idle_timeout=5):
                    if "closed" in item:
                        closed.append(item["closed"])
                        if until and item["closed"] >= until[0]:
                            return
                    else:
                        got.append((item["commit_ts"], item["row"]["id"], item["row"]["v"]))
        t = threading.Thread(target=follow, daemon=True)
        t.start()
        w.write(nodes[0], 20)
        victim = nodes[1]
        victim.kill()  # kill -9 of a node leading partitions, its shares open
        eventually(lambda: holds(victim.node_id not in _leaders(c).values(), "failover"), 60)
        w.write(nodes[2], 20)
        victim.start()  # back: a follower first, then leaderships back
        w.write(nodes[0], 20)
        until.append(max(a[0] for a in w.acked))
        t.join(180)
        assert not t.is_alive(), f"the subscriber never saw {until[0]} closed (last {closed[-1:]})"
        want = {a for a in w.acked if a[1] % 3 == 0 and a[0] > start}
        assert len(got) == len(set(got)), "a change came twice"
        assert want <= set(got), f"lost: {sorted(want - set(got))[:5]}"
        assert {(i, v) for _, i, v in got} <= w.tried  # nothing that was never written
        assert all(i % 3 == 0 for _, i, _ in got)
        # the merged subscription ended when its share on the killed node did, and was resumed
        assert metric(nodes[0], "terrascale_subscription_drops_total", reason="moved") >= 1
        # a prefix covering the partition key: only that partition's leader's share is opened
        # (node/http/routes/subscribe.py), and it carries every change of that key
        key = 3
        mine = sorted((ts, v) for ts, i, v in w.acked if i == key and ts > start)
        seen: list[tuple[int, float]] = []
        with nodes[0].client() as sc:
            for item in sc.subscribe("t", prefix=[key], from_ts=start, idle_timeout=5):
                if "closed" in item:
                    if item["closed"] >= until[0]:
                        break
                else:
                    assert item["row"]["id"] == key
                    seen.append((item["commit_ts"], item["row"]["v"]))
        assert set(mine) <= set(seen) and len(seen) == len(set(seen)), (mine, seen)
    finally:
        for n in nodes:
            n.ensure_stopped()
