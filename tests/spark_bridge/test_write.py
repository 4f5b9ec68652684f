"""Bulk writes through Spark: every column type survives a round trip (read a table with
the bridge, write it into another, both equal through the HTTP API); a task that fails after
some of its rows were committed is retried without duplicating a row; the driver's commit
reports the rows written; overwrite and unknown columns are refused with a clear error."""
from __future__ import annotations


import pyarrow as pa
import pytest

from spark_bridge.options import Options
from spark_bridge.writer import TerrascaleWriter
from tests.spark_bridge.conftest import api_rows, started_node
from tests.spark_bridge.test_read import COLUMNS, make_rows

N = 4000


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = started_node(tmp_path_factory, "spark-write", 4)
    c = n.client()
    for name in ("src", "dst"):
        c.create_table(name, [{"name": a, "type": t} for a, t in COLUMNS], "id")
    c.upsert("src", make_rows(range(1500), 1, 3))
    c.admin("seal")
    c.admin("offload")
    c.upsert("src", make_rows(range(1000, 2000), 2, 4))
    c.create_table("kv", [{"name": "id", "type": "int64"}, {"name": "v", "type": "int64"},
                          {"name": "attempt", "type": "int32"}, {"name": "pad", "type": "string"}], "id")
    c.close()
    yield n
    n.stop()


def fmt(spark, node, table):
    return spark.read.format("terrascale").option("endpoint", node.base).option("table", table)


def test_round_trip_of_every_type(spark, node):
    src = fmt(spark, node, "src").load()
    src.write.format("terrascale").option("endpoint", node.base).option("table", "dst").option(
        "batch_rows", "700").mode("append").save()
    c = node.client()
    assert api_rows(c.query("dst", limit=10_000), "id") == api_rows(c.query("src", limit=10_000), "id")
    assert c.query("dst", limit=10_000).num_rows == 2000
    c.close()


def flaky_source():
    """``terrascale`` whose writer, in the first attempt of task 0, fails right after the real
    writer has committed every row of the task — the worst case for a retry (an executor lost
    before it reported success). Made in a function so that it travels to workers by value."""
    from pyspark import TaskContext

    from spark_bridge.source import TerrascaleDataSource

    class FlakyWriter(TerrascaleWriter):
        def write(self, iterator):
            msg = super().write(iterator)
            ctx = TaskContext.get()
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
                raise RuntimeError(f"injected failure after committing {msg.rows} rows")
            return msg

    class FlakySource(TerrascaleDataSource):
        @classmethod
        def name(cls):
            return "terrascale_flaky_write"

        def writer(self, schema, overwrite):
            return FlakyWriter(self._opts(), schema)

    return FlakySource


def test_a_retried_task_does_not_duplicate_rows(spark, node):
    """Task 0 commits all its rows, then fails; Spark retries it (local[2,2]) and the retry
    sends every row again: each key is in the table once, with the retry's values."""
    from pyspark import TaskContext

    def with_attempt(keys):
        attempt = TaskContext.get().attemptNumber()
        for k in keys:
            yield (k, k * 10, attempt, "x")

    spark.dataSource.register(flaky_source())
    df = spark.createDataFrame(spark.sparkContext.parallelize(range(N), 2).mapPartitions(with_attempt),
                               "id long, v long, attempt int, pad string")
    df.write.format("terrascale_flaky_write").option("endpoint", node.base).option("table", "kv").option(
        "batch_rows", "500").mode("append").save()
    c = node.client()
    t = c.query("kv", limit=10 * N)
    assert sorted(t.column("id").to_pylist()) == list(range(N))  # every row once
    assert t.column("v").to_pylist() == [k * 10 for k in t.column("id").to_pylist()]
    rows = dict(zip(t.column("id").to_pylist(), t.column("attempt").to_pylist()))
    assert {rows[k] for k in range(N // 2)} == {1} and {rows[k] for k in range(N // 2, N)} == {0}
    feed = c._call("POST", "/v1/tables/kv/changes", {"after": 0}, arrow=True)
    written = sorted(zip(feed.column("id").to_pylist(), feed.column("attempt").to_pylist()))
    assert written == sorted([(k, 0) for k in range(N)] + [(k, 1) for k in range(N // 2)])  # task 0 sent twice
    c.close()


def test_the_drivers_commit_reports_rows_written(node):
    opts = Options.parse({"endpoint": node.base, "table": "kv", "batch_rows": "300"})
    from pyspark.sql.types import LongType, StructField, StructType

    w = TerrascaleWriter(opts, StructType([StructField("id", LongType()), StructField("v", LongType())]))
    batches = [pa.RecordBatch.from_pydict({"id": list(range(i, i + 200)), "v": [7] * 200}) for i in range(0, 1000, 200)]
    msg = w.write(iter(batches))
    assert (msg.rows, msg.requests) == (1000, 3)  # requests of 400, 400 and 200 rows (300-row threshold)
    w.commit([msg, None])
    assert w.report["rows"] == 1000 and w.report["tasks"] == 1 and w.report["max_commit_ts"] == msg.max_commit_ts


def test_overwrite_and_unknown_columns_are_refused(spark, node):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    df = spark.createDataFrame([(1, 2)], "id long, v long")
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        df.write.format("terrascale").option("endpoint", node.base).option("table", "kv").mode("overwrite").save()
    assert "mode('overwrite') is not supported" in str(e.value)
    bad = spark.createDataFrame([(1, 2)], "id long, nope long")
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        bad.write.format("terrascale").option("endpoint", node.base).option("table", "kv").mode("append").save()
    assert "has no column(s) nope" in str(e.value)
    wrong = spark.createDataFrame([(1, -1)], "id long, u8 int")
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        wrong.write.format("terrascale").option("endpoint", node.base).option("table", "dst").mode("append").save()
    assert "column 'u8'" in str(e.value)


def test_spark_refuses_the_other_save_modes_before_writing(spark, node):
    """pyspark allows only append and overwrite for a Python data source: the default mode
    (errorifexists) and ignore fail with Spark's own error, and nothing is written."""
    from pyspark.errors import AnalysisException

    df = spark.createDataFrame([(900_001, 1)], "id long, v long")
    w = df.write.format("terrascale").option("endpoint", node.base).option("table", "kv")
    for mode in ("errorifexists", "ignore"):
        with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            w.mode(mode).save()
    assert node.client().get("kv", 900_001) is None
