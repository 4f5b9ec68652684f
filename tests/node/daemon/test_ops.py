"""ops/: the systemd unit (systemd-analyze verify), sd_notify readiness from a real process,
the example configs, and ops/local-cluster.sh up 1 / up 3 / down with requests forwarded
between nodes."""
import json
import os
import time
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import tomllib

import pytest

from bench.node_proc import TERRASCALE, NodeProc
from bench.ports import free_port
from node.client.client import Client
from node.errors import ApiError
from node.config import from_dict
from tests.node.proc import eventually, holds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
OPS = os.path.join(ROOT, "ops")
UNIT = os.path.join(OPS, "terrascale-node@.service")


def unit_settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    section = None
    for line in open(UNIT):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, sep, value = line.partition("=")
        assert sep and section, f"not a unit file line: {line!r}"
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def test_unit_is_hardened_notify_with_restart():
    s = unit_settings()
    want = {"Service.Type": "notify", "Service.Restart": "on-failure", "Service.ProtectSystem": "strict",
            "Service.NoNewPrivileges": "yes", "Service.PrivateTmp": "yes", "Service.User": "terrascale"}
    for k, v in want.items():
        assert s.get(k) == [v], k
    assert int(s["Service.LimitNOFILE"][0]) >= 65536
    rw = s["Service.ReadWritePaths"][0].split()
    assert "/var/lib/terrascale/%i" in rw and "/var/cache/terrascale/%i" in rw
    assert s["Service.ExecStart"][0].endswith("terrascale node run --config /etc/terrascale/%i.toml")
    assert "MemoryDenyWriteExecute" not in "".join(s)  # numba JITs: W^X would kill the node


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    text = open(UNIT).read().replace("/opt/terrascale/.venv/bin/terrascale", TERRASCALE)
    (tmp_path / "terrascale-node@.service").write_text(text)
    inst = tmp_path / "terrascale-node@n1.service"
    inst.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(inst)], capture_output=True, text=True, timeout=120)
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if "terrascale-node" in ln]
    assert r.returncode == 0 and not ours, r.stdout + r.stderr
    # the check is real: a bad value in our unit is reported
    (tmp_path / "terrascale-node@n2.service").write_text(text.replace("ProtectSystem=strict", "ProtectSystem=nope"))
    r = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "terrascale-node@n2.service")],
                       capture_output=True, text=True, timeout=120)
    assert "terrascale-node@n2.service" in r.stdout + r.stderr


def _with_files(doc: dict, tmp_path) -> dict:
    """Point the file-valued keys of an example config at real files."""
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    (tmp_path / "token").write_text("tok\n")
    doc.setdefault("security", {})["token_file"] = str(tmp_path / "token")
    if "secret_file" in doc.get("catalog", {}):
        doc["catalog"]["secret_file"] = str(tmp_path / "secret")
    return doc


@pytest.mark.parametrize("name", ["node-single.toml", "cluster/n1.toml", "cluster/n2.toml", "cluster/n3.toml"])
def test_example_configs_are_valid(name, tmp_path):
    with open(os.path.join(OPS, name), "rb") as f:
        cfg = from_dict(_with_files(tomllib.load(f), tmp_path))
    assert cfg.node_id == (re.search(r"n\d", name).group(0) if "/" in name else "n1")
    if name.startswith("cluster/"):
        assert cfg.catalog.startswith("raft://") and cfg.catalog_dir and cfg.advertise


def test_sd_notify_ready_only_once_ready_then_watchdog_and_stopping(tmp_path):
    sock_dir = tempfile.mkdtemp(prefix="tsn")  # AF_UNIX paths are short (108 bytes)
    sock_path = os.path.join(sock_dir, "n.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(60)
    node = NodeProc(tmp_path)
    try:
        node.start(wait=False, env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "200000"})
        msg = sock.recv(4096).decode()
        assert msg.startswith("READY=1\n") and node.base in msg
        with node.client() as c:
            assert c.readyz() == {"status": "ready", "writes": True}  # READY=1 came only once /readyz says 200
        assert sock.recv(4096) == b"WATCHDOG=1"
        node.proc.send_signal(signal.SIGTERM)
        seen = set()
        while b"STOPPING=1" not in seen:
            seen.add(sock.recv(4096))
        assert node.proc.wait(60) == 0
    finally:
        node.ensure_stopped()
        sock.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _cluster(cmd: str, d, base: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "TERRASCALE_CLUSTER_DIR": str(d), "TERRASCALE_BASE_PORT": str(base),
           "TERRASCALE": TERRASCALE}
    return subprocess.run(["bash", os.path.join(OPS, "local-cluster.sh"), *cmd.split()], capture_output=True,
                          text=True, env=env, timeout=180)


def _free_base() -> int:
    """30 free ports in a row, below the ephemeral range (32768-60999 on Linux): client
    connections leave their ports there in TIME-WAIT by the thousand (the API fuzzer), and
    those block a listener's bind even with SO_REUSEADDR."""
    rnd = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        base = rnd.randrange(20_000, 32_700) // 10 * 10
        if all(_port_free(base + i) for i in range(0, 30)):
            return base
    raise AssertionError("no free port range")


