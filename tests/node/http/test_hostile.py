"""The HTTP and Raft ports under hostile connections, with real node processes: silent and
half-sent connections are closed after the handshake deadline, at most the configured number
are pending, and a flood that exhausts the node's open-file limit (RLIMIT_NOFILE lowered in
the node process) does not take it out of the cluster for good: once released, it serves."""
import os
import resource
import socket

import pytest

from bench.node_proc import NodeProc, raft_cluster, start_all
from tests.node.proc import eventually, holds, metric


def closed_by_peer(s: socket.socket, within: float) -> bool:
    s.settimeout(within)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_http_pending_connections_have_a_deadline_and_a_cap(tmp_path):
    node = NodeProc(tmp_path, extra='handshake_timeout = "1s"\nmax_pending_connections = 4\n').start()
    socks = []
    try:
        socks = [connect(node.port) for _ in range(7)]
        socks[0].sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        refused = sum(closed_by_peer(s, 0.5) for s in socks[4:])
        assert refused == 3  # over the cap: closed at accept
        assert all(closed_by_peer(s, 10) for s in socks[:4])  # silent or half-sent: closed at the deadline
        with node.client() as c:  # whole requests are served, on fresh and kept-alive connections
            assert c.readyz()["status"] == "ready" and c.readyz()["status"] == "ready"
        assert metric(node, "terrascale_connections_refused_total", port="http", reason="pending_cap") == 3
        assert metric(node, "terrascale_connections_refused_total", port="http", reason="handshake_timeout") == 4
        assert metric(node, "terrascale_connections_pending", port="http") == 0
    finally:
        for s in socks:
            s.close()
        node.ensure_stopped()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _flood(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        out.append(s)
    return out


def _around(log: str, needles: tuple[str, ...], lines: int = 30) -> str:
    """The log's lines around the first line holding any of ``needles`` (a failure's context
    in full: pytest cuts a long assertion's text)."""
    rows = log.splitlines()
    at = next((i for i, r in enumerate(rows) if any(n in r for n in needles)), 0)
    return "\n".join(rows[max(0, at - 5): at + lines])


def _until(fn, timeout: float, what: str):
    return eventually(lambda: holds(fn(), what), timeout, 0.2)


@pytest.mark.slow
def test_open_file_exhaustion_on_both_ports_is_survived(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra='handshake_timeout = "30s"\nmax_pending_connections = 5000\n')
    flood: list[socket.socket] = []
    try:
        start_all(nodes)
        with nodes[0].client() as c:
            leader = c.cluster()["leader"]
        victim = next(n for n in nodes if n.node_id != leader)
        dead = next(n for n in nodes if n.node_id == leader)
        pid = victim.proc.pid
        _, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_fds(pid) + 40, hard))  # this node's limit only
        raft_port = int(victim.raft_address.rsplit(":", 1)[1])
        flood += _flood(raft_port, 300)
        _until(lambda: "event=raft_accept_failed errno=EMFILE" in victim.log(), 20, "the Raft port hit EMFILE")
        flood += _flood(victim.port, 300)
        _until(lambda: "event=http_accept_failed errno=EMFILE" in victim.log(), 20, "the HTTP port hit EMFILE")
        dead.kill()  # an election while the victim is short of descriptors
        for s in flood:
            s.close()
        flood = []
        dead.start(wait=False)
        _until(lambda: victim.client(timeout=5).readyz(), 30, "the victim's HTTP port answers again")
        with victim.client(timeout=30) as c:  # a catalog write through the victim
            _until(lambda: c.create_table("after", [("id", "int64")], "id"), 60, "a catalog write succeeded")
            assert c.upsert("after", [{"id": 1}])["committed"] == 1
        dead.wait_ready(60)
        log = victim.log()
        assert "event=raft_replica_stopped" not in log and "Traceback" not in log, _around(log, ("Traceback",
                                                                                                "raft_replica_stopped"))
        assert "event=raft_listener_rebound" not in log  # paused and resumed, never closed
        assert metric(victim, "terrascale_connections_refused_total", port="raft", reason="accept_emfile") > 0
        assert metric(victim, "terrascale_connections_refused_total", port="http", reason="accept_emfile") > 0
    finally:
        for s in flood:
            s.close()
        for n in nodes:
            n.ensure_stopped()


def test_raft_port_closes_silent_connections_at_the_deadline(tmp_path):
    nodes = raft_cluster(tmp_path, 3, extra='handshake_timeout = "1s"\nmax_pending_connections = 3\n')
    socks = []
    try:
        start_all(nodes)
        port = int(nodes[0].raft_address.rsplit(":", 1)[1])
        socks = [connect(port) for _ in range(5)]
        assert sum(closed_by_peer(s, 0.5) for s in socks[3:]) == 2  # over the cap
        assert all(closed_by_peer(s, 10) for s in socks[:3])  # silent: closed at the deadline
        with nodes[0].client() as c:  # the members' own connections were never touched
            c.create_table("t", [("id", "int64")], "id")
            assert all(m["alive"] for m in c.cluster()["members"])
        assert metric(nodes[0], "terrascale_connections_refused_total", port="raft", reason="pending_cap") == 2
        assert metric(nodes[0], "terrascale_connections_refused_total", port="raft",
                      reason="handshake_timeout") == 3
    finally:
        for s in socks:
            s.close()
        for n in nodes:
            n.ensure_stopped()
