"""`terrascale export`: one scan at one snapshot to a file, and `--resume` after the exporting
process is killed with -9 — the finished file holds exactly the rows of the scan at the
export's T, in key order, whatever was written meanwhile."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from bench.node_proc import TERRASCALE, NodeProc

ROWS = 6_000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = NodeProc(tmp_path_factory.mktemp("export"))
    n.start()
    with n.client() as c:
        c.create_table("readings", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")],
                       ["sensor", "ts"], partitions=4)
        t = pa.table({"sensor": [f"s{i % 37}" for i in range(ROWS)],
                      "ts": pa.array(range(ROWS), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                      "v": pa.array([float(i) for i in range(ROWS)])})
        c.upsert("readings", t)
    yield n
    n.stop()


def _export(node, out, *extra):
    return [str(TERRASCALE), "--endpoint", node.base, "export", "readings", str(out), "--no-progress", *extra]


def _at(node, T, **scan):
    with node.client() as c:
        return pa.Table.from_batches(list(c.scan("readings", as_of=T, **scan)))


def test_an_export_killed_with_9_resumes_to_exactly_the_rows_of_its_snapshot(node, tmp_path):
    out = tmp_path / "readings.parquet"
    proc = subprocess.Popen(_export(node, out, "--page-rows", "300"), stderr=subprocess.PIPE)
    state = tmp_path / "readings.parquet.export" / "state.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if state.exists() and json.loads(state.read_text())["pages"] >= 3:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    T = json.loads(state.read_text())["as_of"]
    assert not out.exists() and T
    with node.client() as c:  # writes after T: not in the export
        c.upsert("readings", [{"sensor": "s0", "ts": 10**12, "v": -1.0}])
        c.delete("readings", [["s1", 1]])
    again = subprocess.run(_export(node, out, "--page-rows", "300", "--resume"), capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert not (tmp_path / "readings.parquet.export").exists()
    got, want = pq.read_table(out), _at(node, T)
    assert got.num_rows == ROWS and got.equals(want)


def test_csv_and_arrow_by_extension_and_a_prefix(node, tmp_path):
    for name in ("s.csv", "s.arrow"):
        out = tmp_path / name
        run = subprocess.run(_export(node, out, "--prefix", "s3"), capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        t = pcsv.read_csv(out) if name.endswith(".csv") else pa.ipc.open_file(str(out)).read_all()
        assert t.num_rows == len([i for i in range(ROWS) if i % 37 == 3])
        assert t.column("sensor").to_pylist() == ["s3"] * t.num_rows


def test_an_export_refuses_to_overwrite_and_a_resume_of_another_export(node, tmp_path):
    out = tmp_path / "x.parquet"
    out.write_bytes(b"mine")
    run = subprocess.run(_export(node, out), capture_output=True, text=True)
    assert run.returncode == 2 and "exists" in run.stderr and out.read_bytes() == b"mine"
    run = subprocess.run(_export(node, tmp_path / "y.parquet", "--resume"), capture_output=True, text=True)
    assert run.returncode == 2 and "no interrupted export" in run.stderr


def test_an_export_goes_on_after_its_node_is_killed_with_9_and_restarted(tmp_path):
    """The node the export talks to dies (kill -9) mid-export and comes back: the cursor
    (sealed with the catalog's key) and T (inside retention) survive it. The exporter asks
    again while the node is down and finishes, or gives up and ``--resume`` finishes: either
    way the file is the scan at T."""
    (tmp_path / "node").mkdir()
    n = NodeProc(tmp_path / "node")
    n.start()
    try:
        with n.client() as c:
            c.create_table("readings", [("sensor", "string"), ("ts", "timestamp"), ("v", "float64")],
                           ["sensor", "ts"], partitions=4)
            c.upsert("readings", pa.table({"sensor": [f"s{i % 7}" for i in range(ROWS)],
                                           "ts": pa.array(range(ROWS), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                                           "v": pa.array([float(i) for i in range(ROWS)])}))
            c.admin("seal")
        out = tmp_path / "readings.parquet"
        cmd = [str(TERRASCALE), "--endpoint", n.base, "export", "readings", str(out), "--no-progress",
               "--page-rows", "200"]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        state = tmp_path / "readings.parquet.export" / "state.json"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (state.exists() and json.loads(state.read_text())["pages"] >= 2):
            time.sleep(0.01)
        n.kill()  # kill -9 of the node between (or during) pages
        n.start()
        with n.client() as c:  # written after T: in no page of the export
            c.upsert("readings", [{"sensor": "s0", "ts": 10**12, "v": -1.0}])
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=300)
            assert again.returncode == 0, again.stderr
            err = again.stderr
        T = int(re.search(r"as of (\d+)", err).group(1))
        got = pq.read_table(out)
        with n.client() as c:
            want = pa.Table.from_batches(list(c.scan("readings", as_of=T)))
        assert got.num_rows == ROWS and got.equals(want)
    finally:
        n.ensure_stopped()
