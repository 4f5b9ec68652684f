"""Real Raft catalog clusters on loopback for tests: node processes, a client, a Catalog proxy.

``Cluster`` starts ``tests/catalog/raft_node.py`` processes (one per member,
each with its own directory), kills them (SIGKILL, SIGSTOP) and restarts them.
``RemoteCatalog`` is a ``Catalog`` whose every call goes to one of the nodes
(round robin), so the conformance suite exercises forwarding to the leader and
linearizable reads on followers.
"""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

from catalog.abc import Catalog, Entry, Put, TxnResult
from catalog import errors

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ERRORS = {n: getattr(errors, n) for n in dir(errors) if isinstance(getattr(errors, n), type)}


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class NodeError(Exception):
    """Raised when a node answers with an error class the catalog package does not define."""


class NodeClient:
    def __init__(self, port: int):
        self.port = port

    async def call(self, op: str, timeout: float = 30.0, **kw):
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port, limit=1 << 24), timeout)
        try:
            writer.write(json.dumps({"op": op, **kw}).encode() + b"\n")
            line = await asyncio.wait_for(reader.readline(), timeout)
        finally:
            writer.close()
        if not line:
            raise ConnectionError(f"node on control port {self.port} closed the connection")
        ans = json.loads(line)
        if "err" in ans:
            name, msg = ans["err"]
            raise _ERRORS.get(name, NodeError)(f"{name}: {msg}" if name not in _ERRORS else msg)
        return ans["ok"]

    async def txn(self, checks=(), ops=(), rid=None, timeout: float = 30.0):
        wire = [_wire_op(o) for o in ops]
        return await self.call("txn", timeout, checks=[[c.key, c.version] for c in checks], ops=wire, rid=rid)


def _wire_op(o) -> list:
    if not isinstance(o, Put):
        return ["del", o.key]
    if isinstance(o.value, str):  # a wrong type travels as such: the node's validate_txn refuses it
        return ["put_str", o.key, o.value]
    return ["put", o.key, base64.b64encode(o.value).decode()]


class Cluster:
    def __init__(self, root: str, n: int = 3, tuning: dict | None = None, catalog_kw: dict | None = None):
        self.root, self.tuning, self.catalog_kw = root, tuning, catalog_kw or {}
        ports = free_ports(2 * n)
        self.addrs = [f"127.0.0.1:{p}" for p in ports[:n]]
        self.ctl = ports[n:]
        self.members = list(self.addrs)
        self.procs: dict[int, subprocess.Popen] = {}
        self.secret_file = os.path.join(root, "cluster.secret")
        with open(self.secret_file, "w") as f:
            f.write(secrets.token_hex(24))

    def uri(self, i: int, members: list[str] | None = None) -> str:
        return f"raft://{','.join(members or self.members)}?self={self.addrs[i]}"

    def add_slot(self) -> int:
        """Reserve addresses for one more node (not started, not a member yet)."""
        raft, ctl = free_ports(2)
        self.addrs.append(f"127.0.0.1:{raft}")
        self.ctl.append(ctl)
        return len(self.addrs) - 1

    def start(self, i: int, members: list[str] | None = None) -> None:
        d = os.path.join(self.root, f"n{i}")
        os.makedirs(d, exist_ok=True)
        cmd = [sys.executable, "-m", "tests.catalog.raft_node", "--uri", self.uri(i, members),
               "--dir", d, "--secret-file", self.secret_file, "--ctl", str(self.ctl[i]),
               "--catalog-kw", json.dumps(self.catalog_kw)]
        if self.tuning:
            cmd += ["--tuning", json.dumps(self.tuning)]
        with open(os.path.join(self.root, f"n{i}.log"), "ab") as log:  # the child keeps its own fd
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
        line = p.stdout.readline()
        if line.strip() != b"ready":
            _reap(p)
            raise RuntimeError(f"node {i} did not start: {line!r}; see {self.root}/n{i}.log")
        self.procs[i] = p

    def start_all(self) -> None:
        for i in range(len(self.members)):
            self.start(i)

    def kill(self, i: int, sig=signal.SIGKILL) -> None:
        p = self.procs.pop(i) if sig in (signal.SIGKILL, signal.SIGTERM) else self.procs[i]
        p.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            p.wait(timeout=30)
            p.stdout.close()

    def stop_all(self) -> None:
        for i in list(self.procs):
            p = self.procs[i]
            p.send_signal(signal.SIGCONT)
            _reap(p)
        self.procs.clear()

    def client(self, i: int) -> NodeClient:
        return NodeClient(self.ctl[i])

    async def status(self, i: int) -> dict:
        return await self.client(i).call("status", timeout=5)

    async def wait_leader(self, among: list[int] | None = None, timeout: float = 30.0,
                          not_: str | None = None) -> int:
        """Index of the node every live node in ``among`` agrees is leader."""
        among = among if among is not None else sorted(self.procs)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                sts = [await self.status(i) for i in among]
                leaders = {s["leader"] for s in sts}
                if len(leaders) == 1 and None not in leaders and not_ not in leaders:
                    (lead,) = leaders
                    if lead in self.addrs and self.addrs.index(lead) in among:
                        return self.addrs.index(lead)
            except (ConnectionError, OSError, asyncio.TimeoutError, errors.CatalogError):
                pass
            await asyncio.sleep(0.05)
        raise TimeoutError(f"no agreed leader among {among} within {timeout} s")


def _reap(p: subprocess.Popen) -> None:
    p.kill()
    p.wait(timeout=30)
    p.stdout.close()


class RemoteCatalog(Catalog):
    """A Catalog whose calls go round robin to the nodes of a Cluster."""

    def __init__(self, cluster: Cluster, nodes: list[int] | None = None):
        self.cluster = cluster
        self.uri = cluster.uri(0)
        self._rr = itertools.cycle(nodes if nodes is not None else sorted(cluster.procs))

    def _c(self) -> NodeClient:
        return self.cluster.client(next(self._rr))

    async def close(self) -> None:
        pass

    async def get(self, key):
        return _entry(await self._c().call("get", key=key))

    async def get_many(self, keys):
        got = await self._c().call("get_many", keys=list(keys))
        return {k: _entry(e) for k, e in got.items()}

    async def scan(self, prefix="", *, start=None, end=None, limit=None, reverse=False):
        got = await self._c().call("scan", prefix=prefix, start=start, end=end, limit=limit, reverse=reverse)
        return [_entry(e) for e in got]

    async def txn(self, checks=(), ops=(), *, request_id=None):
        return _result(await self._c().txn(checks, ops, request_id))

    async def outcome(self, request_id):
        return _result(await self._c().call("outcome", rid=request_id))

    async def revision(self):
        return await self._c().call("revision")


def _entry(e):
    return None if e is None else Entry(e[0], base64.b64decode(e[1]), e[2])


def _result(r):
    return None if r is None else TxnResult(r["committed"], r["revision"], tuple(r["conflicts"]), r["request_id"])
