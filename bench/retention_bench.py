"""`python -m bench retention`: reclaiming the oldest 30% of a table (RFC 0016 §5).

Two in-process Databases on local disk load the same readings in time order (every sensor's
reading of one second, then the next second's), sealed and offloaded into columnar segments;
the history horizon passes every commit. Then:

* ours — a retention whose cutoff leaves the oldest 30% out, and one GC pass: segments whose
  rows all aged are retired without being read, and the one straddling the cutoff is
  rewritten with its kept rows;
* the peer — the same 30% deleted by key (the only way before retention: the client sends the
  keys back, 100,000 per request), then one GC pass over the same segments.

Both passes run with the same GC settings (`min_garbage` 0.5, no grace, so retired objects
are deleted in the pass). Reported: the time to the space coming back (ours: the pass; the
peer: the deletes and the pass), the rows each pass copied, and the object-store bytes before
and after. Answers are asserted: both tables then hold the same 70% of the rows.

Rows: 1,000 sensors × ``TERRASCALE_BENCH_RETENTION_MINUTES`` readings, one a minute (default
2,000: 2M rows). A minute between readings keeps the cutoff between the same two readings
while the bench's clock moves on (the horizon must pass the commits and the setting).
"""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.common import Result, print_table, write_json
from catalog.memory import MemoryCatalog
from rowstore.db.background.gc import GcConfig
from rowstore.db.database import Database, TablesConfig
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS

SENSORS = 1000
MINUTES = int(os.environ.get("TERRASCALE_BENCH_RETENTION_MINUTES", "2000"))
MIN_US = 60_000_000
BATCH = 200_000
SCHEMA = "sensor int32, ts timestamp, v float64, primary key (sensor, ts)"
DROP = 0.3


class Clock:
    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


