"""`terrascale ingest NAME FILE`: bulk load Parquet, CSV, Arrow IPC or NDJSON in batches.

Each batch of ``--batch-rows`` rows is sent as one Arrow IPC stream to
``POST /v1/tables/{t}/rows``, which is atomic and durable on return. Rows are
upserts by primary key, so re-running an interrupted ingest rewrites the rows it
had already loaded with the same values and yields the same table: no
bookkeeping, no duplicates (``tests/node/test_cli.py`` kills one mid-file and
re-runs it). Batches go in file order, one at a time, so when a key appears twice
in a file the later row wins, as it would in one batch; the next batch is read
and converted while the current one is in flight.

Values are converted to the table's column types on this side: Parquet and
Arrow carry their own types (the node accepts lossless conversions); CSV cells
are parsed as the column's type (``point``/``box``/``range``/``json`` cells hold
their JSON form, ``binary`` base64, ``uuid`` the canonical string); NDJSON lines
are JSON rows exactly as ``POST …/rows`` takes them.

On a cluster whose table is placed across nodes (docs/rfcs/0010-replication.md), each
batch is split by the node serving its rows' partitions (the table's description names
them; the partition hash is the format's) and the pieces go straight to those nodes at
once: each piece commits on one node, with no two-phase commit across nodes and no
forwarding hop. A piece is atomic, a batch as a whole no longer is — which re-running
covers as before; the next batch starts once every piece of this one is acknowledged, so
the later row of a key still wins. A node that cannot be reached directly (or no longer
serves the partition) gets its piece through ``--endpoint``, which routes it.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from node.client.client import Client
from node.errors import ApiError, NodeError, UsageError
from node.wire import column_from_json, rows_to_table
from rowstore.errors import RowValidationError
from rowstore.tables.key_check import check_key_columns
from rowstore.tables.keys import key_arrays, partitions_of
from rowstore.schema import PrimaryKey, SchemaVersion
from rowstore.types import ColumnType, Kind

_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "arrow", ".arrows": "arrow",
            ".ipc": "arrow", ".feather": "arrow", ".ndjson": "ndjson", ".jsonl": "ndjson", ".json": "ndjson"}
_CSV_NATIVE = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64,
               Kind.FLOAT32, Kind.FLOAT64, Kind.BOOL, Kind.STRING, Kind.TIMESTAMP, Kind.DATE}


class IngestError(NodeError):
    """Raised when the input file cannot be read or does not fit the table."""


def schema_of(desc: dict[str, Any]) -> SchemaVersion:
    """The table's current schema from ``GET /v1/tables/{t}``."""
    from rowstore.schema import Column

    cols = tuple(Column(c["id"], c["name"], ColumnType.parse(c["type"]), c["nullable"]) for c in desc["columns"])
    ids = {c.name: c.id for c in cols}
    keys = [desc["primary_key"]] if isinstance(desc["primary_key"], str) else desc["primary_key"]
    parts = len(desc.get("partition_key") or keys[:1])
    return SchemaVersion(desc["schema_version"], cols, tuple(ids[k] for k in keys), max(c.id for c in cols) + 1,
                         parts)


def detect_format(path: str, given: str | None) -> str:
    if given:
        return given
    fmt = _FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise IngestError(f"{path}: cannot tell the format from the extension; pass --format")
    return fmt


def count_rows(path: str, fmt: str) -> int | None:
    """The number of rows (exact for Parquet and Arrow files, lines for text; None if unknown)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        rows: int = pq.ParquetFile(path).metadata.num_rows
        return rows
    if fmt == "arrow":
        try:
            with pa.ipc.open_file(path) as r:
                rows = sum(r.get_record_batch(i).num_rows for i in range(r.num_record_batches))
                return rows
        except pa.ArrowInvalid:
            return None  # a stream: no footer to count from
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    n += last != b"\n"
    return max(n - (fmt == "csv"), 0)


def batches(path: str, fmt: str, schema: SchemaVersion, batch_rows: int) -> Iterator[pa.Table]:
    """Yield Arrow tables of at most ``batch_rows`` rows, in file order."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        for b in pq.ParquetFile(path).iter_batches(batch_size=batch_rows):
            yield pa.Table.from_batches([b])
    elif fmt == "arrow":
        yield from _rebatch(_arrow_batches(path), batch_rows)
    elif fmt == "csv":
        yield from _rebatch(_csv_batches(path, schema), batch_rows)
    else:
        yield from _ndjson(path, schema, batch_rows)


def _arrow_batches(path: str) -> Iterator[pa.RecordBatch]:
    try:
        r = pa.ipc.open_file(path)
        for i in range(r.num_record_batches):
            yield r.get_record_batch(i)
    except pa.ArrowInvalid:
        with pa.ipc.open_stream(pa.OSFile(path)) as s:
            yield from s


def _rebatch(it: Iterable[pa.RecordBatch], n: int) -> Iterator[pa.Table]:
    buf: list[pa.RecordBatch] = []
    have = 0
    for b in it:
        while b.num_rows:
            take = min(n - have, b.num_rows)
            buf.append(b.slice(0, take))
            have += take
            b = b.slice(take)
            if have == n:
                yield pa.Table.from_batches(buf)
                buf, have = [], 0
    if have:
        yield pa.Table.from_batches(buf)


def _csv_batches(path: str, schema: SchemaVersion) -> Iterator[pa.RecordBatch]:
    import pyarrow.csv as pacsv

    types = {c.name: c.type.arrow() if c.type.kind in _CSV_NATIVE else pa.string() for c in schema.columns}
    reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=4 << 20),
                            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=True))
    base = 0
    for b in reader:
        yield _csv_convert(b, schema, base)
        base += b.num_rows


