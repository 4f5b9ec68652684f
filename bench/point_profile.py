"""Where a single-row write's time goes (docs/rfcs/0008-point-writes.md).

Starts a real ``terrascale node run``, drives it with N keep-alive clients doing single-row
JSON upserts (the point-write bench's rows), and samples the node with py-spy (``--idle``
off, so only on-CPU time counts; ``--gil``-free: every thread). The stacks are bucketed into
the stages of the write path by the innermost frame that names one, and printed as a table
of shares of the node's CPU samples::

    python -m bench.point_profile [--clients 64] [--seconds 8] [--flame out.svg]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.http_load import PointPeers, post, write_load
from bench.node_bench import SCHEMA, NodeProcess

# (stage, substrings of "function (file)" that mark it) — the innermost (deepest) match wins
STAGES = [
    ("HTTP: aiohttp parse/respond, loop", ("aiohttp", "asyncio/", "selectors.py", "uvloop")),
    ("edge: middleware, metrics, routing", ("node/http/api.py", "node/metrics.py", "prometheus_client")),
    ("JSON parse", ("json/decoder.py", "json/__init__.py:loads", "loads (json")),
    ("JSON -> Arrow (rows_to_table)", ("node/wire.py",)),
    ("coalescing", ("node/http/coalesce.py",)),
    ("fast path encode", ("node/http/fast_encoder.py",)),
    ("conform / keys / partition", ("rowstore/tables/conform.py", "rowstore/tables/key_check.py",
                                    "rowstore/tables/keys.py", "key_memtable.py:encode_keys")),
    ("encode + split (rowcodec)", ("rowstore/codec/rows.py", "rowstore/codec/kernels.py")),
    ("commit: timeline, locks, append", ("rowstore/db/write/committer.py", "rowstore/db/write/two_phase.py",
                                         "rowstore/db/database.py",
                                         "rowstore/timeline.py", "rowstore/hlc.py",
                                         "rowstore/db/partition.py:append", "rowstore/segments/active.py",
                                         "rowstore/segments/wal.py",
                                         "rowstore/segments/store.py")),
    ("group commit, blocks, fdatasync", ("terrafs/active.py", "terrafs/blocks.py", "terrafs/iopool.py",
                                         "fdatasync", "pwritev")),
    ("apply: key + column index", ("rowstore/db/partition.py:apply", "rowstore/index/key_memtable.py",
                                   "rowstore/index/key_index.py", "rowstore/index/column_index.py",
                                   "rowstore/index/column_structures.py")),
    ("catalog", ("catalog/",)),
    ("pyarrow / numpy / numba internals", ("pyarrow", "numpy", "numba")),
]


def _stage(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, marks in STAGES[1:]:
            if any(m in frame for m in marks):
                return name
    for frame in reversed(frames):
        if any(m in frame for m in STAGES[0][1]):
            return STAGES[0][0]
    return "other (threads idle in C, GC, interpreter)"


def breakdown(collapsed: str) -> list[tuple[str, int]]:
    counts: collections.Counter = collections.Counter()
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[_stage(stack)] += int(n)
    return counts.most_common()


async def run(clients: int, seconds: float, flame: str | None) -> None:
    import aiohttp

    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    with tempfile.TemporaryDirectory(prefix="point-profile-") as root:
        server = NodeProcess(root)
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        try:
            await server.wait_ready(http)
            cols = [{"name": c.split()[0], "type": c.split()[1]} for c in SCHEMA.split(", ")]
            await post(http, server.url + "/v1/tables", __import__("json").dumps(
                {"name": "pw", "primary_key": "id", "columns": cols}).encode(), "application/json")
            peers = PointPeers(http, server.url, "")
            await write_load(http, clients, 1.0, peers.upsert("pw", 1 << 40))  # warm up
            out = os.path.join(root, "stacks.txt")
            rec = subprocess.Popen([spy, "record", "--pid", str(server.proc.pid), "--duration", str(int(seconds)),
                                    "--rate", str(RATE), "--format", "raw", "--output", out, "--threads",
                                    "--nonblocking"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            async with http.get(server.url + "/metrics") as r:
                before = _counters(await r.text())
            c0, n0 = time.process_time(), _cpu_seconds(server.proc.pid)
            st = await write_load(http, clients, seconds, peers.upsert("pw", 2 << 40))
            st["client_cpu"] = (time.process_time() - c0) / seconds
            st["node_cpu"] = (_cpu_seconds(server.proc.pid) - n0) / seconds
            await asyncio.to_thread(rec.wait)
            async with http.get(server.url + "/metrics") as r:
                counters = _counters(await r.text())
            if flame:
                shutil.copy(out, flame)
            text = open(out).read()
        finally:
            await http.close()
            server.close()
    main, others = _by_thread(text)
    rows = breakdown(main)
    total = sum(n for _, n in rows) or 1
    reqs = st["req_s"] * seconds
    print(f"\n{clients} clients, {seconds:.0f} s: {st['req_s']:,.0f} req/s, p50 {st['p50_us']:,.0f} us, "
          f"p99 {st['p99_us']:,.0f} us; CPU (cores, py-spy's own share included): node {st['node_cpu']:.2f}, "
          f"this client {st['client_cpu']:.2f}")
    print(f"event-loop thread busy {100 * total / (RATE * seconds):.0f}% of the run "
          f"({1e6 * total / RATE / reqs:.0f} µs of loop CPU per request); other threads: "
          f"{', '.join(f'{k} {100 * v / (RATE * seconds):.0f}%' for k, v in others.most_common(4))}\n")
    _print_counters(counters, before)
    print("| stage (event-loop thread) | share | µs per request |")
    print("| --- | ---: | ---: |")
    for name, n in rows:
        print(f"| {name} | {100 * n / total:.1f}% | {1e6 * n / RATE / reqs:.0f} |")


RATE = 250  # samples per second


_COUNTERS = ("terrascale_write_requests_total", "terrascale_write_group_requests_sum",
             "terrascale_write_group_requests_count", "terrascale_write_queue_seconds_total",
             "terrascale_write_stage_seconds_total", "terrascale_flushes", "terrascale_flush_appends",
             "terrascale_flush_seconds", "terrascale_flush_wait_seconds")


def _counters(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(_COUNTERS):
            name, _, v = line.rpartition(" ")
            out[name] = float(v)
    return out


def _print_counters(c: dict, before: dict) -> None:
    """The node's own per-stage counters over the measured run."""
    d = {k: v - before.get(k, 0.0) for k, v in c.items()}
    groups = d.get("terrascale_write_group_requests_count", 0)
    reqs = d.get("terrascale_write_group_requests_sum", 0)
    print("node counters over the run:")
    for k, v in sorted(d.items()):
        print(f"  {k} = {v:,.4f}")
    if groups:
        commit = d.get('terrascale_write_stage_seconds_total{stage="commit"}', 0)
        print(f"  => {reqs / groups:.1f} requests per group, {1e3 * commit / groups:.2f} ms per group commit, "
              f"{1e6 * d.get('terrascale_write_queue_seconds_total', 0) / reqs:.0f} µs queued per request")
    if d.get("terrascale_flushes"):
        print(f"  => {d.get('terrascale_flush_appends', 0) / d['terrascale_flushes']:.1f} appends per flush, "
              f"{1e3 * d.get('terrascale_flush_seconds', 0) / d['terrascale_flushes']:.2f} ms per flush "
              "(write + fdatasync)")
    print()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _by_thread(text: str) -> tuple[str, collections.Counter]:
    """The event-loop thread's stacks (py-spy --threads puts the thread first) and the
    other threads' busy samples, by thread-name prefix."""
    main, others = [], collections.Counter()
    for line in text.splitlines():
        thread, _, rest = line.partition(";")
        if "MainThread" in thread:
            main.append(rest)
        else:
            others[thread.rsplit(": ", 1)[-1].rstrip(")").rstrip("_0123456789")] += int(line.rpartition(" ")[2])
    return "\n".join(main), others


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--flame", help="also keep the raw collapsed stacks here")
    a = ap.parse_args(argv)
    asyncio.run(run(a.clients, a.seconds, a.flame))


if __name__ == "__main__":
    main()
