"""What one durable group costs on this machine's disk, by how it is made durable — the
measurements behind RFC 0011 (one durable flush per node per group).

A *round* is what a node must make durable at one moment: one small group (``BENCH_SYNC_BYTES``,
default 512 bytes: a few single-row writes) for each of ``N`` partition logs (1, 8, 24: one table's
8 partitions led, or 8 led and 16 followed with R = 3). Each round is timed from the first write
to the moment every group is durable; the median and p99 over ``BENCH_SYNC_ROUNDS`` rounds count:

* **per-file** (today): each log is its own preallocated file; each group is a ``pwrite`` and
  an ``fdatasync`` of that file, the ``N`` of them concurrently on ``N`` threads (as the flush
  loops of ``N`` active files do today through the I/O pool);
* **journal**: the ``N`` groups are written into their files with no sync, and the same bytes
  go into one preallocated node-wide journal file with one ``pwrite`` and one ``fdatasync``;
* **device**: every log is a set of extents of one preallocated node-wide device file; the
  ``N`` groups are ``pwrite``s into their logs' extents and one ``fdatasync`` of the device
  makes them all durable (no second copy); **device+header** also rewrites each log's extent
  header (its ``used``) with the group, as the log device does today (a second page per log);
* **syncfs**: the ``N`` groups are written into their files, then one ``syncfs`` of the
  filesystem (flushes every dirty page of it, other processes' too: a device of its own only).

The peer of every row is the per-file way of the same round: the ratio is how much faster a
round becomes. Files live in ``BENCH_SYNC_DIR`` (default: a temporary folder on the disk that
holds the repository, which is where ``make run`` keeps a node's data).
"""
from __future__ import annotations

import ctypes
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from bench.common import Result, print_table, write_json

PREALLOC = 16 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _open(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(fd, b"\0" * PREALLOC, 0)  # written zeros: later pwrites stay in place (no metadata)
    os.fsync(fd)
    return fd


def _round(way: str, fds: list[int], journal: int, pool: ThreadPoolExecutor, i: int, data: bytes) -> float:
    """Round ``i``: each log appends ``data`` at its end; the journal appends all of them."""
    size, n = len(data), len(fds)
    off, joff = (i * size) % (PREALLOC - size), (i * size * n) % (PREALLOC - size * n)
    t0 = time.perf_counter()
    if way == "per-file":
        def one(fd):
            os.pwrite(fd, data, off)
            os.fdatasync(fd)
        list(pool.map(one, fds))
    elif way == "journal":
        for fd in fds:
            os.pwrite(fd, data, off)
        os.pwrite(journal, data * n, joff)
        os.fdatasync(journal)
    elif way in ("device", "device+header"):
        region = PREALLOC // n  # one region of the device file per log: its extents
        for k in range(n):
            if way == "device+header":  # the extent header's ``used`` rewritten with each group
                os.pwrite(journal, data[:44], k * region)
            os.pwrite(journal, data, k * region + 4096 + off % (region - size - 4096))
        os.fdatasync(journal)
    else:
        for fd in fds:
            os.pwrite(fd, data, off)
        _syncfs(journal)
    return time.perf_counter() - t0


def measure(n: int, way: str, rounds: int, size: int, where: str) -> list[float]:
    with tempfile.TemporaryDirectory(dir=where) as d:
        fds = [_open(os.path.join(d, f"log{i}")) for i in range(n)]
        journal = _open(os.path.join(d, "journal"))
        data = os.urandom(size)
        try:
            with ThreadPoolExecutor(n) as pool:
                for i in range(5):  # warm the threads and the files' first pages
                    _round(way, fds, journal, pool, i, data)
                return [_round(way, fds, journal, pool, 5 + i, data) for i in range(rounds)]
        finally:
            for fd in [*fds, journal]:
                os.close(fd)


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def main() -> None:
    rounds = int(os.environ.get("BENCH_SYNC_ROUNDS", "300"))
    size = int(os.environ.get("BENCH_SYNC_BYTES", "512"))
    where = os.environ.get("BENCH_SYNC_DIR") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    results = []
    for n in (1, 8, 24):
        base = measure(n, "per-file", rounds, size, where)
        b50 = statistics.median(base) * 1000
        for way in ("per-file", "journal", "device", "device+header", "syncfs"):
            got = base if way == "per-file" else measure(n, way, rounds, size, where)
            m50, m99 = statistics.median(got) * 1000, _p(got, 0.99) * 1000
            # ratio: rounds per second, ours (this way) over the per-file way's
            results.append(Result(f"{n} logs, {size} B each, {way}: p50 {m50:.2f} ms, p99 {m99:.2f} ms",
                                  1000 / m50, "per-file fdatasyncs, same round", 1000 / b50, "rounds/s",
                                  extra={"p50_ms": m50, "p99_ms": m99, "logs": n, "way": way}))
    print_table("One durable round: N small groups made durable (RFC 0011)", results)
    print(f"\n{rounds} rounds per row, files in {where}; wrote {write_json('durability', results)}")
