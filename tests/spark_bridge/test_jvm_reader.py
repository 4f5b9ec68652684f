"""The JVM reader (spark_bridge/jvm) against the Python one: a second decoder of the formats of
docs/format/, written from the docs. Segments the engine wrote — every column type, zstd and
stored (incompressible) blocks, several schema versions in one segment, tombstones — read by
both readers row by row at now and as of past timestamps, sealed parts alone and whole
snapshots, with the where/bbox options and Spark's own filters pushed down; a corrupted byte
fails the task with an error naming the object."""
from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import spark_bridge
from terrafs.backends.local import LocalObjectStore
from terrafs.blocks import Flags, parse_header
from terrafs.sealed import SealedFile
from tests.spark_bridge.conftest import api_rows, spark_rows, started_node
from tests.spark_bridge.test_read import COLUMNS, make_rows


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-jvm", 3)
    yield n
    n.stop()


@pytest.fixture(scope="module")
def history(node):
    """Schema versions mixed inside segments: the schema changes before the second offload,
    so its segments hold rows of versions 1..4; updates and deletes cross segments."""
    c = node.client()
    c.create_table("conf", [{"name": n, "type": t} for n, t in COLUMNS], "id", indexes=["loc", "s", "i32"])
    ts = {"v1": c.upsert("conf", make_rows(range(0, 1500), 1, 21))["commit_ts"]}
    c.admin("seal")
    c.admin("offload")
    ts["updated"] = c.upsert("conf", make_rows(range(1000, 2000), 2, 22))["commit_ts"]
    ts["deleted"] = c.delete("conf", list(range(0, 2000, 11)))["commit_ts"]
    c.add_column("conf", "extra", "float64")  # v2
    c.upsert("conf", [{"id": 3000 + i, "s": f"v2-{i}", "extra": i / 3} for i in range(40)])
    c.rename_column("conf", "s", "label")  # v3
    c.upsert("conf", [{"id": 3100 + i, "label": f"v3-{i}", "i8": -i} for i in range(40)])
    c.delete("conf", [3000, 3101])
    c.drop_column("conf", "i8")  # v4
    rows = make_rows(range(1800, 2600), 3, 23)
    for r in rows:
        r["label"] = r.pop("s")
        r.pop("i8")
        r["extra"] = None if r["id"] % 5 == 0 else r["id"] / 4
    ts["evolved"] = c.upsert("conf", rows)["commit_ts"]
    c.admin("seal")
    c.admin("offload")
    ts["tail"] = c.upsert("conf", [{"id": 5000 + i, "label": f"t{i}", "extra": 1.5} for i in range(50)])["commit_ts"]
    c.close()
    return ts


def read(spark, node, table, reader, **opts):
    r = (spark.read.format("terrascale").option("endpoint", node.base).option("table", table)
         .option("reader", reader))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def both(spark, node, table, **opts):
    return [spark_rows(read(spark, node, table, reader, **opts), "id") for reader in ("jvm", "python")]


def test_the_session_serves_terrascale_from_the_jvm(spark, node, history):
    assert spark_bridge.jvm_jar() is not None, "run `make jvm` (make test does): the JVM reader's jar is missing"
    assert spark_bridge.jvm_reader(spark)
    plan = read(spark, node, "conf", "auto")._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan terrascale:conf" in plan and "ColumnarToRow" in plan


@pytest.mark.parametrize("stage", ["v1", "updated", "deleted", "evolved", "tail", None])
def test_jvm_rows_equal_python_rows_at_every_stage(spark, node, history, stage):
    as_of = {} if stage is None else {"as_of": history[stage]}
    jvm, py = both(spark, node, "conf", **as_of)
    assert jvm == py and len(jvm) > 900
    assert read(spark, node, "conf", "jvm", **as_of).schema == read(spark, node, "conf", "python", **as_of).schema
    sealed_jvm, sealed_py = both(spark, node, "conf", sealed_only="true", **as_of)
    assert sealed_jvm == sealed_py and len(sealed_jvm) > 400  # decoded from the objects alone
    c = node.client()
    assert jvm == api_rows(c.query("conf", as_of=as_of.get("as_of"), limit=10_000), "id")
    c.close()


def test_segments_hold_several_schema_versions(node, history):
    c = node.client()
    segs = [s for s in c.segments("conf")["segments"] if s["state"] == "offloaded"]
    c.close()
    versions = set()
    for s in segs:
        seg = _open_segment(node, s["location"])
        versions.update(seg.footer.versions)
    assert len(versions) >= 3


@pytest.mark.parametrize("opts", [
    {"where": "i32 > 0 and label >= 'name-15'"},
    {"where": "u64 >= 9223372036854775808 and ts < 2000-01-01T00:00:00Z"},
    {"where": "ri = 1500 and rt > 1970-01-01T00:00:01Z"},
    {"where": "u = 00000000-0000-0000-0000-000000000000", "sealed_only": "true"},
    {"bbox": "loc:-3,-3,5,5", "columns": "label,loc,u8"},
    {"bbox": "bx:0,1,50,1.5", "where": "b = true"},
    {"where": "d >= 1990-01-01 and f64 < 0 and u16 != 7"},
])
def test_where_bbox_and_columns_options(spark, node, history, opts):
    key = "label" if "columns" in opts else "id"
    jvm = sorted(read(spark, node, "conf", "jvm", **opts).toArrow().to_pylist(), key=lambda r: str(r[key]))
    py = sorted(read(spark, node, "conf", "python", **opts).toArrow().to_pylist(), key=lambda r: str(r[key]))
    assert jvm == py


