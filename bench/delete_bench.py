"""`python -m bench delete`: deleting 10% of a table by predicate (RFC 0016 §6) against the same
deletes sent as key lists, on real node processes over HTTP.

Two nodes (one table each, 4 partitions, the same config) load the same ``ROWS`` readings
(``id`` int64 key, ``v`` uniform in [0, 100)), 100,000-row Arrow batches, then seal, offload
and checkpoint, so most rows are in offloaded segments. Then:

* ours — one ``POST /v1/tables/t/delete`` ``{"where": [["v", "<", 10]]}``: every partition's
  rows found and deleted in pieces, one commit timestamp;
* the peer — the same rows deleted by key, as a client without deletes by predicate must: the
  keys known beforehand (the client made the rows), then sent as JSON key lists of
  100,000 per request (each request its own commit).

Timed: the deletes alone on each side. Measured beside: each node's peak RSS above its RSS
before the delete (``/proc/<pid>/status``, sampled every 20 ms). Answers asserted: both tables
then hold the same rows. ``TERRASCALE_BENCH_DELETE_ROWS`` (default 10,000,000).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench.common import Result, print_table, write_json
from bench.node_proc import NodeProc

ROWS = int(os.environ.get("TERRASCALE_BENCH_DELETE_ROWS", "10000000"))
BATCH = 100_000
KEYS_PER_REQUEST = 100_000
CUT = 10.0  # v < CUT: 10% of the rows


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Peak:
    """A node's resident memory sampled while a phase runs: the peak above where it began."""

    def __init__(self, pid: int):
        self.pid, self.base, self.top = pid, _rss_kib(pid), 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.top = max(self.top, _rss_kib(self.pid))
            time.sleep(0.02)

    def stop(self) -> float:
        """MiB above the start."""
        self._stop.set()
        self._t.join()
        self.top = max(self.top, _rss_kib(self.pid))
        return (self.top - self.base) / 1024


def _batch(a: int) -> pa.Table:
    n = min(BATCH, ROWS - a)
    v = np.random.default_rng(a).uniform(0, 100, n)
    return pa.table({"id": pa.array(np.arange(a, a + n, dtype=np.int64)), "v": pa.array(v)})


def _load(node: NodeProc) -> None:
    with node.client(timeout=600) as c:
        c.create_table("t", [("id", "int64"), ("v", "float64")], "id", partitions=4)
        for a in range(0, ROWS, BATCH):
            c.upsert("t", _batch(a))
        for op in ("seal", "offload", "checkpoint"):
            c.request("POST", f"/v1/admin/{op}", b"{}", "application/json")


def _left(node: NodeProc) -> tuple[int, int]:
    with node.client(timeout=600) as c:
        row = c.aggregate("t", [{"fn": "count"}, {"fn": "sum", "column": "id"}])["rows"][0]
    return int(row["count"]), int(row["sum_id"])


def run(root: str) -> list[Result]:
    extra = '\n[segments]\nseal_bytes = "64MiB"\n'
    (Path(root) / "ours").mkdir()
    (Path(root) / "peer").mkdir()
    ours, peer = NodeProc(Path(root) / "ours", extra=extra), NodeProc(Path(root) / "peer", extra=extra, node_id="n2")
    ours.start()
    peer.start()
    try:
        for n in (ours, peer):
            _load(n)
        keys = np.concatenate([(lambda t: t.column("id").to_numpy()[t.column("v").to_numpy() < CUT])(_batch(a))
                               for a in range(0, ROWS, BATCH)])  # the client knows them
        want = len(keys)
        # ours: one request
        assert ours.proc is not None and peer.proc is not None
        mem = Peak(ours.proc.pid)
        t = time.perf_counter()
        with ours.client(timeout=600) as c:
            res = c.delete_where("t", where=[["v", "<", CUT]])
        ours_s = time.perf_counter() - t
        ours_mib = mem.stop()
        assert res["deleted"] == want, (res, want)
        # the peer: the same keys, 100,000 a request
        mem = Peak(peer.proc.pid)
        t = time.perf_counter()
        with peer.client(timeout=600) as c:
            gone = 0
            for a in range(0, want, KEYS_PER_REQUEST):
                gone += c.delete("t", keys[a : a + KEYS_PER_REQUEST].tolist())["deleted"]
        peer_s = time.perf_counter() - t
        peer_mib = mem.stop()
        assert gone == want
        assert _left(ours) == _left(peer) and _left(ours)[0] == ROWS - want
        print(f"  {ROWS:,} rows, {want:,} deleted; ours {ours_s:.2f} s (+{ours_mib:.0f} MiB RSS); peer {peer_s:.2f} s "
              f"(+{peer_mib:.0f} MiB RSS)", flush=True)
    finally:
        for n in (ours, peer):
            n.ensure_stopped()
    label = (f"delete 10% of {ROWS / 1e6:g}M rows by predicate (v < 10), one request, 4 partitions, mostly offloaded "
             f"({ours_s:.2f} s; node RSS +{ours_mib:.0f} MiB)")
    peer_label = (f"the same {want:,} rows deleted by key, JSON key lists of 100k a request, keys known beforehand "
                  f"({peer_s:.2f} s; node RSS +{peer_mib:.0f} MiB)")
    extra_doc = {"rows": ROWS, "deleted": want, "ours_s": ours_s, "peer_s": peer_s, "ours_rss_mib": ours_mib,
                 "peer_rss_mib": peer_mib}
    return [Result(label, want / ours_s, peer_label, want / peer_s, "rows deleted/s", "report", extra_doc)]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="delete-bench-") as root:
        print(f"delete bench: {ROWS:,} rows", flush=True)
        results = run(root)
    print_table("Delete by predicate vs by key lists (real nodes, HTTP)", results)
    print(f"\nJSON: {write_json('delete', results)}")
