"""The node over real HTTP, as a real process: health, readiness, metrics, errors, signals."""
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from bench.ports import free_port
from tests.node.proc import eventually, holds

TERRASCALE = os.path.join(os.path.dirname(sys.executable), "terrascale")


def _get(url, token=None):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _start(args, cwd):
    return subprocess.Popen([TERRASCALE, "node", "run", *args], cwd=cwd, stderr=subprocess.PIPE, text=True)


def _wait_ready(base, proc, token=None):
    try:
        eventually(lambda: holds(_get(base + "/readyz", token)[0] == 200, "ready"), 60, proc=proc)
    except AssertionError as e:
        raise AssertionError(f"node never became ready: {proc.stderr.read() if proc.poll() is not None else e}") \
            from None


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    return proc.stderr.read()


def test_node_lifecycle_over_http(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start(["--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}"], tmp_path)
    try:
        _wait_ready(base, proc)
        status, body = _get(base + "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        status, body = _get(base + "/v1/admin/status")
        st = json.loads(body)
        assert status == 200 and st["node_id"] == "n1" and st["ready"] is True
        status, body = _get(base + "/metrics")
        assert status == 200 and b"terrascale_files" in body
        status, body = _get(base + "/no/such/path")
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
    finally:
        log = _stop(proc)
    assert "event=ready" in log and "event=stopped" in log and "Traceback" not in log
    for sub in ("block", "cache", "objects", "catalog"):
        assert (tmp_path / "data" / sub).is_dir()


def test_token_required_except_healthz(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "node.toml"
    d = tmp_path / "d"
    cfg.write_text(f"""
[node]
id = "n7"
listen = "127.0.0.1:{port}"
[storage]
block = "trfs://{d}/block"
volatile = "trfs://{d}/cache"
objects = "trfs://{d}/objects"
[catalog]
uri = "trkv://{d}/catalog"
[security]
token = "s3cret"
""")
    proc = _start(["--config", str(cfg)], tmp_path)
    try:
        _wait_ready(base, proc, token="s3cret")
        assert _get(base + "/healthz")[0] == 200
        status, body = _get(base + "/v1/admin/status")
        assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
        assert _get(base + "/v1/admin/status", token="wrong")[0] == 401
        status, body = _get(base + "/v1/admin/status", token="s3cret")
        assert status == 200 and json.loads(body)["node_id"] == "n7"
    finally:
        _stop(proc)


@pytest.mark.parametrize("toml,key", [
    ("[node]\nidd = 'x'\n", "node.idd"),
    ("[segments]\nflush_bytes = 'huge'\n", "segments.flush_bytes"),
    ("[storage]\nobjects = 'trblob://acct/c'\n", "storage.objects"),
    ("[storage]\nobjects = 'trs3://nobucket/p?endpoint_url=http://127.0.0.1:9&max_attempts=1'\n", "storage.objects"),
])
def test_bad_config_is_one_line_exit_1(tmp_path, toml, key):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    r = subprocess.run([TERRASCALE, "node", "run", "--config", str(cfg)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    err = [line for line in r.stderr.splitlines() if line.startswith("terrascale: error:")]
    assert len(err) == 1 and key in err[0] and "Traceback" not in r.stderr


def test_usage_error_exits_2():
    r = subprocess.run([TERRASCALE, "node", "fly"], capture_output=True, text=True)
    assert r.returncode == 2
