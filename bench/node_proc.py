"""Real `terrascale node run` processes on loopback, for the tests and the benchmarks: one
node (config, start, wait ready, stop, kill -9) and nodes on one ``raft://`` catalog."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from bench.ports import free_port
from node.client.client import Client
from node.errors import ApiError

TERRASCALE = os.path.join(os.path.dirname(sys.executable), "terrascale")


class NodeProc:
    """One node with its own data dir; ``start()`` / ``stop()`` / ``kill()`` may repeat."""

    def __init__(self, root, token: str | None = None, extra: str = "", node_id: str = "n1", port: int | None = None):
        self.root, self.token, self.node_id = root, token, node_id
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data = root / "data"
        self.config = root / "node.toml"
        sec = f'[security]\ntoken = "{token}"\n' if token else ""
        self.config.write_text(f"""
[node]
id = "{node_id}"
listen = "127.0.0.1:{self.port}"
{extra}
[storage]
block = "trfs://{self.data}/block"
volatile = "trfs://{self.data}/cache"
objects = "trfs://{self.data}/objects"
[catalog]
uri = "trkv://{self.data}/catalog"
{sec}""")
        self.proc: subprocess.Popen | None = None
        self.logs: list[str] = []
        self._log = None

    def start(self, wait: bool = True, env: dict | None = None, wrap: tuple = (), timeout: float = 60) -> "NodeProc":
        """``wrap``: a command the node runs under (``strace -f …``)."""
        self._log = open(self.root / f"node-{len(self.logs)}.log", "w+")
        # a process group of its own: a node under a wrapper (strace) is stopped with it
        self.proc = subprocess.Popen([*wrap, TERRASCALE, "node", "run", "--config", str(self.config)], cwd=self.root,
                                     stderr=self._log, stdout=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, start_new_session=True)
        if wait:
            self.wait_ready(timeout)
        return self

    def client(self, **kw) -> Client:
        return Client(self.base, kw.pop("token", self.token), **kw)

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        c = self.client(timeout=5)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"node exited with {self.proc.returncode}: {self.log()}")
                try:
                    c.readyz()
                    return
                except (ApiError, ConnectionError):
                    time.sleep(0.05)
        finally:
            c.close()
        raise AssertionError(f"node never became ready: {self.log()}")

    def log(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def _done(self) -> str:
        text = self.log()
        self.logs.append(text)
        self._log.close()
        self._log = None
        self.proc = None
        return text

    def stop(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM and wait: (exit status, the run's log)."""
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        return rc, self._done()

    def kill(self) -> str:
        """kill -9: no shutdown at all."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        return self._done()

    def ensure_stopped(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):  # the wrapper and the node it runs, if any is left
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        if self._log is not None:
            self._done()


def raft_cluster(root, n: int = 3, extra: str = "", raft_extra: str = "") -> list[NodeProc]:
    """``n`` nodes (not started) on one ``raft://`` catalog and one shared object store: node
    i has ``root/n<i>/`` (its data dir, Raft journal in ``data/raft``), HTTP and Raft ports
    of its own. ``raft_extra``: URI options, e.g. ``&timeout=30``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    raft = [f"127.0.0.1:{free_port()}" for _ in range(n)]
    return [_on_raft(root, f"n{i + 1}", extra, raft[i], raft, raft_extra) for i in range(n)]


def joiner(root, nodes, extra: str, node_id: str = "n4") -> NodeProc:
    """A new node (not started) configured with the current members ``nodes`` of a
    ``raft_cluster`` (it joins with `admin cluster add` of its ``raft_address``)."""
    return _on_raft(root, node_id, extra, f"127.0.0.1:{free_port()}", [n.raft_address for n in nodes])


def _on_raft(root, node_id: str, extra: str, raft_address: str, members: list[str], raft_extra: str = "") -> NodeProc:
    (root / node_id).mkdir(exist_ok=True)
    node = NodeProc(root / node_id, node_id=node_id, extra=extra)
    node.raft_address = raft_address
    node.config.write_text(node.config.read_text().replace(
        f'uri = "trkv://{node.data}/catalog"',
        f'uri = "raft://{",".join(members)}?self={raft_address}{raft_extra}"\n'
        f'secret_file = "{root / "secret"}"\ndir = "{node.data / "raft"}"').replace(
        f'objects = "trfs://{node.data}/objects"', f'objects = "trfs://{root}/objects"'))
    return node


def start_all(nodes: list[NodeProc], timeout: float = 90) -> None:
    """Start every node at once (none is ready before a quorum is up), then wait for each."""
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready(timeout)
