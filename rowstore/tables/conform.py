"""Rows coming in: conform an Arrow batch to a table schema, keys from user values.

A batch is checked whole before anything is written (docs/REFERENCE.md §3): an unknown
column, a missing or null primary key, or a value of the wrong type rejects it.
Lossless conversions between Arrow types of the same family are applied (int32
data for an int64 column, large_string for string, timestamps in another unit
or zone); anything else is a wrong type.
"""
from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.tables import json_text
from rowstore.errors import RowValidationError
from rowstore.tables.key_check import check_keys
from rowstore.codec.rows import Encoded, encode_rows
from rowstore.schema import Column, SchemaVersion
from rowstore.types import Kind



def conform(data: pa.RecordBatch | pa.Table, schema: SchemaVersion) -> pa.RecordBatch:
    """``data`` as one record batch with exactly the schema's columns and Arrow types."""
    if isinstance(data, pa.Table):
        data = data.combine_chunks()
        data = data.to_batches()[0] if data.num_rows else pa.RecordBatch.from_pylist([], schema=data.schema)
    names = data.schema.names
    if len(set(names)) != len(names):
        raise RowValidationError("a column appears twice in the batch")
    unknown = [n for n in names if schema.by_name(n) is None]
    if unknown:
        raise RowValidationError(f"unknown column(s): {', '.join(sorted(unknown))}")
    pk = schema.pk
    missing = [n for n in pk.names if n not in names]
    if missing:
        raise RowValidationError(f"the primary key column {missing[0]!r} is missing")
    key_ids, nul_ok = set(pk.ids), pk.kind == "tuple"
    cols = []
    for c in schema.columns:
        i = data.schema.get_field_index(c.name)
        arr = data.column(i) if i >= 0 else pa.nulls(data.num_rows, c.type.arrow())
        key = c.id in key_ids
        arr = check_keys(arr, c, "rows", False, nul_ok) if key else _in_range(_cast(arr, c), c)
        if arr.null_count and (not c.nullable or key):
            what = "the primary key" if key else "a not-null column"
            raise RowValidationError(f"column {c.name!r} is {what} and has null values")
        cols.append(arr)
    return pa.RecordBatch.from_arrays(cols, schema=schema.arrow())


