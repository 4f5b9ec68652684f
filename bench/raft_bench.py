"""Raft catalog benchmark: compare-and-set txns on 3 nodes vs etcd, peers in the same run.

Both clusters: 3 members on loopback, fsync on, started here. Each client owns
one key and runs ``txn(Check(key, version), Put(key, value))`` in a loop, the
version being the revision its previous txn returned (etcd: ``compare
mod_revision == v, put``). Latency p50/p99 and throughput from 1 and 32
concurrent clients, rounds alternating ours/etcd, medians reported.

Both sides run the same client path: the load runs in this bench process, one asyncio
HTTP client (aiohttp, keep-alive) per side, each txn one JSON POST to a member:

* ours: ``POST /txn`` on a node process that runs our Raft catalog and does one
  ``txn(Check, Put)`` per request (on a follower: forwarded to the leader; the
  leader case is in ``extra``);
* etcd: ``etcd-server`` (Debian package; installed with apt-get when missing),
  ``POST /v3/kv/txn`` on its v3 JSON gateway.

Also measured: the same txns with pysyncobj's shipped defaults
(``appendEntriesUseBatch=True``, heartbeat 0.1 s) — RFC 0005, problem 8.

``python -m bench raft`` (or ``python -m bench.raft_bench``).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from bench.common import Result, print_table, write_json

ROUNDS = 3
N_SINGLE = 300          # txns per round, 1 client
N_EACH = 60             # txns per client per round, 32 clients
CLIENTS = 32
STOCK_DEFAULTS = {"appendEntriesUseBatch": True, "appendEntriesPeriod": 0.1, "raftMinTimeout": 0.4,
                  "raftMaxTimeout": 1.4, "connectionTimeout": 3.5, "connectionRetryTime": 5.0,
                  "leaderFallbackTimeout": 30.0}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETCD = "etcd 3.4, 3 members, v3 JSON gateway txn (same client)"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def summarize(lat: list[float], seconds: float) -> dict:
    lat = sorted(lat)
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
            "txn_per_s": len(lat) / seconds}


async def cas_load(txn, clients: int, per_client: int, tag: str) -> dict:
    """``txn(key, version) -> new version``; each client CASes its own key."""
    lat: list[float] = []

    async def client(i: int):
        key, ver = f"bench/{tag}/c{i}", 0
        for _ in range(per_client):
            t = time.perf_counter()
            ver = await txn(key, ver)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(clients)))
    return summarize(lat, time.perf_counter() - t0)


# -- our cluster: node processes with a load op -------------------------------------------------------

async def node_main(args) -> None:
    from catalog.abc import Check, Put
    from catalog.raft import RaftCatalog

    cat = RaftCatalog.from_uri(args.uri, secret_file=args.secret_file, dir=args.dir,
                               tuning=json.loads(args.tuning) if args.tuning else None)
    await cat.open()

    from aiohttp import web

    async def txn(request):
        q = await request.json()
        r = await cat.txn([Check(q["key"], q["version"])], [Put(q["key"], base64.b64decode(q["value"]))])
        return web.json_response({"committed": r.committed, "revision": r.revision})

    async def status(request):
        return web.json_response(await cat.cluster_status())

    app = web.Application()
    app.router.add_post("/txn", txn)
    app.router.add_get("/status", status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.ctl, backlog=1024).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


class Ours:
    def __init__(self, root: str, tuning: dict | None = None):
        ports = free_ports(6)
        self.addrs = [f"127.0.0.1:{p}" for p in ports[:3]]
        self.ctl = ports[3:]
        os.makedirs(root, exist_ok=True)
        secret = os.path.join(root, "secret")
        with open(secret, "w") as f:
            f.write(secrets.token_hex(24))
        self.procs = []
        for i, a in enumerate(self.addrs):
            cmd = [sys.executable, "-m", "bench.raft_bench", "node", "--uri",
                   f"raft://{','.join(self.addrs)}?self={a}", "--dir", os.path.join(root, f"n{i}"),
                   "--secret-file", secret, "--ctl", str(self.ctl[i])]
            if tuning:
                cmd += ["--tuning", json.dumps(tuning)]
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            if p.stdout.readline().strip() != b"ready":
                raise RuntimeError("raft bench node did not start")
            self.procs.append(p)

    async def open(self) -> None:
        import aiohttp

        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))  # as etcd's client

    async def status(self, i: int) -> dict:
        async with self.http.get(f"http://127.0.0.1:{self.ctl[i]}/status") as r:
            return await r.json()

    async def roles(self) -> tuple[int, int]:
        """(leader index, a follower index), once all three agree on a leader."""
        if getattr(self, "http", None) is None:
            await self.open()
        for _ in range(200):
            sts = [await self.status(i) for i in range(3)]
            leaders = {s["leader"] for s in sts}
            if len(leaders) == 1 and None not in leaders:
                lead = self.addrs.index(leaders.pop())
                return lead, (lead + 1) % 3
            await asyncio.sleep(0.05)
        raise RuntimeError("no raft leader")

    async def load(self, node: int, clients: int, per_client: int, tag: str) -> dict:
        url = f"http://127.0.0.1:{self.ctl[node]}/txn"
        value = base64.b64encode(b"x" * 64).decode()

        async def txn(key, ver):
            async with self.http.post(url, json={"key": key, "version": ver, "value": value}) as r:
                ans = await r.json()
            if not ans["committed"]:
                raise RuntimeError(f"CAS on {key} failed: {ans}")
            return ans["revision"]

        return await cas_load(txn, clients, per_client, tag)

    async def stop(self) -> None:
        if getattr(self, "http", None) is not None:
            await self.http.close()
        for p in self.procs:
            p.kill()
            p.wait()


# -- etcd ---------------------------------------------------------------------------------------------

def ensure_etcd() -> str:
    path = shutil.which("etcd")
    if path:
        return path
    print("etcd not found: installing the Debian package etcd-server (apt-get)", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", "etcd-server"], check=True, env=env)
    path = shutil.which("etcd")
    if not path:
        raise RuntimeError("etcd-server installed but no etcd binary on PATH")
    return path


class Etcd:
    def __init__(self, root: str):
        binary = ensure_etcd()
        ports = free_ports(6)
        self.client = [f"http://127.0.0.1:{p}" for p in ports[:3]]
        peer = [f"http://127.0.0.1:{p}" for p in ports[3:]]
        cluster = ",".join(f"e{i}={u}" for i, u in enumerate(peer))
        self.cmds = [[binary, "--name", f"e{i}", "--data-dir", os.path.join(root, f"etcd{i}"),
                      "--listen-client-urls", self.client[i], "--advertise-client-urls", self.client[i],
                      "--listen-peer-urls", peer[i], "--initial-advertise-peer-urls", peer[i],
                      "--initial-cluster", cluster, "--initial-cluster-state", "new",
                      "--initial-cluster-token", f"bench-{os.getpid()}", "--log-level", "error"]
                     for i in range(3)]
        self.procs = [self._spawn(i) for i in range(3)]

    def _spawn(self, i: int) -> subprocess.Popen:
        return subprocess.Popen(self.cmds[i], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self, i: int) -> None:
        """kill -9 member ``i``."""
        self.procs[i].kill()
        self.procs[i].wait()

    def restart(self, i: int) -> None:
        """Start member ``i`` again on its data dir (etcd ignores the --initial-* flags then)."""
        self.procs[i] = self._spawn(i)

    async def open(self):
        import aiohttp

        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        for _ in range(300):
            try:
                async with self.http.get(self.client[0] + "/health") as r:
                    if r.status == 200 and (await r.json(content_type=None)).get("health") == "true":
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError("etcd cluster did not become healthy")

    async def leader(self) -> int:
        """Index of the member that is leader (and a follower's index)."""
        ids = []
        for u in self.client:
            async with self.http.post(u + "/v3/maintenance/status", json={}) as r:
                st = await r.json(content_type=None)
            ids.append((st["header"]["member_id"], st["leader"]))
        lead = next(i for i, (me, lead) in enumerate(ids) if me == lead)
        return lead

    async def load(self, node: int, clients: int, per_client: int, tag: str) -> dict:
        url = self.client[node] + "/v3/kv/txn"

        async def txn(key, ver):
            k = base64.b64encode(key.encode()).decode()
            body = {"compare": [{"key": k, "result": "EQUAL", "target": "MOD", "mod_revision": str(ver)}],
                    "success": [{"request_put": {"key": k, "value": base64.b64encode(b"x" * 64).decode()}}]}
            async with self.http.post(url, json=body) as r:
                ans = await r.json(content_type=None)
            if not ans.get("succeeded"):
                raise RuntimeError(f"etcd CAS on {key} failed: {ans}")
            return int(ans["header"]["revision"])

        return await cas_load(txn, clients, per_client, tag)

    async def close(self):
        if getattr(self, "http", None) is not None:
            await self.http.close()
        for p in self.procs:
            p.kill()
            p.wait()


# -- the run ------------------------------------------------------------------------------------------

async def run(root: str) -> list[Result]:
    ours, etcd = Ours(os.path.join(root, "raft")), Etcd(os.path.join(root, "etcd"))
    try:
        await etcd.open()
        lead, follower = await ours.roles()
        e_follower = (await etcd.leader() + 1) % 3
    except BaseException:
        await ours.stop()
        await etcd.close()
        raise
    cases = {"1": (1, N_SINGLE), "32": (CLIENTS, N_EACH)}
    got: dict = {(who, c): [] for who in ("ours", "ours_leader", "etcd") for c in cases}
    try:
        for rnd in range(ROUNDS + 1):  # round 0 warms up both
            for c, (clients, per) in cases.items():
                o = await ours.load(follower, clients, per, f"r{rnd}f{c}")
                ol = await ours.load(lead, clients, per, f"r{rnd}l{c}")
                e = await etcd.load(e_follower, clients, per, f"r{rnd}e{c}")
                if rnd:
                    got[("ours", c)].append(o)
                    got[("ours_leader", c)].append(ol)
                    got[("etcd", c)].append(e)
    finally:
        await ours.stop()
        await etcd.close()
    stock = Ours(os.path.join(root, "stock"), STOCK_DEFAULTS)
    try:
        _, s_follower = await stock.roles()
        await stock.load(s_follower, 1, 5, "warm")
        stock_1 = await stock.load(s_follower, 1, 30, "stock")
    finally:
        await stock.stop()

    def med(who, c, k):
        return statistics.median(x[k] for x in got[(who, c)])

    results = []
    for c, label in (("1", "1 client"), ("32", f"{CLIENTS} clients")):
        extra = {k: {"ours_leader": round(med("ours_leader", c, k)),
                     "rounds_ours": [round(x[k]) for x in got[("ours", c)]],
                     "rounds_etcd": [round(x[k]) for x in got[("etcd", c)]]}
                 for k in ("p50_us", "p99_us", "txn_per_s")}
        results.append(Result(f"CAS txn p50, {label}, HTTP JSON POST to a follower", med("ours", c, "p50_us"), ETCD,
                              med("etcd", c, "p50_us"), "us", "<= 2.0x", extra["p50_us"]))
        results.append(Result(f"CAS txn p99, {label}, HTTP JSON POST to a follower", med("ours", c, "p99_us"), ETCD,
                              med("etcd", c, "p99_us"), "us", "report", extra["p99_us"]))
        results.append(Result(f"CAS txn throughput, {label}, HTTP JSON POST to a follower", med("ours", c, "txn_per_s"),
                              ETCD, med("etcd", c, "txn_per_s"), "txn/s",
                              ">= 1.0x" if c != "1" else "report (= 1/latency)", extra["txn_per_s"]))
    results.append(Result("CAS txn p50, 1 client: pysyncobj shipped defaults vs our tuning",
                          stock_1["p50_us"], "ours, tuned", med("ours", "1", "p50_us"), "us", "report (problem 8)",
                          {"stock_defaults": STOCK_DEFAULTS}))
    return results


async def main() -> list[Result]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as root:
        results = await run(root)
    print_table("Raft catalog: compare-and-set txns, 3 nodes on loopback", results)
    print(f"\nJSON: {write_json('raft', results)}")
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    n = sub.add_parser("node")
    n.add_argument("--uri", required=True)
    n.add_argument("--dir", required=True)
    n.add_argument("--secret-file", required=True)
    n.add_argument("--ctl", type=int, required=True)
    n.add_argument("--tuning")
    a = ap.parse_args()
    if a.cmd == "node":
        asyncio.run(node_main(a))
    else:
        asyncio.run(main())
