"""The `terrascale` CLI against a real node: every command, output formats, exit codes 0/1/2,
ingest of Parquet/CSV/Arrow/NDJSON, and a killed ingest re-run giving the same table."""
import csv
import io
import json
import os
import signal
import subprocess
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.node_proc import TERRASCALE, NodeProc

TOKEN = "cli-token"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("cli"), token=TOKEN)
    n.start()
    yield n
    rc, _ = n.stop()
    assert rc == 0


def ts(node, *args, token=TOKEN, check=None, binary=False, timeout=120):
    env = {**os.environ, "TERRASCALE_ENDPOINT": node.base}
    env.pop("TERRASCALE_TOKEN", None)
    if token:
        env["TERRASCALE_TOKEN"] = token
    r = subprocess.run([TERRASCALE, *args], capture_output=True, env=env, timeout=timeout, text=not binary)
    if check is not None:
        assert r.returncode == check, (args, r.stdout, r.stderr)
    return r


def one_line_error(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("terrascale: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def data(n: int, start: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng(start)
    return pa.table({"id": ids, "ts": pa.array(ids * 1000, pa.timestamp("us", tz="UTC")),
                     "loc": pa.StructArray.from_arrays([pa.array(rng.uniform(0, 100, n)),
                                                        pa.array(rng.uniform(0, 100, n))], names=["x", "y"]),
                     "name": pa.array([f"n{i % 5}" for i in ids.tolist()]), "v": pa.array(rng.uniform(0, 1, n))})


SCHEMA = "id int64 primary key, ts timestamp, loc point, name string, v float64"


def test_table_commands_and_outputs(node):
    r = ts(node, "table", "create", "t1", "--schema", SCHEMA, "--index", "loc,name", check=0)
    assert "loc" in r.stdout and "primary key id" in r.stdout
    assert "t1" in ts(node, "table", "list", check=0).stdout
    d = json.loads(ts(node, "table", "describe", "t1", "-o", "json", check=0).stdout)
    assert d["indexes"] == ["loc", "name"] and d["primary_key"] == "id"
    ts(node, "table", "alter", "t1", "add-column", "c float64", check=0)
    ts(node, "table", "alter", "t1", "rename-column", "c", "c2", check=0)
    r = ts(node, "table", "alter", "t1", "drop-column", "c2", "-o", "csv", check=0)
    assert "c2" not in r.stdout and r.stdout.startswith("column,type,nullable,indexed")
    ts(node, "table", "describe", "t1", "--as-of", str(d["ts"]), check=0)
    r = ts(node, "table", "alter", "t1", "retention", "id", "30d", check=1)  # not a time column
    assert "invalid_schema" in r.stderr and "not a timestamp or date" in r.stderr
    ts(node, "table", "create", "t2", "--schema", "id int64 primary key, ts timestamp not null",
       "--retention", "ts=30d", check=0)
    assert "older than 2.592e+06 s" in ts(node, "table", "describe", "t2", check=0).stdout
    assert json.loads(ts(node, "table", "alter", "t2", "retention", "off", "-o", "json", check=0).stdout)[
        "retention"] is None
    assert json.loads(ts(node, "table", "drop", "t1", "-o", "json", check=0).stdout)["dropped"] == "t1"
    assert "t1" not in ts(node, "table", "list", "-o", "json", check=0).stdout


def test_ingest_every_format_then_get_and_query(node, tmp_path):
    ts(node, "table", "create", "f", "--schema", SCHEMA, "--index", "loc,name", check=0)
    pq.write_table(data(3000), tmp_path / "a.parquet")
    with pa.ipc.new_file(str(tmp_path / "b.arrow"), data(1000, 3000).schema) as w:
        w.write_table(data(1000, 3000))
    with pa.ipc.new_stream(str(tmp_path / "c.arrows"), data(500, 4000).schema) as w:
        w.write_table(data(500, 4000))
    with open(tmp_path / "d.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "ts", "loc", "name", "v"])
        for i in range(4500, 4700):
            w.writerow([i, "2024-01-01T00:00:00Z", json.dumps({"x": 1.0, "y": 2.0}), "csv", i / 10])
    with open(tmp_path / "e.ndjson", "w") as f:
        for i in range(4700, 4800):
            f.write(json.dumps({"id": i, "ts": i, "loc": {"x": 3, "y": 4}, "name": "nd"}) + "\n")
    for name, rows in (("a.parquet", 3000), ("b.arrow", 1000), ("c.arrows", 500), ("d.csv", 200), ("e.ndjson", 100)):
        r = ts(node, "ingest", "f", str(tmp_path / name), "--batch-rows", "700", check=0)
        assert f"ingested {rows} rows" in r.stderr and "rows/s" in r.stderr
    r = ts(node, "get", "f", "4501", "-o", "json", check=0)
    assert json.loads(r.stdout) == {"id": 4501, "ts": "2024-01-01T00:00:00.000000Z", "loc": {"x": 1.0, "y": 2.0},
                                    "name": "csv", "v": 450.1}
    assert "4701" in ts(node, "get", "f", "4701", check=0).stdout
    r = ts(node, "query", "f", "--where", "name = nd", "--where", "id >= 4790", "-o", "json", check=0)
    assert [x["id"] for x in json.loads(r.stdout)["rows"]] == list(range(4790, 4800))
    r = ts(node, "query", "f", "--bbox", "loc:1,2,1,2", "--columns", "id,name", "--limit", "5", "-o", "csv",
           check=0)
    rows = list(csv.reader(io.StringIO(r.stdout)))
    assert rows[0] == ["id", "name"] and len(rows) == 6 and all(x[1] == "csv" for x in rows[1:])
    r = ts(node, "query", "f", "--where", "id < 10", "-o", "arrow", binary=True, check=0)
    t = pa.ipc.open_stream(r.stdout).read_all()
    assert t.column("id").to_pylist() == list(range(10))
    assert "(10 rows" in ts(node, "query", "f", "--where", "id < 10", check=0).stderr
    # time travel through the CLI
    as_of = json.loads(ts(node, "query", "f", "--limit", "0", "-o", "json", check=0).stdout)["as_of"]
    ts(node, "ingest", "f", str(tmp_path / "e.ndjson"), check=0)  # same rows again: an idempotent re-run
    r = ts(node, "query", "f", "--as-of", str(as_of), "--limit", "100000", "-o", "json", check=0)
    assert len(json.loads(r.stdout)["rows"]) == 4800


def test_admin_commands(node):
    ts(node, "table", "create", "adm", "--schema", "id int64 primary key, v float64", check=0)
    node_client = node.client()
    node_client.upsert("adm", [{"id": i, "v": i} for i in range(100)])
    assert "node_id: n1" in ts(node, "admin", "status", check=0).stdout
    assert json.loads(ts(node, "admin", "seal", "-o", "json", check=0).stdout)["sealed"]
    assert "offloaded" in ts(node, "admin", "offload", check=0).stdout
    assert "checkpointed" in ts(node, "admin", "checkpoint", check=0).stdout
    assert json.loads(ts(node, "admin", "gc", "-o", "json", check=0).stdout)["segments_collected"] == 0
    assert "no victims" in ts(node, "admin", "gc", "--table", "adm", "--dry-run", check=0).stdout
    segs = json.loads(ts(node, "admin", "segments", "--table", "adm", "-o", "json", check=0).stdout)["segments"]
    assert segs and {s["state"] for s in segs} <= {"offloaded", "sealed", "active"}
    assert "segid" in ts(node, "admin", "segments", "-o", "csv", check=0).stdout.splitlines()[0]
    r = ts(node, "admin", "cluster", check=0)
    assert "leader n1" in r.stdout and "table adm: 8 partitions on n1" in r.stdout
    node_client.close()


@pytest.mark.parametrize("args,code,needle", [
    (["table", "describe", "nope"], 1, "table_not_found"),
    (["get", "nope", "1"], 1, "table_not_found"),
    (["query", "nope"], 1, "table_not_found"),
    (["table", "create", "bad", "--schema", "id float64 primary key"], 1, "cannot be of type float64"),
    (["table", "create", "bad", "--schema", "id int64"], 1, "primary key"),
    (["ingest", "nope", "/nonexistent.parquet"], 1, "no such file"),
    (["admin", "segments", "--table", "nope"], 1, "table_not_found"),
    (["query", "x", "--where", "no operator"], 2, "col op value"),
    (["query", "x", "--bbox", "loc:1,2,3"], 2, "XMIN,YMIN,XMAX,YMAX"),
    (["table", "alter", "x", "rename-column", "only-one"], 2, "OLD NEW"),
    (["table", "alter", "x", "retention", "ts"], 2, "ts=30d"),
    (["table", "frobnicate"], 2, "invalid choice"),
    (["query", "x", "--output", "xml"], 2, "invalid choice"),
    (["get", "x"], 2, "required"),
    (["--endpoint", "ftp://x", "table", "list"], 2, "endpoint"),
])
def test_exit_codes_and_one_line_errors(node, args, code, needle):
    r = ts(node, *args)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    if code == 1:
        one_line_error(r)


def test_auth_and_unreachable_errors(node):
    r = ts(node, "table", "list", token=None)
    assert r.returncode == 1 and "unauthorized" in one_line_error(r)
    r = ts(node, "table", "list", token="wrong")
    assert r.returncode == 1 and "unauthorized" in one_line_error(r)
    env = {**os.environ, "TERRASCALE_ENDPOINT": "http://127.0.0.1:9"}
    r = subprocess.run([TERRASCALE, "admin", "status"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and "cannot reach" in one_line_error(r)


def test_get_absent_row_exits_1(node):
    ts(node, "table", "create", "g", "--schema", "id int64 primary key", check=0)
    r = ts(node, "get", "g", "5")
    assert r.returncode == 1 and "row_not_found" in one_line_error(r)


@pytest.mark.slow
def test_killed_ingest_rerun_gives_the_same_table(tmp_path):
    """kill -9 the *ingest* mid-file, and (another time) the node under it; re-running yields the table
    a clean run gives: same rows, same values, no duplicates."""
    node = NodeProc(tmp_path, token=TOKEN).start()
    try:
        n = 300_000
        t = data(n)
        t = t.set_column(4, "v", pa.array(np.arange(n) * 0.5))
        dup = data(50, 1000).set_column(4, "v", pa.array(np.full(50, -1.0)))  # keys again, later in the file
        pq.write_table(pa.concat_tables([t, dup]), tmp_path / "big.parquet", row_group_size=20_000)
        ts(node, "table", "create", "big", "--schema", SCHEMA, "--index", "name", check=0)
        env = {**os.environ, "TERRASCALE_ENDPOINT": node.base, "TERRASCALE_TOKEN": TOKEN}
        p = subprocess.Popen([TERRASCALE, "ingest", "big", str(tmp_path / "big.parquet"), "--batch-rows", "5000",
                              "--no-progress"], env=env, stderr=subprocess.PIPE, text=True)
        with node.client() as c:
            deadline = time.monotonic() + 120
            while c.query("big", limit=20_000, columns=["id"]).num_rows < 20_000 and time.monotonic() < deadline:
                time.sleep(0.02)
            p.send_signal(signal.SIGKILL)
            p.wait(30)
            partial = c.query("big", limit=10**9, columns=["id"]).num_rows
        assert 0 < partial < n, partial
        # second attempt: this time the node dies under the ingest
        p = subprocess.Popen([TERRASCALE, "ingest", "big", str(tmp_path / "big.parquet"), "--batch-rows", "5000",
                              "--no-progress"], env=env, stderr=subprocess.PIPE, text=True)
        with node.client() as c:  # a point get is a cheap probe: the ingest takes well under a second
            deadline = time.monotonic() + 120
            while c.get("big", partial + 20_000) is None and time.monotonic() < deadline:
                time.sleep(0.002)
        node.kill()
        rc, err = p.wait(60), p.stderr.read()
        assert rc == 1 and "terrascale: error:" in err and "Traceback" not in err, err
        node.start()
        r = ts(node, "ingest", "big", str(tmp_path / "big.parquet"), "--batch-rows", "5000", "--no-progress",
               check=0, timeout=300)
        assert f"ingested {n + 50} rows" in r.stderr
        with node.client() as c:
            got = c.query("big", limit=10**9, columns=["id", "v"])
        ids, v = got.column("id").to_numpy(), got.column("v").to_numpy()
        assert len(ids) == n and (ids == np.arange(n)).all()
        want = np.arange(n) * 0.5
        want[1000:1050] = -1.0  # the later duplicate rows of the file won
        assert (v == want).all()
    finally:
        node.ensure_stopped()


def test_scan_and_export_take_typed_key_components_from_the_command_line(node, tmp_path):
    """`--prefix 5` on an integer key column is the integer 5 (the JSON body's key is typed: the
    string "5" was refused, 400), a float's and a boolean's likewise; a component that is not
    of its column's type is a usage error that sends nothing."""
    ts(node, "table", "create", "bydev", "--schema",
       "dev int64, ok bool, ts timestamp, v float64, primary key (dev, ok, ts)", check=0)
    with node.client() as c:
        c.upsert("bydev", [{"dev": d, "ok": d % 2 == 0, "ts": f"2026-01-01T00:00:{s:02d}Z", "v": float(s)}
                           for d in (4, 5, 6) for s in range(5)])
    r = ts(node, "scan", "bydev", "--prefix", "5", "--output", "json", check=0)
    got = json.loads(r.stdout)["rows"]
    assert [(x["dev"], x["v"]) for x in got] == [(5, float(s)) for s in range(5)]
    r = ts(node, "scan", "bydev", "--prefix", "4", "--prefix", "true", "--start", "4", "--start", "true",
           "--start", "2026-01-01T00:00:03Z", "--output", "json", check=0)
    assert [x["v"] for x in json.loads(r.stdout)["rows"]] == [3.0, 4.0]
    assert "'dev' is int64" in one_line_error(ts(node, "scan", "bydev", "--prefix", "five", check=2))
    out = tmp_path / "dev6.parquet"
    ts(node, "export", "bydev", str(out), "--prefix", "6", check=0)
    assert pq.read_table(out).column("dev").to_pylist() == [6] * 5
