"""Node benchmark: the HTTP API against the engine in process, and point gets against etcd.

Workloads, peers in the same run, rounds alternating, medians reported:

* **Ingest, Arrow bodies**: batches of 10,000 rows (the table bench's row shape: int64 key,
  timestamp, point, string, float64, int64) sent as Arrow IPC streams to ``POST
  /v1/tables/{t}/rows`` of a real ``terrascale node run`` process, one batch in flight —
  against ``Database.upsert`` of the same batches in this process, on a node opened with
  the same configuration (``node.daemon.Node``, same stores, same jobs). Target >= 50%.
  Also with 4 batches in flight on both sides.
* **Ingest, JSON bodies**: the same batches as ``{"rows": [...]}`` (bodies serialized
  before the clock starts, so the client's JSON encoding is not counted), against the
  same in-process rate.
* **Point gets**: 16 concurrent keep-alive clients (aiohttp, in this process) doing ``GET
  /v1/tables/{t}/rows/{key}`` for random keys of a 100,000-row table — against etcd's v3
  HTTP/JSON gateway (``POST /v3/kv/range``) serving the same number of keys with values
  of the same size (one etcd member on loopback, Debian ``etcd-server``, installed with
  apt-get when missing). Requests/s, p50 and p99. Ours are served by the node from its own
  state, so the like-for-like peer is etcd's ``serializable`` range (from its member's state,
  no ReadIndex round); target: ahead of it. etcd's default linearizable range is measured
  beside it (report only).

* **Point writes** (RFC 0008): single-row JSON upserts from 1, 8, 64 and 256
  keep-alive clients, single-key deletes and 10-row upserts from 64 — against etcd's put /
  delete-range / txn of 10 puts through its JSON gateway (1 member, fsync per commit),
  each case ours then etcd: rows/s, p50 and p99. Targets: >= 2x etcd at 64 and 256
  clients, p99 <= etcd's, p50 <= 1 ms at 1 client. ``python -m bench node_points`` runs
  only these.

The client shares the machine (2 cores here) with the server in every case, so absolute
numbers are low; the ratios compare like with like.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from bench.common import Result, print_table, write_json
from bench.http_load import PointPeers, b64, post, write_load
from bench.ports import free_port
from bench.raft_bench import ensure_etcd
from node.wire import table_to_rows, write_arrow_stream
from node.config import defaults

BATCH_ROWS = 10_000
BATCHES = int(os.environ.get("NODE_BENCH_BATCHES", "30"))
ROUNDS = int(os.environ.get("NODE_BENCH_ROUNDS", "3"))
GET_KEYS = 100_000
GET_CLIENTS = 16
GET_SECONDS = float(os.environ.get("NODE_BENCH_GET_SECONDS", "5"))
SCHEMA = "id int64 primary key, ts timestamp, loc point, name string, v float64, n int64"
ARROW = "application/vnd.apache.arrow.stream"


def batch(start: int, n: int = BATCH_ROWS) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    return pa.table({
        "id": ids, "ts": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
        "loc": pa.StructArray.from_arrays([pa.array(rng.uniform(0, 100, n)), pa.array(rng.uniform(0, 100, n))],
                                          names=["x", "y"]),
        "name": pa.array([f"name-{i % 13}" for i in ids.tolist()]),
        "v": pa.array(rng.uniform(-50, 50, n)), "n": pa.array(ids % 17, pa.int64()),
    })


def _json_body(t: pa.Table) -> bytes:
    return json.dumps({"rows": table_to_rows(t)}).encode()


class NodeProcess:
    def __init__(self, root: str):
        os.makedirs(root, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cli = os.path.join(os.path.dirname(sys.executable), "terrascale")
        self.log = open(os.path.join(root, "node.log"), "w")
        self.proc = subprocess.Popen([cli, "node", "run", "--data-dir", os.path.join(root, "node"),
                                      "--listen", f"127.0.0.1:{self.port}"], stderr=self.log,
                                     stdout=subprocess.DEVNULL)

    async def wait_ready(self, http) -> None:
        for _ in range(600):
            try:
                async with http.get(self.url + "/readyz") as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("node did not become ready")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


async def _run_batches(send, n: int, inflight: int) -> float:
    """rows/s of ``send(i)`` for i in 0..n-1 with ``inflight`` at a time (in order per worker)."""
    nxt = iter(range(n))

    async def worker():
        for i in nxt:
            await send(i)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(inflight)])
    return n * BATCH_ROWS / (time.perf_counter() - t0)


async def ingest(root: str) -> list[Result]:
    import aiohttp

    from node.daemon.lifecycle import Node

    tables = [batch(i * BATCH_ROWS) for i in range(BATCHES)]
    arrow = [write_arrow_stream(t) for t in tables]
    jsons = await asyncio.to_thread(lambda: [_json_body(t) for t in tables])
    local = Node(defaults(os.path.join(root, "inproc")))
    await local.open()
    server = NodeProcess(root)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600))
    got: dict[str, list[float]] = {k: [] for k in ("inproc1", "http1", "json1", "inproc4", "http4")}
    try:
        await server.wait_ready(http)
        for rnd in range(ROUNDS):
            for kind in got:
                name = f"{kind}_{rnd}"
                if kind.startswith("inproc"):
                    await local.db.create_table(name, SCHEMA)
                    rate = await _run_batches(lambda i, n=name: local.db.upsert(n, tables[i]), BATCHES, int(kind[-1]))
                else:
                    await post(http, server.url + "/v1/tables", json.dumps({
                        "name": name, "primary_key": "id",
                        "columns": [{"name": c.split()[0], "type": c.split()[1]} for c in SCHEMA.split(", ")]}
                    ).encode(), "application/json")
                    bodies, ctype = (jsons, "application/json") if kind.startswith("json") else (arrow, ARROW)
                    url = f"{server.url}/v1/tables/{name}/rows"
                    rate = await _run_batches(lambda i, u=url, b=bodies, c=ctype: post(http, u, b[i], c), BATCHES,
                                              int(kind[-1]))
                got[kind].append(rate)
                print(f"  round {rnd} {kind}: {rate:,.0f} rows/s", flush=True)
    finally:
        await http.close()
        server.close()
        await local.close()
    med = {k: statistics.median(v) for k, v in got.items()}
    rounds = {k: [round(x) for x in v] for k, v in got.items()}
    return [
        Result("ingest over HTTP, Arrow bodies, 10k-row batches, 1 in flight", med["http1"],
               "Database.upsert in process, same batches", med["inproc1"], "rows/s", ">= 0.5x",
               {"rounds_http": rounds["http1"], "rounds_inproc": rounds["inproc1"]}),
        Result("ingest over HTTP, Arrow bodies, 10k-row batches, 4 in flight", med["http4"],
               "Database.upsert in process, 4 in flight", med["inproc4"], "rows/s", ">= 0.5x",
               {"rounds_http": rounds["http4"], "rounds_inproc": rounds["inproc4"]}),
        Result("ingest over HTTP, JSON bodies, 10k-row batches, 1 in flight", med["json1"],
               "Database.upsert in process, same batches", med["inproc1"], "rows/s", "report",
               {"rounds_http": rounds["json1"], "rounds_inproc": rounds["inproc1"]}),
    ]


async def _get_load(http, url_of, method: str, body_of, seconds: float) -> dict:
    """GET_CLIENTS workers with keep-alive for ``seconds``: req/s, p50/p99 in µs."""
    lat: list[int] = []
    stop = time.perf_counter() + seconds
    rng = random.Random(1)

    async def worker():
        while time.perf_counter() < stop:
            k = rng.randrange(GET_KEYS)
            t0 = time.perf_counter_ns()
            async with http.request(method, url_of(k), data=body_of(k)) as r:
                payload = await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{r.status} {payload[:200]!r}")
            lat.append(time.perf_counter_ns() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(GET_CLIENTS)])
    took = time.perf_counter() - t0
    lat.sort()
    return {"req_s": len(lat) / took, "p50_us": lat[len(lat) // 2] / 1000, "p99_us": lat[int(len(lat) * 0.99)] / 1000}


class EtcdOne:
    def __init__(self, root: str):
        binary = ensure_etcd()
        cp, pp = free_port(), free_port()
        self.url = f"http://127.0.0.1:{cp}"
        self.proc = subprocess.Popen(
            [binary, "--name", "e0", "--data-dir", os.path.join(root, "etcd"), "--listen-client-urls", self.url,
             "--advertise-client-urls", self.url, "--listen-peer-urls", f"http://127.0.0.1:{pp}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{pp}",
             "--initial-cluster", f"e0=http://127.0.0.1:{pp}", "--log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def open(self, http) -> None:
        for _ in range(300):
            try:
                async with http.get(self.url + "/health") as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("etcd did not become healthy")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


async def point_gets(root: str) -> list[Result]:
    import aiohttp

    server, etcd = NodeProcess(root), EtcdOne(root)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=GET_CLIENTS),
                                 timeout=aiohttp.ClientTimeout(total=600))
    got: dict[str, list[dict]] = {"ours": [], "etcd": [], "etcd_lin": []}
    try:
        await server.wait_ready(http)
        await etcd.open(http)
        await post(http, server.url + "/v1/tables", json.dumps({
            "name": "g", "primary_key": "id",
            "columns": [{"name": c.split()[0], "type": c.split()[1]} for c in SCHEMA.split(", ")]}).encode(),
            "application/json")
        sample_row = None
        for start in range(0, GET_KEYS, BATCH_ROWS):
            t = batch(start)
            await post(http, server.url + "/v1/tables/g/rows", write_arrow_stream(t), ARROW)
            if sample_row is None:
                sample_row = json.dumps(table_to_rows(t.slice(0, 1))[0]).encode()
        async with http.post(server.url + "/v1/admin/checkpoint") as r:
            await r.read()
        value = b64(sample_row)  # etcd values as big as our JSON row
        for start in range(0, GET_KEYS, 128):  # etcd's default --max-txn-ops is 128
            ops = [{"request_put": {"key": b64(f"k{k:08d}".encode()), "value": value}}
                   for k in range(start, min(start + 128, GET_KEYS))]
            await post(http, etcd.url + "/v3/kv/txn", json.dumps({"success": ops}).encode(), "application/json")
        ours = (lambda k: f"{server.url}/v1/tables/g/rows/{k}", "GET", lambda k: None)
        theirs = (lambda k: f"{etcd.url}/v3/kv/range", "POST",
                  lambda k: json.dumps({"key": b64(f"k{k:08d}".encode()), "serializable": True}).encode())
        linearizable = (lambda k: f"{etcd.url}/v3/kv/range", "POST",
                        lambda k: json.dumps({"key": b64(f"k{k:08d}".encode())}).encode())
        for rnd in range(ROUNDS):
            for who, (url_of, method, body_of) in (("ours", ours), ("etcd", theirs), ("etcd_lin", linearizable)):
                st = await _get_load(http, url_of, method, body_of, GET_SECONDS)
                got[who].append(st)
                print(f"  round {rnd} {who}: {st['req_s']:,.0f} req/s p50 {st['p50_us']:,.0f} us "
                      f"p99 {st['p99_us']:,.0f} us", flush=True)
    finally:
        await http.close()
        server.close()
        etcd.close()

    def med(who, k):
        return statistics.median(x[k] for x in got[who])

    peer = f"etcd v3 JSON gateway, 1 member, {GET_KEYS:,} keys, serializable range (from its own state, as ours)"
    lin = f"etcd v3 JSON gateway, 1 member, {GET_KEYS:,} keys, linearizable range (its default)"
    return [
        Result(f"point gets over HTTP, {GET_CLIENTS} keep-alive clients", med("ours", "req_s"), peer,
               med("etcd", "req_s"), "req/s", "> 1.0x", {k: [round(x["req_s"]) for x in v] for k, v in got.items()}),
        Result("point get p50", med("ours", "p50_us"), peer, med("etcd", "p50_us"), "us", "report"),
        Result("point get p99", med("ours", "p99_us"), peer, med("etcd", "p99_us"), "us", "report"),
        Result(f"point gets over HTTP, {GET_CLIENTS} keep-alive clients", med("ours", "req_s"), lin,
               med("etcd_lin", "req_s"), "req/s", "report"),
    ]


# -- point writes: single-row upserts from many clients, against etcd put -------------

PW_CLIENTS = tuple(int(x) for x in os.environ.get("NODE_BENCH_PW_CLIENTS", "1,8,64,256").split(","))
PW_SECONDS = float(os.environ.get("NODE_BENCH_PW_SECONDS", "4"))
PW_BATCH = 10  # rows per request of the batched case (64 clients)


async def fsyncs(http, url: str, name: str) -> float:
    """The sum of the samples of metric ``name`` at ``url``/metrics (0.0 when absent)."""
    async with http.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.split("{")[0].split(" ")[0] == name)


# fdatasyncs by side: the node's log device (RFC 0011) and the open active files' own flushes on
def cpu_seconds(pid: int) -> float:
    """User + system CPU a process used so far (every thread), from /proc: what a request
    costs the server, which this shared machine's load moves far less than requests/s."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# a device without one; etcd's WAL fsyncs
