"""`python -m bench membership`: writes while the cluster changes (RFC 0010 §5, rebalancing).

Three node processes on one Raft catalog, a table of 4 partitions with R = 3, and the same
writers throughout: ``WRITERS`` threads, each through its own node, each sending one batch of
``ROWS`` rows at a time and waiting for its answer (the same client path, durability and
in-flight batches in every window). Three windows of the same run are compared:

* unchanged — the three members, ``TERRASCALE_BENCH_MEMBERSHIP_S`` seconds (default 20);
* join — from `admin cluster add` of a fourth node until every member holds 3 replicas and
  leads one partition, no move running;
* removal — from `admin cluster remove` of that node until no partition names it and each has
  3 replicas again.

Per window: acknowledged batches a second, the p99 of their latencies, and the longest time
without any acknowledgement (against the failover target, 3 s). Every acknowledged batch is
read back whole from every member at the end.
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import Result, print_table, write_json
from bench.node_proc import NodeProc, joiner, raft_cluster, start_all
from node.errors import ApiError

SECONDS = float(os.environ.get("TERRASCALE_BENCH_MEMBERSHIP_S", "20"))
WRITERS, ROWS, PARTITIONS = 3, 100, 4
FAST = "[cluster]\nheartbeat = \"200ms\"\nfailure_timeout = \"1500ms\"\nack_timeout = \"3s\"\n"
FAILOVER_TARGET_S = 3.0


@dataclass
class Log:
    """Every write: (call, return, acknowledged), and the batch ids acknowledged."""

    calls: list[tuple[float, float, bool]] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window(self, a: float, b: float) -> dict[str, float]:
        with self.lock:
            ok = sorted((t1, t1 - t0) for t0, t1, good in self.calls if good and a <= t1 <= b)
        ends = [a, *(t for t, _ in ok), b]
        lat = np.array([x for _, x in ok]) if ok else np.zeros(1)
        return {"seconds": b - a, "batches": len(ok), "per_s": len(ok) / (b - a),
                "p99_ms": float(np.percentile(lat, 99) * 1e3), "p50_ms": float(np.percentile(lat, 50) * 1e3),
                "longest_gap_s": float(np.max(np.diff(ends)))}


def _writer(node: NodeProc, w: int, log: Log, stop: threading.Event) -> None:
    bid = w
    c = None
    while not stop.is_set():
        ids = np.arange(bid * ROWS, (bid + 1) * ROWS, dtype=np.int64)
        t0 = time.monotonic()
        ok = False
        try:
            c = c or node.client(timeout=30)
            c.upsert("t", pa.table({"id": ids, "b": pa.array(np.full(ROWS, bid, np.int64))}))
            ok = True
        except (ApiError, ConnectionError, OSError):
            if c is not None:
                c.close()
            c = None
            time.sleep(0.05)
        with log.lock:
            log.calls.append((t0, time.monotonic(), ok))
            if ok:
                log.acked.append(bid)
        bid += WRITERS
    if c is not None:
        c.close()


def _wait(cond, timeout: float, what: str) -> float:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return time.monotonic()
        except (ApiError, ConnectionError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def _balanced(c, members: list[str]) -> bool:
    place = c.describe("t")["placement"]
    held = {n: sum(n in p["replicas"] for p in place) for n in members}
    return (not any(p.get("leaving") for p in place) and len(set(held.values())) == 1
            and all(len(p["replicas"]) == 3 for p in place)
            and sorted(p["leader"] for p in place) == sorted(members))


def _gone(c, node_id: str) -> bool:
    place = c.describe("t")["placement"]
    return all(node_id not in p["replicas"] and len(p["replicas"]) == 3 and not p.get("leaving") for p in place)


def run(root: Path) -> list[Result]:
    nodes = raft_cluster(root, 3, extra=FAST)
    n4 = None
    log, stop = Log(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        start_all(nodes)
        c = nodes[0].client(timeout=60)
        c.create_table("t", [("id", "int64"), ("b", "int64")], "id", partitions=PARTITIONS, replicas=3)
        threads = [threading.Thread(target=_writer, args=(nodes[w % 3], w, log, stop)) for w in range(WRITERS)]
        for t in threads:
            t.start()
        time.sleep(3)  # warm
        a = time.monotonic()
        time.sleep(SECONDS)
        unchanged = log.window(a, time.monotonic())
        n4 = joiner(root, nodes, FAST).start(wait=False)
        a = time.monotonic()
        c.add_member(n4.raft_address)
        n4.wait_ready(120)
        b = _wait(lambda: _balanced(c, ["n1", "n2", "n3", "n4"]), 300, "the join balanced")
        join = log.window(a, max(b, a + 1))
        a = time.monotonic()
        _wait(lambda: bool(c.remove_member(n4.raft_address)), 120, "the removal accepted")
        b = _wait(lambda: _gone(c, "n4"), 300, "the removal's moves done")
        removal = log.window(a, max(b, a + 1))
        stop.set()
        for t in threads:
            t.join(60)
        for n in nodes:  # every acknowledged batch, whole, on every remaining member
            with n.client(timeout=60) as cn:
                got = cn.query("t", columns=["b"], limit=100_000_000).column("b").to_numpy()
            counts = np.bincount(got)
            missing = [x for x in log.acked if x >= len(counts) or counts[x] != ROWS]
            assert not missing, f"{n.node_id}: acknowledged batches not whole: {missing[:5]}"
        c.close()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for n in [*nodes, *([n4] if n4 else [])]:
            n.ensure_stopped()
    for name, w in (("unchanged", unchanged), ("join", join), ("removal", removal)):
        print(f"  {name}: {w['seconds']:.1f} s, {w['per_s']:.1f} batches/s, p50 {w['p50_ms']:.0f} ms, "
              f"p99 {w['p99_ms']:.0f} ms, longest without an ack {w['longest_gap_s']:.2f} s", flush=True)
    label = f"{WRITERS} writers (one batch of {ROWS} rows in flight each, a node each), 4 partitions, R=3"
    peer = (f"the same writers, membership unchanged ({unchanged['seconds']:.0f} s; p99 {unchanged['p99_ms']:.0f} ms, "
            f"longest without an ack {unchanged['longest_gap_s']:.2f} s)")
    target = f">= 0.5x; no {FAILOVER_TARGET_S:g} s without an ack"

    def figures(w: dict[str, float]) -> str:
        return (f"{w['seconds']:.1f} s window, p99 {w['p99_ms']:.0f} ms, "
                f"longest without an ack {w['longest_gap_s']:.2f} s")
    return [Result(f"writes during a join (a 4th member takes replicas and leaderships; {figures(join)}); {label}",
                   join["per_s"], peer, unchanged["per_s"], "batches/s", target,
                   {"join": join, "unchanged": unchanged}),
            Result(f"writes during a removal (its leaderships handed over, its replicas moved; {figures(removal)}); "
                   f"{label}", removal["per_s"], peer, unchanged["per_s"], "batches/s", target,
                   {"removal": removal, "unchanged": unchanged})]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="membership-bench-") as root:
        print(f"membership bench: {WRITERS} writers, {SECONDS:g} s unchanged, then a join and a removal", flush=True)
        results = run(Path(root))
    print_table("Writes while the membership changes (3 -> 4 -> 3 nodes)", results)
    print(f"\nJSON: {write_json('membership', results)}")
