"""Failover of ``python -m bench cluster``: kill -9 of a partition's leader → the
first write acknowledged through a survivor, against etcd's leader killed the same way; the
workload is described in ``bench/cluster_bench.py``."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import time

from bench.cluster_harness import PARTITIONS, QUICK, TIMINGS, Cluster, keys_of
from bench.common import Result
from bench.http_load import PointPeers, sensor_row
from bench.raft_bench import Etcd

KILLS = int(os.environ.get("CLUSTER_BENCH_KILLS", "3" if QUICK else "10"))
JSON_CT = {"Content-Type": "application/json"}
ATTEMPT_S = 0.1  # a failover writer starts another attempt beside one pending this long
RETRY_S = 0.02  # between a failover writer's attempts


async def first_ack(send, t0: float, limit: float = 60.0) -> tuple[float, int, dict]:
    """Retry ``send()`` (-> HTTP status) until one answers 200: (seconds since ``t0``,
    attempts, failures by kind). A failed attempt is retried after RETRY_S; one still pending
    after ATTEMPT_S is left running (it may yet be acknowledged) and another starts beside it."""
    import aiohttp

    attempts, errs, pending = 0, collections.Counter(), set()
    try:
        while True:
            if time.perf_counter() - t0 > limit:
                raise RuntimeError(f"no write acknowledged {limit} s after the kill: {dict(errs)}")
            pending.add(asyncio.ensure_future(send()))
            attempts += 1
            done, pending = await asyncio.wait(pending, timeout=ATTEMPT_S, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                try:
                    status = t.result()
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                    errs[type(e).__name__] += 1
                    continue
                if status == 200:
                    return time.perf_counter() - t0, attempts, dict(errs)
                errs[str(status)] += 1
            if done:
                await asyncio.sleep(RETRY_S)
    finally:
        for t in pending:
            t.cancel()


async def _status_of(http, method: str, url: str, body: bytes) -> int:
    async with http.request(method, url, data=body, headers=JSON_CT) as r:
        await r.read()
        return r.status


async def failover_ours(cl: Cluster) -> list[dict]:
    """Kills alternate between the leader of a partition that does not lead the catalog and
    the catalog's Raft leader (leading a partition too): the latter fails over only once the
    catalog elected a leader and its placement driver watched for a whole failure_timeout."""
    await cl.create("fo", 3)
    await cl.caught_up()
    keys, parts = keys_of(PARTITIONS, 1 << 40, 1 << 20)
    of_pid = {p: iter(keys[parts == p].tolist()) for p in range(PARTITIONS)}
    runs = []
    for k in range(KILLS):
        for _ in range(50):  # pick the victim from the leaders serving now (not a cached placement)
            sh = await cl.shippers()
            leaders = [sh.get(f"fo/{p}", {}).get("node") for p in range(PARTITIONS)]
            if None in leaders:
                await asyncio.sleep(0.2)
                continue
            cat = (await cl.get(leaders[0], "/v1/admin/status"))["catalog_leader"]
            pid = next((p for p, n in enumerate(leaders) if (n == cat) == (k % 2 == 1)), 0)
            victim = cl.by_id[leaders[pid]]
            survivor = next(n for n in cl.nodes if n is not victim)
            url = f"{survivor.base}/v1/tables/fo/rows"

            def send(url=url, mine=of_pid[pid]):
                return _status_of(cl.http, "POST", url, json.dumps({"rows": [sensor_row(next(mine))]}).encode())

            # the partition takes writes before the kill (a leadership moving back to a
            # returned node answers 503 for a moment: retried), and is still led by the victim
            await first_ack(send, time.perf_counter(), limit=30)
            if (await cl.shippers()).get(f"fo/{pid}", {}).get("node") == victim.node_id:
                break
        else:
            raise RuntimeError(f"the leaders of 'fo' keep moving: {leaders}")
        t0 = time.perf_counter()
        victim.kill()
        took, attempts, errs = await first_ack(send, t0)
        new = await cl.leaders("fo", via=survivor.node_id)
        runs.append({"s": took, "partition": pid, "victim": victim.node_id, "new_leader": new[pid],
                     "attempts": attempts, "failures": errs, "victim_led_catalog": cat == victim.node_id})
        print(f"  kill {k}: {victim.node_id} (partition {pid}, catalog leader: {cat == victim.node_id}) -> "
              f"{new[pid]} first ack after {took:.2f} s, {attempts} attempts {errs}", flush=True)
        t1 = time.perf_counter()
        victim.start(wait=False)
        await cl.wait_ready(victim)
        await cl.caught_up()
        runs[-1]["back_s"] = round(time.perf_counter() - t1, 2)
    await cl.drop("fo")
    return runs


async def failover_etcd(etcd: Etcd, http) -> list[dict]:
    runs = []
    for k in range(KILLS):
        lead = await etcd.leader()
        survivor = (lead + 1) % 3
        n = iter(range(1 << 40))
        put = PointPeers(http, "", etcd.client[survivor]).put(f"fo{k}/")

        async def send(put=put, n=n):
            try:
                await put(next(n))
                return 200
            except RuntimeError:
                return 503

        if await send() != 200:
            raise RuntimeError("etcd refused a put before the kill")
        t0 = time.perf_counter()
        etcd.kill(lead)
        took, attempts, errs = await first_ack(send, t0)
        runs.append({"s": took, "attempts": attempts, "failures": errs})
        print(f"  etcd kill {k}: member {lead}, first ack after {took:.2f} s, {attempts} attempts {errs}", flush=True)
        etcd.restart(lead)
        await _etcd_healthy(http, etcd.client[lead])
    return runs


async def _etcd_healthy(http, url: str, timeout: float = 60) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with http.get(url + "/health") as r:
                if r.status == 200 and (await r.json(content_type=None)).get("health") == "true":
                    return
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError(f"etcd member {url} did not come back")


def failover_results(ours: list[dict], theirs: list[dict]) -> list[Result]:
    e = sorted(r["s"] for r in theirs)
    peer = "etcd 3.4, 3 members (heartbeat 100 ms, election 1 s), kill -9 of its leader, put via a survivor"
    extra = {"ours": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in ours],
             "etcd": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in theirs]}
    out = []
    for cat, who in ((None, "partition leader"), (False, "partition leader, not the catalog's Raft leader"),
                     (True, "partition leader that also leads the catalog")):
        o = sorted(r["s"] for r in ours if cat is None or r["victim_led_catalog"] == cat)
        if not o:
            continue
        label = (f"failover: kill -9 of a {who} to the first acknowledged write on that partition through a "
                 f"surviving node (R=3, {TIMINGS}), {len(o)} kills")
        out.append(Result(label + ": p50", statistics.median(o), peer, statistics.median(e), "s",
                          "p50 < 3 s" if cat is None else "report", extra if cat is None else {}))
        out.append(Result(label + ": max", o[-1], peer, e[-1], "s", "report"))
    return out
