"""Subscriptions (docs/rfcs/0015-subscriptions.md) against etcd's watch, in the same run.

* Delivery latency, write sent -> change received by a subscriber, p50 and p99, at 1,000 and
  10,000 rows/s of writes (requests of 10 rows, paced), with 1 and 100 subscribers
  (WebSockets; one subscriber's frames parsed and timed, the others drained unparsed, since
  the harness shares the machine) — against etcd's watch of the same writes (a txn of 10 puts
  per request, its v3 JSON gateway's streaming ``/v3/watch`` on the key prefix; put sent ->
  event received). Measured from the send, not the acknowledgement: a subscriber in the same
  process often reads the change before the writer has read its answer. Target: p99 <= etcd's.
* Writers' throughput (4 writers, 100-row requests, as fast as they go) with 100 subscribers
  connected against none, three runs of each alternated, medians. Target: >= 0.8x.

Everything (node, etcd, writers, subscribers) shares the machine; ``SUBSCRIBE_BENCH_SECONDS``
sets each run's length (default 5).
"""
from __future__ import annotations

import asyncio
import base64
import json
import os
import tempfile
import time

import numpy as np

from bench.common import Result, print_table, write_json
from bench.node_bench import EtcdOne, NodeProcess

SECONDS = float(os.environ.get("SUBSCRIBE_BENCH_SECONDS", "5"))
ROWS = 10  # rows per paced write request


async def _post(http, url: str, doc: dict) -> dict:
    async with http.post(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}) as r:
        body = await r.read()
        if r.status >= 300:
            raise RuntimeError(f"{url}: {r.status} {body[:200]!r}")
        out: dict = json.loads(body)
        return out


async def _paced(rate: int, send) -> None:
    """``send(k)`` for request k at ``k * ROWS / rate`` seconds, for SECONDS, 16 in flight at most."""
    n = int(rate * SECONDS / ROWS)
    t0 = time.perf_counter()
    gate = asyncio.Semaphore(16)

    async def one(k: int) -> None:
        async with gate:
            await send(k)
    tasks = []
    for k in range(n):
        delay = t0 + k * ROWS / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(k)))
    await asyncio.gather(*tasks)


def _percentiles(lat: list[float]) -> tuple[float, float]:
    a = np.array(lat) * 1000
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


async def _ours(http, url: str, rate: int, subscribers: int) -> tuple[list[float], list[float]]:
    """Delivery latencies (send -> change received) and the writes' own (send -> answer)."""
    acked: dict[int, float] = {}
    answered: list[float] = []
    received: list[dict[int, float]] = [{}]
    socks = [await http.ws_connect(url + "/v1/tables/s/subscribe", max_msg_size=1 << 26) for _ in range(subscribers)]

    async def read(i: int, ws) -> None:
        async for msg in ws:
            if i:  # the others drain their frames unparsed: the harness shares the machine
                continue
            doc = json.loads(msg.data)
            if isinstance(doc, list):
                now = time.perf_counter()
                for ch in doc:
                    received[i].setdefault(ch["commit_ts"], now)
    readers = [asyncio.ensure_future(read(i, ws)) for i, ws in enumerate(socks)]

    async def send(k: int) -> None:
        rows = [{"id": (k * ROWS + j) % 100_000, "v": float(k)} for j in range(ROWS)]
        t0 = time.perf_counter()
        ts = (await _post(http, url + "/v1/tables/s/rows", {"rows": rows}))["commit_ts"]
        acked[ts] = t0
        answered.append(time.perf_counter() - t0)
    await _paced(rate, send)
    await asyncio.sleep(1.0)
    for ws in socks:
        await ws.close()
    await asyncio.gather(*readers, return_exceptions=True)
    return [received[0][ts] - at for ts, at in acked.items() if ts in received[0]], answered


