"""kill -9 a node at every step of a garbage-collection pass (fail points that SIGKILL the
process), two rounds each: after a restart every acknowledged batch is there, the column
index agrees with a scan, no object is leaked or missing, and `terrascale fsck` exits 0."""
import os
import subprocess

import numpy as np
import pytest

from bench.node_proc import TERRASCALE, NodeProc
from node.errors import ApiError
from tests.fixtures.moto import make_bucket, s3_uri

POINTS = ["gc.after_copy", "gc.after_publish", "gc.after_index_checkpoint", "gc.after_retire", "gc.after_delete"]
EXTRA = """
[history]
retention = "0s"
purge_lag = "0s"
[gc]
interval = "0s"
grace = "0s"
min_garbage = 0.3
[segments]
seal_bytes = "32KiB"
[tables]
partitions = 2
[jobs]
offload_every = "0s"
"""


def rows(keys, gen: int) -> list[dict]:
    return [{"id": int(k), "g": gen, "name": f"n{int(k) % 7}", "loc": {"x": float(k % 97), "y": float(k % 89)}}
            for k in keys]


def load(c, model: dict, gen: int, rng) -> None:
    """Overwrite and delete random keys; every acknowledged write goes into ``model``."""
    keys = np.sort(rng.choice(1500, 600, replace=False))
    c.upsert("g", rows(keys, gen))
    model.update({int(k): gen for k in keys})
    gone = np.sort(rng.choice(1500, 40, replace=False)).tolist()
    c.delete("g", gone)
    for k in gone:
        model.pop(k, None)
    c.admin("seal")
    c.admin("offload")


def verify(c, model: dict) -> None:
    got = c.query("g", limit=100_000)
    assert dict(zip(got.column("id").to_pylist(), got.column("g").to_pylist())) == model
    by_index = c.query("g", where=[["name", "=", "n3"]], limit=100_000).column("id").to_pylist()
    assert by_index == sorted(k for k in model if k % 7 == 3)
    box = c.query("g", bbox={"column": "loc", "xmin": 10, "ymin": 10, "xmax": 40, "ymax": 30}, limit=100_000)
    assert box.column("id").to_pylist() == sorted(k for k in model if 10 <= k % 97 <= 40 and 10 <= k % 89 <= 30)


def fsck(node: NodeProc) -> None:
    r = subprocess.run([TERRASCALE, "fsck", "--config", str(node.config)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "orphan" not in r.stdout.lower(), r.stdout  # no file or object without its file row
    assert "leaked" not in r.stdout, r.stdout  # no file row that no segment, manifest or pending row names


@pytest.mark.slow
def test_kill9_at_every_gc_step_two_rounds(tmp_path):
    run_rounds(NodeProc(tmp_path, extra=EXTRA), POINTS)


@pytest.mark.slow
def test_kill9_on_s3_with_encryption(tmp_path, moto_server):
    """The same on S3 (a moto_server process) with at-rest encryption, at the two steps that
    leave objects behind (copies unpublished; victims retired), two rounds each."""
    (tmp_path / "kek").write_bytes(os.urandom(32))
    node = NodeProc(tmp_path, extra=EXTRA)
    text = node.config.read_text().replace(f'objects = "trfs://{node.data}/objects"',
                                           f'objects = "{s3_uri(moto_server, make_bucket(moto_server))}"')
    node.config.write_text(text + f'[security]\nencryption_key_file = "{tmp_path / "kek"}"\n')
    run_rounds(node, ["gc.after_copy", "gc.after_publish"])


def run_rounds(node: NodeProc, points: list[str]) -> None:
    model: dict[int, int] = {}
    rng = np.random.default_rng(5)
    gen = 0
    try:
        node.start()
        with node.client(timeout=60) as c:
            c.create_table("g", [("id", "int64"), ("g", "int64"), ("name", "string"), ("loc", "point")], "id",
                           indexes=["name", "loc"])
            for _ in range(2):
                gen += 1
                load(c, model, gen, rng)
        node.stop()
        for point in points:
            for _ in range(2):
                node.start(env={"TERRASCALE_FAILPOINT_KILL": point})
                with node.client(timeout=60) as c:
                    gen += 1
                    load(c, model, gen, rng)
                    with pytest.raises((ApiError, ConnectionError, OSError)):
                        c.gc()
                node.proc.wait(30)  # the fail point killed it with SIGKILL
                assert node.proc.returncode == -9, (point, node.log()[-2000:])
                node._done()
                node.start()
                with node.client(timeout=60) as c:
                    verify(c, model)
                    res = c.gc()  # the next pass finishes what the crash left
                    assert set(res) == {"job", "segments_collected", "rows_copied", "bytes_reclaimed", "retired",
                                        "deleted"}
                    verify(c, model)
                    segs = c.segments("g")["segments"]
                    assert segs and all(0 <= s["live_rows"] <= s["rows"] for s in segs)
                    assert not [s for s in segs if s["state"] == "retired"]  # grace 0s: deleted in the pass
                    metrics = {ln.split()[0]: float(ln.split()[1]) for ln in c.metrics().splitlines()
                               if ln.startswith("terrascale_gc_")}
                    assert metrics["terrascale_gc_runs_total"] >= 1 and 0 <= metrics["terrascale_gc_garbage_ratio"] < 1
                node.stop()
                fsck(node)
    finally:
        node.ensure_stopped()