def test_spark_filters_are_pushed_and_rechecked(spark, node, history):
    df = read(spark, node, "conf", "jvm")
    q = "i32 > 0 and label >= 'name-15' and d < date'2030-01-01' and ts >= timestamp'1990-01-01 00:00:00' and b"
    plan = df.where(q)._jdf.queryExecution().executedPlan().toString()
    assert "where=" in plan
    got = spark_rows(df.where(q), "id")
    want = spark_rows(read(spark, node, "conf", "python").where(q), "id")
    assert got == want and 20 < len(got) < 1500
    assert df.count() == read(spark, node, "conf", "python").count()  # the same DataFrame, unfiltered again


def test_large_segments_are_split_over_tasks_by_row_ranges(spark, node, history):
    whole = read(spark, node, "conf", "jvm", sealed_only="true")
    split = read(spark, node, "conf", "jvm", sealed_only="true", split_mib=0.01)
    assert split.rdd.getNumPartitions() > whole.rdd.getNumPartitions()
    assert spark_rows(split, "id") == spark_rows(whole, "id")
    assert split.where("i32 > 0").count() == whole.where("i32 > 0").count()


def test_counts_and_projections_match(spark, node, history):
    for stage in ("v1", "deleted", "evolved", "tail"):
        # count() without predicates comes from the plan's bitmaps and the tails, objects unread
        jvm = read(spark, node, "conf", "jvm", as_of=history[stage])
        assert jvm.count() == read(spark, node, "conf", "python", as_of=history[stage]).count()
        assert jvm.count() == len(jvm.select("id").collect())
    plan = read(spark, node, "conf", "jvm").groupBy().count()._jdf.queryExecution().executedPlan().toString()
    assert "BatchScan" in plan
    c = node.client()
    c.create_table("nothing", [{"name": "id", "type": "int64"}], "id")
    c.close()
    assert read(spark, node, "nothing", "jvm").count() == 0
    jvm = read(spark, node, "conf", "jvm").groupBy("b").count().orderBy("b").collect()
    py = read(spark, node, "conf", "python").groupBy("b").count().orderBy("b").collect()
    assert jvm == py


def test_stored_blocks_next_to_compressed_ones(spark, node):
    """Random binary does not compress: those blocks are stored as they are (no ZSTD flag)."""
    c = node.client()
    c.create_table("noise", [{"name": "id", "type": "int64"}, {"name": "blob", "type": "binary"},
                             {"name": "s", "type": "string"}], "id")
    rng = np.random.default_rng(5)
    import base64

    c.upsert("noise", [{"id": i, "blob": base64.b64encode(rng.bytes(3000)).decode(), "s": "x" * (i % 50)}
                       for i in range(3000)])
    c.upsert("noise", [{"id": 10_000 + i, "s": "compressible " * 50} for i in range(3000)])
    c.admin("seal")
    c.admin("offload")
    segs = [s for s in c.segments("noise")["segments"] if s["state"] == "offloaded"]
    c.close()
    flags = set()
    for s in segs:
        flags |= _block_flags(node, s["location"])
    assert any(f & Flags.ZSTD for f in flags) and any(not f & Flags.ZSTD for f in flags)
    jvm, py = both(spark, node, "noise")
    assert jvm == py and len(jvm) == 6000


def test_a_corrupted_byte_fails_the_task_naming_the_object(spark, node):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    c = node.client()
    c.create_table("broken", [{"name": "id", "type": "int64"}, {"name": "s", "type": "string"}], "id")
    c.upsert("broken", [{"id": i, "s": f"value {i}"} for i in range(5000)])
    c.admin("seal")
    c.admin("offload")
    seg = next(s for s in c.segments("broken")["segments"] if s["state"] == "offloaded")
    c.close()
    path = os.path.join(str(node.data / "objects"), seg["location"])
    for at, text in ((200, "checksum mismatch"), (os.path.getsize(path) - 10, "footer checksum mismatch")):
        with open(path, "r+b") as f:  # a flipped bit inside a block's payload, then in the footer
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x10]))
        with pytest.raises((PySparkException, Py4JJavaError)) as e:
            read(spark, node, "broken", "jvm", sealed_only="true").collect()
        msg = str(e.value)
        assert seg["location"] in msg and text in msg and "corrupt object" in msg, msg[-3000:]
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b)
    assert len(read(spark, node, "broken", "jvm").collect()) == 5000  # repaired: reads again


def _sealed(node, key):
    async def go():
        store = LocalObjectStore(str(node.data / "objects"))
        return await SealedFile.open(store, key)
    return asyncio.run(go())


def _open_segment(node, key):
    """A sealed segment of either format (a node writes columnar ones by default)."""
    from rowstore.segments.columnar import open_segment

    async def go():
        store = LocalObjectStore(str(node.data / "objects"))
        return await open_segment(await SealedFile.open(store, key))
    return asyncio.run(go())


def _block_flags(node, key) -> set[int]:
    sf = _sealed(node, key)
    raw = open(os.path.join(str(node.data / "objects"), key), "rb").read()
    return {parse_header(raw, int(p), key).flags for p in sf._blocks["physical"]}