def _csv_convert(b: pa.RecordBatch, schema: SchemaVersion, base: int) -> pa.RecordBatch:
    """CSV string cells of non-native types as their column type (JSON text, base64, uuid)."""
    arrays, fields = [], []
    for name, arr in zip(b.schema.names, b.columns):
        col = schema.by_name(name)
        if col is not None and col.type.kind not in _CSV_NATIVE:
            vals = arr.to_pylist()
            if col.type.kind in (Kind.POINT, Kind.BOX, Kind.RANGE, Kind.JSON):
                try:
                    vals = [None if v is None else json.loads(v) for v in vals]
                except ValueError as e:
                    raise RowValidationError(f"column {name!r} (rows {base}..): cells must be JSON: {e}") from None
            arr = column_from_json(vals, col)
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def _ndjson(path: str, schema: SchemaVersion, n: int) -> Iterator[pa.Table]:
    rows: list[dict[str, Any]] = []
    first = 1
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise IngestError(f"{path}:{lineno}: not a JSON object: {e}") from None
            if len(rows) == n:
                yield _ndjson_table(rows, schema, path, first)
                rows, first = [], lineno + 1
    if rows:
        yield _ndjson_table(rows, schema, path, first)


def _ndjson_table(rows: list[dict[str, Any]], schema: SchemaVersion, path: str, first: int) -> pa.Table:
    try:
        return rows_to_table(rows, schema)
    except RowValidationError as e:
        raise IngestError(f"{path} (batch from line {first}): {e}") from None


def ingest(client: Client, args: argparse.Namespace) -> int:
    if args.batch_rows < 1:
        raise UsageError("--batch-rows must be at least 1")
    if not os.path.isfile(args.file):
        raise IngestError(f"{args.file}: no such file")
    fmt = detect_format(args.file, args.format)
    schema = schema_of(client.describe(args.name))
    total = count_rows(args.file, fmt)
    from tqdm import tqdm

    bar = tqdm(total=total, unit=" rows", unit_scale=True, desc=f"ingest {args.name}", file=sys.stderr,
               disable=args.no_progress, dynamic_ncols=True, smoothing=0.1)
    committed, n_batches, last_ts, t0 = 0, 0, None, time.perf_counter()
    it = batches(args.file, fmt, schema, args.batch_rows)
    routes = Routes.of(client, args.name, schema)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            nxt = pool.submit(_next, it)
            while True:
                t = nxt.result()
                if t is None:
                    break
                nxt = pool.submit(_next, it)  # read and convert the next batch while this one is sent
                n, ts = routes.upsert(args.name, t) if routes else _one(client, args.name, t)
                committed += n
                n_batches += 1
                last_ts = ts
                bar.update(t.num_rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, UnicodeDecodeError) as e:
        raise IngestError(f"{args.file}: {str(e).splitlines()[0]}") from None
    except RowValidationError as e:
        raise IngestError(f"{args.file}: {e}") from None
    finally:
        bar.close()
        if routes:
            routes.close()
    took = time.perf_counter() - t0
    print(f"ingested {committed} rows in {n_batches} batches into {args.name} in {took:.1f}s "
          f"({committed / took if took else 0:,.0f} rows/s); last commit_ts {last_ts}", file=sys.stderr)
    return 0


def _next(it: Iterator[pa.Table]) -> pa.Table | None:
    return next(it, None)


def _one(client: Client, name: str, t: pa.Table) -> tuple[int, int]:
    res = client.upsert(name, t)
    return res["committed"], res["commit_ts"]


class Routes:
    """Which node serves each partition of a table placed across a cluster, and a client for
    each: a batch is split by node and the pieces sent at once."""

    def __init__(self, client: Client, leaders: list[str], addresses: dict[str, str], pk: PrimaryKey) -> None:
        self.client, self.leaders, self.pk = client, np.array(leaders), pk
        self.nodes = {n: type(client)(addresses[n], token=client.token, timeout=client.timeout)
                      for n in set(leaders)}
        self.pool = concurrent.futures.ThreadPoolExecutor(len(self.nodes))

    @classmethod
    def of(cls, client: Client, name: str, schema: SchemaVersion) -> "Routes | None":
        """Routes when the table's partitions are on several nodes with known addresses."""
        place = client.describe(name).get("placement") or []
        leaders = [p["leader"] for p in place]
        if len(set(leaders)) < 2:
            return None
        try:
            addresses = {m["id"]: m.get("address") for m in client.cluster()["members"]}
        except (ApiError, ConnectionError, KeyError):
            return None
        if any(not addresses.get(n) for n in leaders):
            return None
        return cls(client, leaders, addresses, schema.pk)

    def upsert(self, name: str, t: pa.Table) -> tuple[int, int]:
        """(rows committed, the largest commit_ts) once every node's piece is acknowledged."""
        arrays = check_key_columns(key_arrays(self.pk, t), self.pk, "rows")
        who = self.leaders[partitions_of(self.pk, arrays, len(self.leaders))]
        pieces = [(n, t.filter(pa.array(who == n))) for n in np.unique(who).tolist()]
        got = [f.result() for f in [self.pool.submit(self._send, n, name, piece) for n, piece in pieces]]
        return sum(n for n, _ in got), max(ts for _, ts in got)

    def _send(self, node: str, name: str, piece: pa.Table) -> tuple[int, int]:
        try:
            return _one(self.nodes[node], name, piece)
        except ConnectionError:
            return _one(self.client, name, piece)  # unreachable from here: through --endpoint
        except ApiError as e:
            if e.status not in (421, 503):
                raise
            return _one(self.client, name, piece)  # moved, or not ready: --endpoint routes it

    def close(self) -> None:
        self.pool.shutdown()
        for c in self.nodes.values():
            c.close()
