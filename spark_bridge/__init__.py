"""Spark over Terrascale tables: the data source ``terrascale`` (docs/spark.md; docs/REFERENCE.md §6) —
batch reads in the JVM where its jar is on the classpath (``spark_bridge/jvm``), else in this
PySpark Python data source, which also serves writes and the change feed.

    import spark_bridge
    spark_bridge.register(spark)
    df = (spark.read.format("terrascale").option("endpoint", "http://127.0.0.1:7400")
          .option("table", "trips").option("as_of", T).load())

Batch reads pin a snapshot and read offloaded segments straight from object storage on the
executors (``spark_bridge.reader``); ``df.write...mode("append").save()`` upserts
(``spark_bridge.writer``); ``spark.readStream`` with ``option("change_feed", "true")`` is the
change feed (``spark_bridge.changes``).
"""
from __future__ import annotations

__all__ = ["register", "jvm_jar", "jvm_reader", "TerrascaleDataSource"]

import os

_JAR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm", "build", "terrascale-spark.jar")
JVM_PROVIDER = "io.terrascale.spark.source.TerrascaleProvider"


def jvm_jar() -> str | None:
    """The JVM reader's jar (``make jvm`` builds it), or None when it was not built."""
    return _JAR if os.path.exists(_JAR) else None


def jvm_reader(spark) -> bool:
    """Whether ``spark``'s driver can load the JVM reader (its jar is on the classpath): then it
    serves ``format("terrascale")``, since Spark looks up JVM sources before Python ones."""
    try:
        return bool(spark._jvm.org.apache.spark.util.Utils.classIsLoadable(JVM_PROVIDER))
    except Exception:  # noqa: BLE001 - Spark Connect and other sessions without a py4j JVM
        return False


def register(spark) -> None:
    """Register the ``terrascale`` format with ``spark`` (a SparkSession).

    With the JVM reader's jar on the session's classpath (``local_session()`` puts it there;
    elsewhere add ``spark.jars``), batch reads run in the JVM; the Python data source is
    registered either way — it serves every read when the jar is absent, and writes, the change
    feed and ``option("reader", "python")`` always (docs/spark.md, "Readers")."""
    from spark_bridge.source import PythonReaderSource, TerrascaleDataSource

    if not jvm_reader(spark):  # Spark refuses a Python source under the name of a JVM one
        spark.dataSource.register(TerrascaleDataSource)
    spark.dataSource.register(PythonReaderSource)


def __getattr__(name: str):
    if name == "TerrascaleDataSource":
        from spark_bridge.source import TerrascaleDataSource

        return TerrascaleDataSource
    raise AttributeError(name)
