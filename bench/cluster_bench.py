"""Cluster benchmark: replicated partitions (RFC 0010 §5) on three real node processes.

Three ``terrascale node run`` processes on loopback, one ``raft://`` catalog, the node's
default ``[cluster]`` timings (heartbeat 500 ms, failure_timeout 2 s, ack_timeout 10 s),
8 partitions per table. Every row is a same-run ratio against a named peer:

1. **Ingest, R=3 vs R=1** on the same three nodes: 10k-row batches (the node bench's row
   shape) split by the leader of each row's partition and the pieces posted at once to those
   leaders as Arrow IPC streams (what ``terrascale ingest`` does), 1 and 4 batches in flight;
   bodies encoded before the clock starts; rounds alternate R=1 / R=3, medians. Target ≥ 0.5×.
2. **Single-row write latency, R=3** — one JSON upsert per request to the leader of the key's
   partition, acknowledged once a majority holds it durable — against etcd 3.4 with 3 members
   (started here, fsync on), ``POST /v3/kv/put`` of the same JSON row to its leader through
   the v3 JSON gateway. 1 client (sequential), 16 and 64 concurrent clients, p50 / p99; the same
   requests to an R=1 table in ``extra``.
3. **Failover**: kill -9 of a partition's leader, then one writer retries single-row writes
   to keys of that partition through a surviving node (20 ms after a refusal; every 100 ms
   beside attempts still pending, which may yet be acknowledged) until one is; the
   killed node is restarted and every replica caught up before the next kill. Kills
   alternate, where the placement allows, between a node that does not lead the catalog's
   Raft group and the one that does (then the catalog elects a leader first, and its new
   placement driver watches every node for a whole failure_timeout before it declares one
   dead); after failovers the leaders gather on few nodes (nothing moves them back), so the
   alternation is not always possible. p50 and max over ``CLUSTER_BENCH_KILLS`` kills (10),
   all and by kind. Peer: the same writer against etcd (3 members, its default heartbeat
   100 ms / election 1 s) after kill -9 of its leader, put through a surviving member.
   Target p50 < 3 s.
5. **A returning leader**: kill -9 of a node leading partitions mid-write, writes through the
   new leaders, its restart: MB shipped to it until caught up, against the bytes written while
   it was down (only the suffix it lacks is shipped; the table's unoffloaded log in ``extra``).
6. **The seeded simulation** (``python -m tests.sim``): seeds of 30 virtual seconds (three
   nodes, two partitions, every fault) per wall second, one process, against the rate
   ``make test``'s budget needs (60 seeds within two minutes: 0.5/s) — printed, not kept as a
   row (no peer runs it).
4. **Catch-up**: kill -9 of a node that does not lead the catalog, write
   ``CLUSTER_BENCH_CATCHUP_BATCHES`` (60) 10k-row batches to an R=3 table (every partition
   has it as a replica), restart it and time until every leader reports its position equal
   to the leader's log end (``GET /v1/admin/status`` → ``replication.led``). MB/s of bytes
   shipped to it over the time from its ``/readyz`` to caught up (``extra``: from the first
   position a leader reports, after its retry back-off), against the rate at which the
   leaders wrote those bytes (the write phase, 4 batches in flight).

Knobs (environment): ``CLUSTER_BENCH_QUICK=1`` (one round, 3 kills, 20 catch-up batches),
``CLUSTER_BENCH_ROUNDS``, ``CLUSTER_BENCH_BATCHES``, ``CLUSTER_BENCH_LAT_SECONDS``,
``CLUSTER_BENCH_KILLS``, ``CLUSTER_BENCH_CATCHUP_BATCHES``.

The client, three nodes and etcd share the machine (2 cores here): absolute numbers are
low, the ratios compare like with like. ``python -m bench cluster``.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.cluster_catchup import catch_up, returning_leader
from bench.cluster_failover import failover_etcd, failover_ours, failover_results
from bench.cluster_harness import PARTITIONS, QUICK, Cluster, keys_of, send_batches, split_by_leader
from bench.common import Result, print_table, write_json
from bench.http_load import PointPeers, sensor_row, write_load
from bench.node_bench import BATCH_ROWS, SYNC_METRIC, batch, cpu_seconds, fsyncs
from bench.raft_bench import Etcd

ROUNDS = int(os.environ.get("CLUSTER_BENCH_ROUNDS", "1" if QUICK else "2"))
BATCHES = int(os.environ.get("CLUSTER_BENCH_BATCHES", "20" if QUICK else "30"))
LAT_SECONDS = float(os.environ.get("CLUSTER_BENCH_LAT_SECONDS", "2" if QUICK else "3"))
LAT_CLIENTS = (1, 16, 64)  # the latency part's concurrencies
ETCD3 = "etcd 3.4, 3 members, put via its v3 JSON gateway to the leader (same client)"


# -- 1. ingest ---------------------------------------------------------------------------------------

async def ingest(cl: Cluster) -> list[Result]:
    tables = [batch(i * BATCH_ROWS) for i in range(BATCHES)]
    got: dict[tuple[int, int], list[float]] = collections.defaultdict(list)
    for rnd in range(ROUNDS):
        for inflight in (1, 4):
            for r in (1, 3):
                name = f"ingest_r{r}_f{inflight}_{rnd}"
                leaders = await cl.create(name, r)
                pieces = await asyncio.to_thread(split_by_leader, tables, leaders)
                took = await send_batches(cl, name, pieces, inflight)
                got[(r, inflight)].append(BATCHES * BATCH_ROWS / took)
                print(f"  round {rnd} R={r} {inflight} in flight: {got[(r, inflight)][-1]:,.0f} rows/s", flush=True)
                await cl.drop(name)
    out = []
    for inflight in (1, 4):
        r3, r1 = got[(3, inflight)], got[(1, inflight)]
        out.append(Result(f"ingest, 10k-row Arrow batches split by partition leader (as terrascale ingest), "
                          f"{inflight} in flight, R=3 (majority acks)", statistics.median(r3),
                          "R=1, same 3 nodes, same batches and client", statistics.median(r1), "rows/s", ">= 0.5x",
                          {"rounds_r3": [round(x) for x in r3], "rounds_r1": [round(x) for x in r1]}))
    return out


# -- 2. single-row write latency ---------------------------------------------------------------------

async def latency(cl: Cluster, etcd: Etcd) -> list[Result]:
    leaders = {3: await cl.create("lat_r3", 3), 1: await cl.create("lat_r1", 1)}
    await cl.caught_up()
    e_lead = await etcd.leader()
    peers = PointPeers(cl.http, "", etcd.client[e_lead])
    span = 1 << 18  # distinct keys per case (more than a case writes)

    def ours(r: int, base: int):
        urls = [f"{cl.url(n)}/v1/tables/lat_r{r}/rows" for n in leaders[r]]
        keys, parts = keys_of(PARTITIONS, base, span)
        keys, parts = keys.tolist(), parts.tolist()

        async def send(i: int) -> None:
            j = i % span
            await cl.post(urls[parts[j]], json.dumps({"rows": [sensor_row(keys[j])]}).encode())
        return send

    got: dict = collections.defaultdict(list)
    for rnd in range(ROUNDS):
        for ci, clients in enumerate(LAT_CLIENTS):
            base = (rnd * len(LAT_CLIENTS) + ci) * span
            sides = {"r3": ours(3, base), "r1": ours(1, base), "etcd": peers.put(f"r{rnd}c{clients}/")}
            for who, send in sides.items():
                urls = etcd.client if who == "etcd" else [cl.url(n.node_id) for n in cl.live()]
                pids = [p.pid for p in etcd.procs] if who == "etcd" else [n.proc.pid for n in cl.live()]
                before = await _syncs(cl.http, urls, SYNC_METRIC["etcd" if who == "etcd" else "ours"])
                cpu0 = sum(cpu_seconds(p) for p in pids)
                st = await write_load(cl.http, clients, LAT_SECONDS, send)
                n = max(st["requests"], 1)
                st["cpu_us"] = (sum(cpu_seconds(p) for p in pids) - cpu0) * 1e6 / n  # every member's CPU
                st["syncs_per_req"] = (await _syncs(cl.http, urls, SYNC_METRIC["etcd" if who == "etcd" else "ours"])
                                       - before) / n
                got[(who, clients)].append(st)
                print(f"  round {rnd} {who:>4} {clients:>2} clients: {st['req_s']:>7,.0f} req/s  p50 "
                      f"{st['p50_us']:>7,.0f} us  p99 {st['p99_us']:>8,.0f} us  "
                      f"{st['syncs_per_req']:.2f} fdatasyncs/request, {st['cpu_us']:,.0f} us CPU/request "
                      "(all members)", flush=True)
    await cl.drop("lat_r3")
    await cl.drop("lat_r1")

    def med(who, clients, k):
        return statistics.median(x[k] for x in got[(who, clients)])

    out = []
    for clients in LAT_CLIENTS:
        what = "1 client, sequential" if clients == 1 else f"{clients} concurrent clients"
        for q in ("p50", "p99"):
            k = f"{q}_us"
            out.append(Result(f"single-row JSON upsert to its partition's leader, R=3 ack, {what}: {q}",
                              med("r3", clients, k), ETCD3, med("etcd", clients, k), "us", "report (latency)",
                              {"r1": round(med("r1", clients, k)),
                               "rounds_r3": [round(x[k]) for x in got[("r3", clients)]],
                               "rounds_etcd": [round(x[k]) for x in got[("etcd", clients)]]}))
        o_s, e_s = med("r3", clients, "syncs_per_req"), med("etcd", clients, "syncs_per_req")
        o_c, e_c = med("r3", clients, "cpu_us"), med("etcd", clients, "cpu_us")
        out.append(Result(f"single-row JSON upsert, R=3, {what}: writes/s (per request, all members: fdatasyncs "
                          f"ours {o_s:.2f}, etcd {e_s:.2f}; CPU ours {o_c:,.0f} us, etcd {e_c:,.0f} us)",
                          med("r3", clients, "req_s"), ETCD3, med("etcd", clients, "req_s"), "req/s", "report",
                          {"r1": round(med("r1", clients, "req_s")), "syncs_per_req": o_s, "peer_syncs_per_req": e_s,
                           "cpu_us_per_req": o_c, "peer_cpu_us_per_req": e_c,
                           "r1_cpu_us_per_req": med("r1", clients, "cpu_us")}))
    return out


async def _syncs(http, urls: list[str], name: str) -> float:
    """fdatasyncs so far summed over the members at ``urls`` (a member that does not answer: 0)."""
    total = 0.0
    for u in urls:
        try:
            total += await fsyncs(http, u, name)
        except OSError:
            pass
    return total


# -- 6. the seeded simulation ------------------------------------------------------------------------

def simulation() -> None:
    """Printed, not kept: no peer runs this simulation, so it is no comparison row (a
    constant as its "peer" made a ratio that compared nothing; make test's budget is a test's
    concern, not a benchmark's)."""
    import re
    import subprocess
    import sys

    seeds = "0-19" if QUICK else "0-59"
    out = subprocess.run([sys.executable, "-m", "tests.sim", "--seeds", seeds], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}, cwd=Path(__file__).resolve().parent.parent)
    m = re.search(r"(\d+) seeds in ([\d.]+) s \(([\d.]+) seeds/s\): (\d+) failed", out.stdout)
    if m is None or out.returncode != 0:
        raise RuntimeError(f"the simulation failed: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    print(f"  simulation: {m.group(1)} seeds in {m.group(2)} s ({float(m.group(3)):.2f} seeds/s)", flush=True)


# -- the run -----------------------------------------------------------------------------------------

async def run(root: str) -> list[Result]:
    cl = Cluster(Path(root) / "nodes")
    etcd = None
    try:
        print("cluster bench: starting 3 nodes", flush=True)
        await cl.open()
        print("cluster bench: ingest R=3 vs R=1", flush=True)
        results = await ingest(cl)
        etcd = Etcd(os.path.join(root, "etcd"))
        await etcd.open()
        print("cluster bench: single-row write latency, R=3 vs etcd put", flush=True)
        results += await latency(cl, etcd)
        print("cluster bench: catch-up of a restarted node", flush=True)
        results += await catch_up(cl)
        print("cluster bench: failover, ours", flush=True)
        ours = await failover_ours(cl)
        print("cluster bench: failover, etcd", flush=True)
        theirs = await failover_etcd(etcd, cl.http)
        results += failover_results(ours, theirs)
        print("cluster bench: a returning leader", flush=True)
        results += await returning_leader(cl)
    finally:
        await cl.close()
        if etcd is not None:
            await etcd.close()
    return results


async def main() -> list[Result]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cluster-bench-", dir=os.environ.get("BENCH_DIR")) as root:
        results = await run(root)
    print("cluster bench: the seeded simulation", flush=True)
    simulation()  # after the nodes are gone: it has the machine to itself
    print_table("Cluster: replicated partitions on 3 nodes (RFC 0010 §5)", results)
    print(f"\nJSON: {write_json('cluster', results)}  ({time.perf_counter() - t0:.0f} s)")
    return results


if __name__ == "__main__":
    asyncio.run(main())