def _cast(arr: pa.Array, col: Column) -> pa.Array:
    want = col.type.arrow()
    if arr.type.equals(want):
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), want)
    if not _same_family(arr.type, want):
        raise RowValidationError(f"column {col.name!r}: {arr.type} values do not fit type {col.type}")
    try:
        if col.type.kind == Kind.UUID:
            return _uuid_array(arr, col)
        return arr.cast(want, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise RowValidationError(f"column {col.name!r}: cannot convert {arr.type} to {col.type}: {e}") from e


# Timestamps and dates a row can hold: what ISO-8601 (years 0001-9999) and the JSON output can
# write back; an int64 of microseconds reaches far beyond, and such a row could never be read.
TS_RANGE_US = (-62_135_596_800_000_000, 253_402_300_799_999_999)  # 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z
DATE_RANGE_DAYS = (-719_162, 2_932_896)  # 0001-01-01 .. 9999-12-31


def _in_range(arr: pa.Array, col: Column) -> pa.Array:
    """``arr`` unchanged, or a RowValidationError when a timestamp or date (or a timestamp
    range's bound) lies outside years 0001-9999, or a json value is not strict JSON."""
    k = col.type.kind
    if k == Kind.JSON:
        return _json_texts(arr, col)
    if k == Kind.RANGE and col.type.elem == Kind.TIMESTAMP:
        parts = [arr.field("lower"), arr.field("upper")]
    elif k in (Kind.TIMESTAMP, Kind.DATE):
        parts = [arr]
    else:
        return arr
    lo, hi = DATE_RANGE_DAYS if k == Kind.DATE else TS_RANGE_US
    for p in parts:
        mm = pc.min_max(p.cast(pa.int32() if k == Kind.DATE else pa.int64()))
        if mm["min"].is_valid and (mm["min"].as_py() < lo or mm["max"].as_py() > hi):
            raise RowValidationError(f"column {col.name!r}: a {col.type} value lies outside years 0001-9999 "
                                     f"(min {mm['min'].as_py()}, max {mm['max'].as_py()} "
                                     f"{'days' if k == Kind.DATE else 'µs'} since 1970)")
    return arr


def _json_texts(arr: pa.Array, col: Column) -> pa.Array:
    """A json column's texts, each strict JSON nested at most ``json_text.MAX_VALUE_DEPTH``
    deep (Arrow bodies send text; a value that is not JSON could never be read back)."""
    for i, text in enumerate(arr.to_pylist()):
        if text is not None:
            try:
                json_text.loads(text, json_text.MAX_VALUE_DEPTH)
            except json_text.JsonTextError as e:
                raise RowValidationError(f"column {col.name!r}, row {i}: the value {e}") from None
    return arr


def _same_family(got: pa.DataType, want: pa.DataType) -> bool:
    t = pa.types
    fams = [(t.is_integer, t.is_integer), (t.is_integer, t.is_floating), (t.is_floating, t.is_floating),
            (_stringish, _stringish), (_binaryish, _binaryish), (t.is_timestamp, t.is_timestamp),
            (t.is_date, t.is_date), (t.is_struct, t.is_struct), (_stringish, t.is_fixed_size_binary)]
    return any(a(got) and b(want) for a, b in fams)


def _stringish(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _binaryish(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t))


def _uuid_array(arr: pa.Array, col: Column) -> pa.Array:
    if _stringish(arr.type):
        try:
            return pa.array([None if v is None else uuidlib.UUID(v).bytes for v in arr.to_pylist()], pa.binary(16))
        except ValueError as e:
            raise RowValidationError(f"column {col.name!r}: a value is not a uuid ({e})") from None
    got = arr.cast(pa.binary())
    lens = np.asarray(pc.binary_length(got).fill_null(16))
    if (lens != 16).any():
        raise RowValidationError(f"column {col.name!r}: uuid values are 16 bytes")
    return got.cast(pa.binary(16))


_STAMP_LOOP = 32  # up to this many rows a Python loop beats the kernel's dispatch (~25 µs)


def stamp(enc: Encoded, ts: int) -> None:
    """Write the commit timestamp into every encoded row's header."""
    n = len(enc.starts)
    ts8 = np.frombuffer(np.uint64(ts).tobytes(), np.uint8)
    if 0 < n <= _STAMP_LOOP:
        for s in enc.starts.tolist():
            enc.buf[s + 8 : s + 16] = ts8  # commit_ts within a row header (docs/format/segment.md §1)
    elif n:
        _stamp(enc.buf, enc.starts, ts8)


@numba.njit(cache=True, nogil=True)
def _stamp(buf: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ts8: npt.NDArray[np.uint8]) -> None:
    for i in range(starts.shape[0]):
        s = starts[i] + 8  # commit_ts within a row header (docs/format/segment.md §1)
        for q in range(8):
            buf[s + q] = ts8[q]


@dataclass(frozen=True)
class PartitionShare:
    """One partition's share of a batch: its encoded keys, deletion flags and encoded rows,
    and the columns applying needs — rows ``pos`` of ``batch`` (all of it when None), not
    taken: the column index takes them only if a query or a checkpoint needs them."""

    pid: int
    keys: np.ndarray
    deleted: np.ndarray | None
    enc: Encoded
    batch: pa.RecordBatch
    pos: np.ndarray | None

    @property
    def rows(self) -> int:
        return len(self.keys)


def split_by_partition(batch: pa.RecordBatch, schema: SchemaVersion, keys: np.ndarray,
                       deleted: np.ndarray | None, pids: np.ndarray, keep: list[str]) -> list[PartitionShare]:
    """The batch regrouped by partition, in key order within each (``keys`` are distinct),
    and encoded straight into that order; every piece is a zero-copy slice of the encoding,
    and of the columns applying needs (``keep``) or, when rows moved, their positions.

    Key order costs one sort here and saves the sort of every piece when the event loop
    inserts it into the key index's memtable."""
    order = None if _ascending(keys) else np.argsort(keys)
    if len(pids) and not (pids == pids[0]).all():
        p = pids if order is None else pids[order]
        order = partition_order(p) if order is None else order[partition_order(p)]
    enc = encode_rows(batch, schema, 0, deleted, order)
    sub = batch.select(keep)
    if order is not None:
        keys, pids = keys[order], pids[order]
        deleted = None if deleted is None else deleted[order]
    cuts = (np.flatnonzero(np.diff(pids)) + 1).tolist()
    ends = np.append(enc.starts, enc.nbytes)
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(pids)]):
        lo, hi = int(ends[a]), int(ends[b])
        rows = (sub.slice(a, b - a), None) if order is None else (sub, order[a:b])
        out.append(PartitionShare(int(pids[a]), keys[a:b], None if deleted is None else deleted[a:b],
                         Encoded(enc.buf[lo:hi], enc.starts[a:b] - lo), *rows))
    return out


def _ascending(keys: np.ndarray) -> bool:
    return bool((keys[1:] > keys[:-1]).all())


def partition_order(pids: np.ndarray) -> np.ndarray:
    """Rows grouped by partition, in batch order within each (≤ 256 partitions: a uint8 key
    lets numpy's stable sort use its radix sort, ~7x faster)."""
    return np.argsort(pids.astype(np.uint8) if pids.max(initial=0) < 256 else pids, kind="stable")
