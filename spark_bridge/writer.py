"""Bulk writes: ``df.write.format("terrascale").option(...).mode("append").save()``.

Each task converts its Arrow batches to the table's types and sends them to the node's
ingest endpoint (``POST /v1/tables/{t}/rows``, an Arrow IPC stream; any node routes its
rows by partition) in requests of ``batch_rows`` rows. A request is atomic and durable
when it returns, and rows are upserted by primary key: a retried task (or a re-run job)
sends the same rows again and replaces them with themselves — no duplicates. The job as a
whole is not atomic: when a job fails, the requests that already returned stay written.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from rowstore.schema import SchemaVersion
from spark_bridge.errors import BridgeError
from spark_bridge.options import Options
from spark_bridge.remote import Remote
from spark_bridge.types import to_table_batch

log = logging.getLogger("spark_bridge.writer")


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote."""

    partition: int
    attempt: int
    rows: int
    requests: int
    max_commit_ts: int


class TerrascaleWriter(DataSourceArrowWriter):
    def __init__(self, opts: Options, schema: StructType):
        self.opts = opts
        with Remote(opts) as r:
            self.table_schema = r.snapshot(None)["schema"]  # the current schema, with its column ids
        self.report: dict | None = None
        table = SchemaVersion.from_json(self.table_schema)
        names = {c.name.lower() for c in table.columns}
        extra = [f.name for f in schema.fields if f.name.lower() not in names]
        if extra:
            raise BridgeError(f"table {opts.table!r} has no column(s) {', '.join(extra)} "
                              f"(its columns: {', '.join(c.name for c in table.columns)})")
        missing = [k for k in table.pk.names if k.lower() not in {f.name.lower() for f in schema.fields}]
        if missing:
            raise BridgeError(f"the DataFrame has no column {missing[0]!r}, of the table's primary key")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        schema = SchemaVersion.from_json(self.table_schema)
        rows = requests = max_ts = 0
        pending: list[pa.RecordBatch] = []
        with Remote(self.opts) as r:
            def flush():
                nonlocal rows, requests, max_ts, pending
                if not pending:
                    return
                batch = pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
                res = r.upsert(batch)
                rows += res["committed"]
                requests += 1
                max_ts = max(max_ts, res["commit_ts"])
                pending = []

            n = 0
            for b in iterator:
                if b.num_rows == 0:
                    continue
                pending.append(to_table_batch(b, schema))
                n += b.num_rows
                if n >= self.opts.batch_rows:
                    flush()
                    n = 0
            flush()
        return WriteReport(ctx.partitionId() if ctx else 0, ctx.attemptNumber() if ctx else 0, rows, requests, max_ts)

    def commit(self, messages: list[WriteReport | None]) -> None:
        done = [m for m in messages if m is not None]
        self.report = {"table": self.opts.table, "rows": sum(m.rows for m in done), "tasks": len(done),
                       "requests": sum(m.requests for m in done),
                       "max_commit_ts": max((m.max_commit_ts for m in done), default=0)}
        log.warning("event=spark_write_committed table=%s rows=%d tasks=%d requests=%d max_commit_ts=%d",
                    *self.report.values())

    def abort(self, messages: list[WriteReport | None]) -> None:
        done = [m for m in messages if m is not None]
        log.warning("event=spark_write_aborted table=%s rows_already_written=%d tasks_done=%d (rows written by "
                    "finished requests stay; re-running the job is safe: upserts by key)",
                    self.opts.table, sum(m.rows for m in done), len(done))

