"""Loopback ports for the processes the benchmarks and the tests start (nodes, moto, etcd,
proxies): one home for the set of ports handed out, so no two callers get the same one."""
from __future__ import annotations

import socket

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (nothing listens on it), and one this
    process has not handed out before: the kernel may offer a just-closed port again, and two
    nodes of one test given the same port fail to start ("a member is listed twice")."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
