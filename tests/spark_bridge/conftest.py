"""One local SparkSession for every Spark test (start-up costs 10-20 s and ~2 GiB), and
helpers that compare what Spark reads with what the node's HTTP API returns."""
from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pyarrow as pa
import pytest

from bench.node_proc import NodeProc
from spark_bridge.session import local_session


@pytest.fixture(scope="session")
def spark():
    # local[2,2]: two cores; a failed task is retried once (the write-retry test needs it)
    s = local_session(cores=2, max_failures=2)
    yield s
    s.stop()


def started_node(tmp_path_factory, name: str, partitions: int) -> NodeProc:
    """A node process for one test module, its tables split into ``partitions``."""
    return NodeProc(tmp_path_factory.mktemp(name), extra=f"[tables]\npartitions = {partitions}\n").start()


def api_rows(t: pa.Table, key: str) -> list[dict]:
    """The HTTP API's Arrow rows as the Python values Spark's mapping promises (docs/spark.md),
    converted value by value here — independently of the bridge's vectorized code."""
    out = []
    for row in t.to_pylist():
        out.append({k: _spark_value(t.schema.field(k), v) for k, v in row.items()})
    return sorted(out, key=lambda r: (r[key] is None, r[key]))


def _spark_value(field: pa.Field, v):
    if v is None:
        return None
    logical = (field.metadata or {}).get(b"terrascale.type", b"").decode()
    if logical == "uuid":
        return str(uuid.UUID(bytes=v))
    if logical == "uint64":
        return decimal.Decimal(v)
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return v.replace(tzinfo=dt.timezone.utc)
    if isinstance(v, dict):
        return {k: (x.replace(tzinfo=dt.timezone.utc) if isinstance(x, dt.datetime) and x.tzinfo is None else x)
                for k, x in v.items()}
    return v


def spark_rows(df, key: str) -> list[dict]:
    """The DataFrame's rows via Arrow (timestamps stay UTC-aware), sorted by key."""
    return sorted(df.toArrow().to_pylist(), key=lambda r: r[key])