def rows(t0_us: int, first: int, n: int) -> pa.Table:
    """Readings ``first .. first+n`` in time order: reading i is sensor i % SENSORS at minute i // SENSORS."""
    i = np.arange(first, first + n, dtype=np.int64)
    return pa.table({"sensor": pa.array((i % SENSORS).astype(np.int32)),
                     "ts": pa.array(t0_us + (i // SENSORS) * MIN_US, pa.timestamp("us", tz="UTC")),
                     "v": pa.array(np.random.default_rng(first).normal(0, 1, n))})


def _bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


async def _loaded(root: str, clock: Clock, t0_us: int) -> Database:
    fs = TerrascaleFS(MemoryCatalog(), LocalBlockDevice(f"{root}/block"),
                      LocalBlockDevice(f"{root}/cache", durable=False), LocalObjectStore(f"{root}/objects"),
                      config=FsConfig(cache_memory_bytes=256 << 20))
    await fs.open()
    db = Database(fs, TablesConfig(partitions=4, seal_bytes=1 << 20, columnar=True, retention_ms=0,
                                   gc=GcConfig(min_garbage=0.5, grace_s=0.0)), clock.now_ms)
    await db.open()
    await db.create_table("r", SCHEMA)
    n = SENSORS * MINUTES
    for i in range(0, n, BATCH):
        await db.upsert("r", rows(t0_us, i, min(BATCH, n - i)))
    await db.seal()
    await db.offload()
    await db.checkpoint()
    return db


async def run(root: str) -> list[Result]:
    clock = Clock()
    t0_us = clock.now_ms() * 1000 - MINUTES * MIN_US  # the readings end now
    cut = int(MINUTES * DROP)  # the oldest 30% of the minutes
    n, dropped = SENSORS * MINUTES, SENSORS * cut
    ours_db = await _loaded(f"{root}/ours", clock, t0_us)
    peer_db = await _loaded(f"{root}/peer", clock, t0_us)
    try:
        # the peer: delete the oldest 30% by key, 100,000 keys a request
        sensors = np.tile(np.arange(SENSORS, dtype=np.int32), cut)
        mins = np.repeat(np.arange(cut, dtype=np.int64), SENSORS)
        t = time.perf_counter()
        for a in range(0, dropped, 100_000):
            b = min(a + 100_000, dropped)
            keys = [[int(s), int(t0_us + x * MIN_US)] for s, x in zip(sensors[a:b], mins[a:b])]
            await peer_db.delete("r", keys)
        peer_delete_s = time.perf_counter() - t
        await peer_db.seal()
        await peer_db.offload()
        await peer_db.checkpoint()
        # ours: a retention whose cutoff lies half a minute before the first kept reading
        keep_ms = (clock.now_ms() * 1000 - t0_us - cut * MIN_US + MIN_US // 2) // 1000
        await ours_db.set_retention("r", {"column": "ts", "keep": f"{keep_ms}ms"})
        clock.offset_ms += 2 * (int(peer_db.cfg.purge_lag_ms) + 1000)  # the horizon passes commits and setting
        before = {"ours": _bytes(f"{root}/ours/objects"), "peer": _bytes(f"{root}/peer/objects")}
        t = time.perf_counter()
        ours_gc = await ours_db.collect_garbage()
        ours_s = time.perf_counter() - t
        t = time.perf_counter()
        peer_gc = await peer_db.collect_garbage()
        peer_gc_s = time.perf_counter() - t
        after = {"ours": _bytes(f"{root}/ours/objects"), "peer": _bytes(f"{root}/peer/objects")}
        a, _ = await ours_db.query("r", columns=["sensor", "ts"], limit=None)
        b, _ = await peer_db.query("r", columns=["sensor", "ts"], limit=None)
        assert a.num_rows == b.num_rows and a.equals(b), (a.num_rows, b.num_rows)
        assert a.num_rows == n - dropped
        print(f"  {n:,} rows, {dropped:,} reclaimed; ours: GC {ours_s:.2f} s, copied {ours_gc['rows_copied']:,} "
              f"rows, objects {before['ours'] / 1e6:.1f} -> {after['ours'] / 1e6:.1f} MB; peer: deletes "
              f"{peer_delete_s:.2f} s + GC {peer_gc_s:.2f} s, copied {peer_gc['rows_copied']:,} rows, objects "
              f"{before['peer'] / 1e6:.1f} -> {after['peer'] / 1e6:.1f} MB", flush=True)
    finally:
        await ours_db.close()
        await peer_db.close()
    label = (f"reclaim the oldest 30% of {n / 1e6:g}M readings (columnar, offloaded to local disk): a retention + "
             f"one GC pass ({ours_s:.2f} s; {ours_db.gc.totals['retention_segments_dropped']} segments retired unread, "
             f"{ours_gc['rows_copied']:,} rows copied; objects {before['ours'] / 1e6:.1f} -> "
             f"{after['ours'] / 1e6:.1f} MB)")
    peer = (f"the same rows deleted by key, 100k keys a request ({peer_delete_s:.2f} s), + one GC pass "
            f"({peer_gc_s:.2f} s; {peer_gc['rows_copied']:,} rows copied; objects {before['peer'] / 1e6:.1f} -> "
            f"{after['peer'] / 1e6:.1f} MB)")
    extra = {"rows": n, "reclaimed_rows": dropped, "ours_rows_copied": ours_gc["rows_copied"],
             "peer_rows_copied": peer_gc["rows_copied"], "ours_gc_s": ours_s, "peer_delete_s": peer_delete_s,
             "peer_gc_s": peer_gc_s, "objects_before": before, "objects_after": after,
             "ours_segments_dropped": ours_db.gc.totals["retention_segments_dropped"]}
    return [Result(label, 1 / ours_s, peer, 1 / (peer_delete_s + peer_gc_s), "reclaims/s",
                   "report; the drop moves no row", extra)]


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="retention-bench-") as root:
        print(f"retention bench: {SENSORS} sensors x {MINUTES:,} minutes", flush=True)
        results = await run(root)
    print_table("Retention vs deletes by key (in process)", results)
    print(f"\nJSON: {write_json('retention', results)}")
