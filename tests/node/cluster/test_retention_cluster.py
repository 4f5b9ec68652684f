"""A table's retention on three real nodes with R = 3 (RFC 0016 §5), every segment job and GC
turned up and a node killed with SIGKILL and restarted every few seconds while writers add
readings of ages 0 to 20 s through random nodes: at the end every node answers, at its T,
exactly the acknowledged rows not older than T's wall time − keep (and no row older, whether
acknowledged or not); segments that aged whole were retired unread by the collector, and once
every row has aged no segment of the table is left."""
from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

from bench.node_proc import raft_cluster, start_all
from node.errors import ApiError
from rowstore.hlc import ms_of
from tests.node.cluster.test_gc_cluster import JOBS
from tests.node.proc import FAST_CLUSTER, eventually, holds, metric

KEEP_S, MAX_AGE_S = 10, 20


class Written:
    """Every reading sent: its id's ts (µs), and whether its write was acknowledged."""

    def __init__(self):
        self.ts: dict[int, int] = {}
        self.acked: set[int] = set()
        self.lock = threading.Lock()
        self.next = 0

    def batch(self, rng: random.Random, n: int) -> pa.Table:
        now_us = time.time_ns() // 1000
        with self.lock:
            ids = list(range(self.next, self.next + n))
            self.next += n
            ts = [now_us - int(rng.uniform(0, MAX_AGE_S) * 1e6) for _ in ids]
            self.ts.update(zip(ids, ts))
        return pa.table({"id": pa.array(ids, pa.int64()), "ts": pa.array(ts, pa.timestamp("us", tz="UTC"))})


def _writer(nodes, w: Written, stop: threading.Event, errors: list, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        node = rng.choice(nodes)
        batch = w.batch(rng, 20)
        try:
            if node.proc is None:
                raise ConnectionError("node is down")
            with node.client(timeout=20) as c:
                c.upsert("m", batch)
            with w.lock:
                w.acked.update(batch.column("id").to_pylist())
        except (ApiError, ConnectionError, OSError) as e:
            if isinstance(e, ApiError) and e.status >= 500 and e.status not in (503, 504):
                errors.append(repr(e))
            time.sleep(0.05)


def _read(node) -> tuple[dict, int]:
    """The node's ids at its T and its count at that T."""
    with node.client(timeout=60) as c:
        doc = c.query_json("m", columns=["id"], limit=10_000_000)
        return doc, c.aggregate("m", [{"fn": "count"}], as_of=doc["as_of"])["rows"][0]["count"]


def _check(node, w: Written) -> int:
    """The node's rows at its T against what was written; how many it holds. The read is
    retried on an error answer only (a node may briefly not serve a partition while the
    cluster map follows a late heartbeat on a loaded machine: a 503, not a wrong answer)."""
    doc, count = eventually(lambda: _read(node), 60, every=1.0)
    cut = ms_of(doc["as_of"]) * 1000 - KEEP_S * 1_000_000
    got = {r["id"] for r in doc["rows"]}
    old = sorted(i for i in got if w.ts[i] < cut)
    assert not old, f"{node.node_id}: {len(old)} rows older than the retention are visible, e.g. {old[:5]}"
    lost = sorted(i for i in w.acked if w.ts[i] >= cut and i not in got)
    assert not lost, f"{node.node_id}: {len(lost)} acknowledged rows within the retention are missing: {lost[:5]}"
    assert count == len(got), (node.node_id, count, len(got))
    return len(got)


def _segments_left(node) -> list[tuple[int, int, str, int]]:
    """(segid, partition, state, rows) of the table's segments past the write-ahead's tail: a
    partition's current segment stays (empty: the seal job seals one holding rows every second)."""
    with node.client(timeout=60) as c:
        return [(s["segid"], s["partition"], s["state"], s["rows"]) for s in c.segments("m")["segments"]
                if s["state"] != "active"]


def _dropped(node) -> float:
    """The node's count of segments retired by the retention (0 when it does not answer)."""
    try:
        return metric(node, "terrascale_retention_segments_dropped_total")
    except (ApiError, OSError):
        return 0


@pytest.mark.slow
def test_retention_on_three_nodes_with_kills(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra=FAST_CLUSTER + JOBS)
    rng = random.Random(3)
    try:
        start_all(nodes)
        with nodes[0].client(timeout=60) as c:
            cols = [{"name": "id", "type": "int64"}, {"name": "ts", "type": "timestamp", "nullable": False}]
            c.create_table("m", cols, "id", partitions=3, replicas=3, retention={"column": "ts", "keep": "1h"})
        with nodes[1].client(timeout=60) as c:  # changed on another node: every node reads the new setting
            c.set_retention("m", {"column": "ts", "keep": f"{KEEP_S}s"})
        with nodes[2].client(timeout=60) as c:
            assert c.describe("m")["retention"] == {"column": "ts", "keep_s": float(KEEP_S)}
        w, stop, errors = Written(), threading.Event(), []
        threads = [threading.Thread(target=_writer, args=(nodes, w, stop, errors, s)) for s in range(3)]
        for t in threads:
            t.start()
        t0, dropped_before_kills = time.monotonic(), 0
        while time.monotonic() - t0 < 24:
            time.sleep(4)
            victim = rng.choice(nodes)
            dropped_before_kills += _dropped(victim)  # a process's counter dies with it
            victim.kill()
            time.sleep(0.5)
            victim.start(wait=False)
        stop.set()
        for t in threads:
            t.join(60)
        for n in nodes:
            n.wait_ready(90)
        assert len(w.acked) > 500, "too few writes were acknowledged to prove anything"
        for n in nodes:
            eventually(lambda n=n: _check(n, w), 60, every=1.0)
        # the oldest segments aged whole while the writers ran: some node retired one unread
        eventually(lambda: holds(dropped_before_kills + sum(_dropped(n) for n in nodes) > 0,
                                 "a segment dropped by the retention"), 120, 1.0)
        held = [_check(n, w) for n in nodes]
        # once every row has aged, no segment of the table is left: each partition's last one
        # goes too (it was kept for ever, for its seq — RFC 0009, "Replay order")
        eventually(lambda: holds(not (left := _segments_left(nodes[0])),
                                 f"no sealed, offloaded or retired segment left (left: {left})"), 120, 1.0)
        assert not errors, errors[:5]
        print(f"retention R=3 with kills: {len(w.ts)} rows sent, {len(w.acked)} acknowledged, "
              f"{held} visible at the end")
    finally:
        for n in nodes:
            n.ensure_stopped()