SYNC_METRIC = {"ours": "terrascale_device_fdatasyncs", "etcd": "etcd_disk_wal_fsync_duration_seconds_count"}


async def point_writes(root: str) -> list[Result]:
    """Single-row JSON upserts from 1..256 clients, single-key deletes and 10-row batches
    from 64 clients, against etcd (1 member, fsync per commit), each case ours then etcd."""
    import aiohttp

    server, etcd = NodeProcess(root), EtcdOne(root)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600))
    cases = [(f"upsert {c}", c) for c in PW_CLIENTS] + [("delete 64", 64), ("batch10 64", 64)]
    got: dict = {}
    try:
        await server.wait_ready(http)
        await etcd.open(http)
        peers = PointPeers(http, server.url, etcd.url)
        cols = [{"name": c.split()[0], "type": c.split()[1]} for c in SCHEMA.split(", ")]
        await post(http, server.url + "/v1/tables", json.dumps({"name": "pw", "primary_key": "id",
                                                                 "columns": cols}).encode(), "application/json")
        for n, (case, clients) in enumerate(cases):
            kind = case.split()[0]
            base = n << 40  # each case writes its own ids (deletes take the previous case's)
            ours = {"upsert": peers.upsert("pw", base), "delete": peers.delete("pw", base - (1 << 40)),
                    "batch10": peers.upsert("pw", base, PW_BATCH)}[kind]
            theirs = {"upsert": peers.put(f"c{n}/"), "delete": peers.delete_range(f"c{n - 1}/"),
                      "batch10": peers.put(f"c{n}/", PW_BATCH)}[kind]
            for who, send in (("ours", ours), ("etcd", theirs)):
                url = server.url if who == "ours" else etcd.url
                pid = (server if who == "ours" else etcd).proc.pid
                before, cpu0 = await fsyncs(http, url, SYNC_METRIC[who]), cpu_seconds(pid)
                st = await write_load(http, clients, PW_SECONDS, send)
                st["rows_s"] = st["req_s"] * (PW_BATCH if kind == "batch10" else 1)
                st["cpu_us"] = (cpu_seconds(pid) - cpu0) * 1e6 / max(st["requests"], 1)
                st["syncs_per_req"] = (await fsyncs(http, url, SYNC_METRIC[who]) - before) / max(st["requests"], 1)
                got[(case, who)] = st
                print(f"  {case:>12} {who}: {st['rows_s']:>9,.0f} rows/s  p50 {st['p50_us']:>8,.0f} us  "
                      f"p99 {st['p99_us']:>8,.0f} us  {st['syncs_per_req']:.2f} fdatasyncs/request  "
                      f"{st['cpu_us']:,.0f} us CPU/request", flush=True)
    finally:
        await http.close()
        server.close()
        etcd.close()
    peer = "etcd 3.4 via its JSON gateway, 1 member"
    out = []
    for case, clients in cases:
        kind = case.split()[0]
        what = {"upsert": f"single-row JSON upserts, {clients} clients",
                "delete": f"single-key deletes, {clients} clients",
                "batch10": f"10-row JSON upserts, {clients} clients"}[kind]
        o, e = got[(case, "ours")], got[(case, "etcd")]
        target = ">= 2.0x" if kind == "upsert" and clients >= 64 else "report"
        out.append(Result(f"{what} (fdatasyncs per request: ours {o['syncs_per_req']:.2f}, "
                          f"etcd {e['syncs_per_req']:.2f}; server CPU per request: ours {o['cpu_us']:,.0f} us, "
                          f"etcd {e['cpu_us']:,.0f} us)", o["rows_s"],
                          peer + (" (txn of 10 puts)" if kind == "batch10" else ""), e["rows_s"], "rows/s", target,
                          extra={"syncs_per_req": o["syncs_per_req"], "peer_syncs_per_req": e["syncs_per_req"],
                                 "cpu_us_per_req": o["cpu_us"], "peer_cpu_us_per_req": e["cpu_us"]}))
        tgt50 = "<= 1 ms" if kind == "upsert" and clients == 1 else "report"
        out.append(Result(f"  p50, {what}", o["p50_us"], peer, e["p50_us"], "us", tgt50))
        out.append(Result(f"  p99, {what}", o["p99_us"], peer, e["p99_us"], "us",
                          "<= 1.0x" if kind == "upsert" else "report"))
    return out


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="node-bench-") as root:
        print("node bench: ingest (HTTP Arrow / HTTP JSON / in process)", flush=True)
        results = await ingest(os.path.join(root, "ingest"))
        print("node bench: point gets (ours vs etcd)", flush=True)
        results += await point_gets(os.path.join(root, "gets"))
        print("node bench: point writes (ours vs etcd put)", flush=True)
        results += await point_writes(os.path.join(root, "writes"))
    print_table("Node: HTTP API vs in-process engine and etcd", results)
    print(f"\nJSON: {write_json('node', results)}")


async def main_points() -> None:
    """Only the point-write workloads (``python -m bench node_points``)."""
    with tempfile.TemporaryDirectory(prefix="node-bench-") as root:
        results = await point_writes(os.path.join(root, "writes"))
    print_table("Node: point writes vs etcd", results)
    print(f"\nJSON: {write_json('node_points', results)}")