def _port_free(p: int) -> bool:
    """Free as the nodes' listeners see it (they bind with SO_REUSEADDR: aiohttp, the Raft port)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", p))
            return True
        except OSError:
            return False


@pytest.mark.slow
def test_local_cluster_one_node(tmp_path):
    base = _free_base()
    r = _cluster("up 1", tmp_path / "c", base)
    try:
        assert r.returncode == 0, r.stderr
        assert f"n1  http://127.0.0.1:{base}" in r.stdout and "curl" in r.stdout
        with Client(f"http://127.0.0.1:{base}") as c:
            assert c.cluster()["catalog"] == "trkv" and c.status()["role"] == "single"
    finally:
        down = _cluster("down", tmp_path / "c", base)
    assert down.returncode == 0 and "stopped 1 node(s)" in down.stdout
    assert "event=stopped" in (tmp_path / "c" / "n1.log").read_text()
    assert _cluster("frob", tmp_path / "c", base).returncode == 2


@pytest.mark.slow
def test_local_cluster_three_nodes_route_by_partition_and_survive_a_restart(tmp_path):
    base = _free_base()
    d = tmp_path / "c"
    urls = [f"http://127.0.0.1:{base + 10 * i}" for i in range(3)]
    try:
        r = _cluster("up 3", d, base)
        assert r.returncode == 0, r.stderr + "".join((d / f"n{i}.log").read_text() for i in (1, 2, 3))
        assert oct((d / "cluster.secret").stat().st_mode & 0o777) == "0o600"
        c1, c2, c3 = (Client(u) for u in urls)
        view = c2.cluster()
        assert view["catalog"] == "raft" and sorted(m["id"] for m in view["members"]) == ["n1", "n2", "n3"]
        assert all(m["alive"] for m in view["members"]) and view["leader"] in ("n1", "n2", "n3")
        # partitions are placed across the members, balanced by count (RFC 0010), starting
        # at the creating node
        c1.create_table("a", [("id", "int64"), ("v", "string")], "id", indexes=["v"])
        c3.create_table("b", [("id", "int64")], "id", partitions=2)
        parts = c2.cluster()["partitions"]
        assert parts["a"] == {str(p): f"n{p % 3 + 1}" for p in range(8)} and parts["b"] == {"0": "n3", "1": "n1"}
        # a batch across every node commits atomically with one commit_ts
        assert c3.upsert("a", [{"id": i, "v": f"x{i % 3}"} for i in range(100)])["committed"] == 100
        assert c2.upsert("b", [{"id": 7}])["committed"] == 1
        assert c2.get("a", 5) == {"id": 5, "v": "x2"}
        assert c1.query("b").column("id").to_pylist() == [7]
        assert c3.query("a", where=[["v", "=", "x1"]]).num_rows == 33
        fwd = c2.metrics()
        assert 'terrascale_http_forwarded_total{owner="n' in fwd
        # ownership moves with a drop and re-create elsewhere; a node with the old owner cached
        # is answered 421 by the old owner and retries at the new one
        assert c2.get("a", 5) == {"id": 5, "v": "x2"}  # n2 has n1 cached as the owner of "a"
        assert c2.drop_table("a")["dropped"] == "a"
        c3.create_table("a", [("id", "int64"), ("w", "float64")], "id")
        assert c2.upsert("a", [{"id": 1, "w": 0.5}])["committed"] == 1
        assert c1.get("a", 1) == {"id": 1, "w": 0.5} and c1.query("a").num_rows == 1
        placed = c1.cluster()["partitions"]["a"]  # placed anew: the old placement does not count
        assert sorted(placed.values()) == ["n1"] * 2 + ["n2"] * 3 + ["n3"] * 3
        for c in (c1, c2, c3):
            c.close()
        down = _cluster("down", d, base)
        assert down.returncode == 0 and "stopped 3 node(s)" in down.stdout
        r = _cluster("up 3", d, base)  # every node recovers only its own tables
        assert r.returncode == 0, r.stderr
        with Client(urls[1]) as c2:
            assert c2.query("a", limit=1000).num_rows == 1 and c2.get("b", 7) == {"id": 7}
            assert c2.upsert("a", [{"id": 1000, "w": 2.0}])["committed"] == 1
            assert c2.cluster()["partitions"]["a"] == placed
            os.kill(int((d / "n3.pid").read_text()), signal.SIGKILL)  # the leader of b's partition 0 dies
            with pytest.raises(ApiError) as ei:
                c2.query("b")
            assert ei.value.status == 503 and ei.value.code == "unavailable"
            assert {t["name"] for t in c2.list_tables()["tables"]} == {"a", "b"}  # the catalog still answers
    finally:
        _cluster("down", d, base)
    logs = "".join((d / f"n{i}.log").read_text() for i in (1, 2, 3))
    assert "Traceback" not in logs and logs.count("event=stopped") == 5  # n3's second run was killed



def test_not_ready_until_recovered_and_sigterm_while_recovering(tmp_path):
    """One member of a 3-node Raft catalog alone has no quorum, so it cannot recover: it
    answers /healthz, says 503 everywhere else, and stops cleanly on SIGTERM meanwhile."""
    (tmp_path / "secret").write_text("0123456789abcdef0123456789abcdef\n")
    raft = [free_port() for _ in range(3)]
    members = ",".join(f"127.0.0.1:{p}" for p in raft)
    node = NodeProc(tmp_path)
    node.config.write_text(node.config.read_text().replace(
        f'uri = "trkv://{node.data}/catalog"',
        f'uri = "raft://{members}?self=127.0.0.1:{raft[0]}&timeout=60"\n'
        f'secret_file = "{tmp_path / "secret"}"\ndir = "{node.data / "raft"}"'))
    try:
        node.start(wait=False)
        with node.client(timeout=10) as c:
            eventually(lambda: holds(c.healthz() == {"status": "ok"}, "healthy"), 60, 0.05, proc=node.proc)
            for method, path in (("GET", "/readyz"), ("GET", "/v1/tables"), ("POST", "/v1/tables/x/rows"),
                                 ("GET", "/v1/admin/status"), ("GET", "/v1/admin/cluster")):
                status, body, _ = c.request(method, path, b"{}", "application/json")
                assert status == 503 and json.loads(body)["error"]["code"] == "not_ready", (path, body)
        rc, log = node.stop()
        assert rc == 0 and "event=stopping" in log and "event=stopped" in log and "event=ready" not in log
        assert "Traceback" not in log
    finally:
        node.ensure_stopped()


@pytest.mark.slow
def test_membership_add_and_remove_a_node_from_the_cli(tmp_path):
    """A 4th node started with the current members in its catalog URI joins with
    `terrascale admin cluster add`, serves, and leaves with `... remove`."""
    base = _free_base()
    d = tmp_path / "c"
    urls = [f"http://127.0.0.1:{base + 10 * i}" for i in range(4)]
    n4 = None
    try:
        r = _cluster("up 3", d, base)
        assert r.returncode == 0, r.stderr
        cfg = (d / "n1.toml").read_text()
        members = cfg.split('uri = "raft://')[1].split("?")[0]
        raft4 = f"127.0.0.1:{base + 31}"
        (d / "n4.toml").write_text(
            cfg.replace('id = "n1"', 'id = "n4"').replace(f"127.0.0.1:{base}\"", f"127.0.0.1:{base + 30}\"")
            .replace(f"?self=127.0.0.1:{base + 1}", f"?self={raft4}").replace("/n1/", "/n4/"))
        assert members.count(",") == 2
        with open(d / "n4.log", "w") as log:
            n4 = subprocess.Popen([TERRASCALE, "node", "run", "--config", str(d / "n4.toml")], stderr=log,
                                  stdout=subprocess.DEVNULL)
        cli = [TERRASCALE, "--endpoint", urls[0], "admin", "cluster"]
        add = subprocess.run(cli + ["add", raft4], capture_output=True, text=True, timeout=60)
        assert add.returncode == 0, add.stderr
        def ready4():
            with Client(urls[3], timeout=2) as c4:
                c4.readyz()
        eventually(ready4, 60, 0.2, proc=n4)
        with Client(urls[3]) as c4:
            view = c4.cluster()
            assert sorted(m["raft_address"] for m in view["members"]) == sorted(members.split(",") + [raft4])
            c4.create_table("j", [("id", "int64")], "id")
            assert c4.upsert("j", [{"id": 1}])["committed"] == 1
            # a joined member takes partitions of new tables (RFC 0010)
            assert sorted({p["leader"] for p in c4.describe("j")["placement"]}) == ["n1", "n2", "n3", "n4"]
        again = subprocess.run(cli + ["add", raft4], capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "membership_refused" in again.stderr
        bad = subprocess.run(cli + ["add"], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2
        with Client(urls[3]) as c4:
            c4.upsert("j", [{"id": i} for i in range(2, 200)])
        # n4 holds the only copy of some of j's partitions: they move to the others first
        rm = subprocess.run(cli + ["remove", raft4], capture_output=True, text=True, timeout=120)
        assert rm.returncode == 0, rm.stderr
        with Client(urls[0]) as c1:
            assert "n4" not in {p["leader"] for p in c1.describe("j")["placement"]}
            assert sorted(c1.query("j", limit=1000).column("id").to_pylist()) == [1, *range(2, 200)]
        with Client(urls[0]) as c1:
            assert raft4 not in {m["raft_address"] for m in c1.cluster()["members"]}
            # a removed member (still registered, still running) takes none of a new table's
            c1.create_table("k", [("id", "int64")], "id")
            assert sorted({p["leader"] for p in c1.describe("k")["placement"]}) == ["n1", "n2", "n3"]
            assert c1.upsert("k", [{"id": i} for i in range(50)])["committed"] == 50
    finally:
        if n4 is not None:
            n4.send_signal(signal.SIGTERM)
            n4.wait(timeout=60)
        _cluster("down", d, base)
