"""Spark over Terrascale tables: a PySpark Python data source named ``terrascale``
(docs/spark.md; CONTRACT.md §5).

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

__all__ = ["register", "TerrascaleDataSource"]


def register(spark) -> None:
    """Register the ``terrascale`` format with ``spark`` (a SparkSession)."""
    from spark_bridge.source import TerrascaleDataSource

    spark.dataSource.register(TerrascaleDataSource)


def __getattr__(name: str):
    if name == "TerrascaleDataSource":
        from spark_bridge.source import TerrascaleDataSource

        return TerrascaleDataSource
    raise AttributeError(name)
