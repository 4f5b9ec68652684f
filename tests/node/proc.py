"""A real `terrascale node run` process for tests: config, start, wait ready, stop, kill -9."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from node.client import ApiError, Client
from tests.fixtures.moto import free_port

TERRASCALE = os.path.join(os.path.dirname(sys.executable), "terrascale")
SCHEMA = "id int64 primary key, ts timestamp, loc point, name string, v float64, n int64"


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
        self.proc = subprocess.Popen([*wrap, TERRASCALE, "node", "run", "--config", str(self.config)], cwd=self.root,
                                     stderr=self._log, stdout=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})
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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        if self._log is not None:
            self._done()
