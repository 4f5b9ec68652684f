"""The change feed (``option("change_feed", "true")``): every row change committed in a
timestamp interval, in commit order, with ``commit_ts`` and ``op`` ("upsert" or "delete").

As a stream (``spark.readStream``) the offsets are closed commit timestamps ``{"ts": T}``
(the newest commit of the table at or below the closed timestamp): each micro-batch reads
the changes in (previous offset, new offset]. At or below a closed timestamp nothing can
still appear, so re-reading an interval after a restart returns
exactly the same rows — that, and Spark's offset log in the checkpoint, make the feed
exactly once. As a batch read, ``after`` and ``as_of`` bound the interval.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType

from rowstore.schema import SchemaVersion
from spark_bridge.errors import BridgeError
from spark_bridge.options import Options
from spark_bridge.remote import Remote
from spark_bridge.types import select_columns, spark_arrow_schema, to_spark_batch

FEED_FIELDS = [StructField("commit_ts", LongType(), False), StructField("op", StringType(), False)]
_COLUMN_ID = b"terrascale.column_id"


def check_feed_columns(schema: SchemaVersion, table: str) -> None:
    clash = [c.name for c in schema.columns if c.name.lower() in ("commit_ts", "op")]
    if clash:
        raise BridgeError(f"table {table!r} has a column named {clash[0]!r}, which the change feed uses for "
                          f"itself (commit_ts, op); rename it to read the feed")


@dataclass
class ChangesPartition(InputPartition):
    after: int
    upto: int


def read_changes(opts: Options, pinned_json: str, schema: StructType, after: int,
                 upto: int) -> Iterator[pa.RecordBatch]:
    """The changes in (after, upto] as batches of ``schema`` — the table's columns when the
    read started, matched by column id (renamed columns follow, dropped ones are null, ones
    added since are left out) — then commit_ts and op."""
    pinned = SchemaVersion.from_json(pinned_json)
    keep = select_columns(pinned, opts.columns)
    with Remote(opts) as r:
        t = r.changes(after, upto)
    if t.num_rows == 0:
        return
    by_id = {int(f.metadata[_COLUMN_ID]): i for i, f in enumerate(t.schema) if f.metadata and _COLUMN_ID in f.metadata}
    cols = []
    for c in keep:
        i = by_id.get(c.id)
        cols.append(t.column(i) if i is not None else pa.nulls(t.num_rows, c.type.arrow()))
    cols += [t.column("commit_ts"), t.column("op")]
    table = pa.Table.from_arrays(cols, names=[c.name for c in keep] + ["commit_ts", "op"])
    kinds = [c.type for c in keep]
    arrow = spark_arrow_schema(schema)
    for b in table.to_batches(max_chunksize=65_536):
        yield to_spark_batch(b, kinds, arrow)


class ChangesReader(DataSourceReader):
    """A batch read of the feed: the changes in (``after``, ``as_of``]."""

    def __init__(self, opts: Options, schema: StructType, as_of: int, pinned_json: str):
        self.opts, self.schema, self.as_of, self.pinned_json = opts, schema, as_of, pinned_json
        if opts.after > as_of:
            raise BridgeError(f"option after ({opts.after}) is later than as_of ({as_of})")

    def partitions(self) -> list[InputPartition]:
        return [ChangesPartition(self.opts.after, self.as_of)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_changes(self.opts, self.pinned_json, self.schema, partition.after, partition.upto)


class ChangeFeedStream(DataSourceStreamReader):
    """Offsets ``{"ts": T}`` are closed commit timestamps; one partition per micro-batch keeps
    the changes in commit order."""

    def __init__(self, opts: Options, schema: StructType, pinned_json: str):
        self.opts, self.schema, self.pinned_json = opts, schema, pinned_json

    def _latest(self) -> int:
        """The newest closed commit of the table: the closed timestamp keeps up with the clock
        on an idle node, and an offset that moved without changes would make Spark run an
        empty micro-batch at every trigger."""
        with Remote(self.opts) as r:
            return r.snapshot(None)["changed_ts"]

    def initialOffset(self) -> dict:
        s = self.opts.starting_ts
        if s == "earliest":
            return {"ts": 0}
        if s == "latest":
            with Remote(self.opts) as r:
                return {"ts": r.snapshot(None)["as_of"]}
        return {"ts": int(s)}

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:
        # Offsets never move back (the max guards against a node whose clock is behind the
        # one that answered before: another node of a cluster, say).
        return {"ts": max(self._latest(), int(start["ts"]) if start else 0)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        a, b = int(start["ts"]), int(end["ts"])
        return [ChangesPartition(a, b)] if b > a else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield from read_changes(self.opts, self.pinned_json, self.schema, partition.after, partition.upto)

    def commit(self, end: dict) -> None:
        """Nothing to release: the feed is read from immutable history."""