async def _etcd(http, url: str, rate: int, watchers: int) -> list[float]:
    acked: dict[int, float] = {}  # revision -> put acknowledged
    received: list[dict[int, float]] = [{}]
    key, end = base64.b64encode(b"s/").decode(), base64.b64encode(b"s0").decode()

    async def watch(i: int) -> None:
        doc = {"create_request": {"key": key, "range_end": end}}
        async with http.post(url + "/v3/watch", data=json.dumps(doc).encode()) as r:
            async for line in r.content:
                if i:
                    continue
                now = time.perf_counter()
                for ev in json.loads(line).get("result", {}).get("events", []):
                    received[i].setdefault(int(ev["kv"]["mod_revision"]), now)
    watching = [asyncio.ensure_future(watch(i)) for i in range(watchers)]
    await asyncio.sleep(0.5)

    async def send(k: int) -> None:
        puts = [{"request_put": {"key": base64.b64encode(b"s/%d" % ((k * ROWS + j) % 100_000)).decode(),
                                 "value": base64.b64encode(b"%d" % k).decode()}} for j in range(ROWS)]
        t0 = time.perf_counter()
        rev = int((await _post(http, url + "/v3/kv/txn", {"success": puts}))["header"]["revision"])
        acked[rev] = t0
    await _paced(rate, send)
    await asyncio.sleep(1.0)
    for t in watching:
        t.cancel()
    await asyncio.gather(*watching, return_exceptions=True)
    return [received[0][rev] - at for rev, at in acked.items() if rev in received[0]]


async def _throughput(http, url: str, subscribers: int) -> float:
    socks = [await http.ws_connect(url + "/v1/tables/s/subscribe", max_msg_size=1 << 26) for _ in range(subscribers)]

    async def drain(ws) -> None:
        async for _ in ws:
            pass
    readers = [asyncio.ensure_future(drain(ws)) for ws in socks]
    rows, deadline = 0, time.perf_counter() + SECONDS

    async def writer(w: int) -> None:
        nonlocal rows
        k = 0
        while time.perf_counter() < deadline:
            batch = [{"id": (w * 1_000_000 + k * 100 + j) % 200_000, "v": float(k)} for j in range(100)]
            await _post(http, url + "/v1/tables/s/rows", {"rows": batch})
            rows += 100
            k += 1
    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(4)))
    took = time.perf_counter() - t0
    for ws in socks:
        await ws.close()
    await asyncio.gather(*readers, return_exceptions=True)
    return rows / took


async def main() -> None:
    import aiohttp

    root = tempfile.mkdtemp(prefix="subscribe-bench-")
    node, etcd = NodeProcess(os.path.join(root, "node")), EtcdOne(root)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400), timeout=aiohttp.ClientTimeout(total=600))
    results: list[Result] = []
    try:
        await node.wait_ready(http)
        await etcd.open(http)
        await _post(http, node.url + "/v1/tables", {"name": "s", "primary_key": "id", "partitions": 8, "columns": [
            {"name": "id", "type": "int64"}, {"name": "v", "type": "float64"}]})
        global SECONDS
        measured, SECONDS = SECONDS, 1.0
        await _ours(http, node.url, 1_000, 1)  # warm-up: the node's first rounds compile their kernels
        await _etcd(http, etcd.url, 1_000, 1)
        SECONDS = measured
        for rate in (1_000, 10_000):
            for subs in (1, 100):
                delivered, answered = await _ours(http, node.url, rate, subs)
                ours, ack = _percentiles(delivered), _percentiles(answered)
                peer = _percentiles(await _etcd(http, etcd.url, rate, subs))
                for i, (q, o, p) in enumerate((("p50", ours[0], peer[0]), ("p99", ours[1], peer[1]))):
                    results.append(Result(f"delivery {q}, {rate} rows/s, {subs} subscriber(s): write sent -> change "
                                          f"received (our write's own answer {q}: {ack[i]:.1f} ms)", o,
                                          "etcd watch: txn of the same puts sent -> watch event received", p, "ms",
                                          "p99 <= etcd's" if q == "p99" else "", {"ours_write_answer_ms": ack[i]}))
        pairs = [(await _throughput(http, node.url, 0), await _throughput(http, node.url, 100)) for _ in range(3)]
        alone, crowd = (float(np.median(x)) for x in zip(*pairs))  # alternated: a machine's drift hits both
        results.append(Result("writers' rows/s with 100 subscribers (vs none; medians of 3 alternated runs)", crowd,
                              "no subscribers", alone, "rows/s", ">= 0.8x"))
    finally:
        await http.close()
        node.close()
        etcd.close()
    print_table("Subscriptions: delivery latency and writers' throughput (RFC 0015)", results)
    write_json("subscribe", results)
