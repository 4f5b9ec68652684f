"""Rows coming in: conform an Arrow batch to a table schema, keys from user values.

A batch is checked whole before anything is written (CONTRACT.md §3): an unknown
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
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import RowValidationError
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
    key = schema.key
    if key.name not in names:
        raise RowValidationError(f"the primary key column {key.name!r} is missing")
    cols = []
    for c in schema.columns:
        i = data.schema.get_field_index(c.name)
        arr = data.column(i) if i >= 0 else pa.nulls(data.num_rows, c.type.arrow())
        arr = _cast(arr, c)
        if arr.null_count and (not c.nullable or c.id == key.id):
            what = "the primary key" if c.id == key.id else "a not-null column"
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


def _same_family(got: pa.DataType, want: pa.DataType) -> bool:
    t = pa.types
    fams = [(t.is_integer, t.is_integer), (t.is_integer, t.is_floating), (t.is_floating, t.is_floating),
            (_stringish, _stringish), (_binaryish, _binaryish), (t.is_timestamp, t.is_timestamp),
            (t.is_date, t.is_date), (t.is_struct, t.is_struct), (_stringish, t.is_fixed_size_binary)]
    return any(a(got) and b(want) for a, b in fams)


def _stringish(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _binaryish(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)


def _uuid_array(arr: pa.Array, col: Column) -> pa.Array:
    if _stringish(arr.type):
        return pa.array([None if v is None else uuidlib.UUID(v).bytes for v in arr.to_pylist()], pa.binary(16))
    got = arr.cast(pa.binary())
    lens = np.asarray(pc.binary_length(got).fill_null(16))
    if (lens != 16).any():
        raise RowValidationError(f"column {col.name!r}: uuid values are 16 bytes")
    return got.cast(pa.binary(16))


def key_array(keys, key: Column) -> pa.Array:
    """User-given primary-key values (ints, strings, uuid strings or bytes) as an Arrow array."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        arr = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        return _cast(arr, key) if arr.null_count == 0 else _null_key(key)
    if not isinstance(keys, (list, tuple)):
        raise RowValidationError("keys must be a list")
    if any(k is None for k in keys):
        _null_key(key)
    k = key.type.kind
    try:
        if k == Kind.INT64:
            if any(isinstance(v, bool) or not isinstance(v, (int, str)) for v in keys):
                raise ValueError("not an integer")
            return pa.array([int(v) for v in keys], pa.int64())
        if k == Kind.UUID:
            return pa.array([bytes(v) if isinstance(v, (bytes, bytearray)) else uuidlib.UUID(v).bytes
                             for v in keys], pa.binary(16))
        if any(not isinstance(v, str) for v in keys):
            raise ValueError("not a string")
        return pa.array(keys, pa.string())
    except (ValueError, TypeError, OverflowError, pa.ArrowInvalid) as e:
        raise RowValidationError(f"primary key values must be {key.type}: {e}") from e


def _null_key(key: Column):
    raise RowValidationError(f"primary key {key.name!r} values cannot be null")


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
def _stamp(buf, starts, ts8):
    for i in range(starts.shape[0]):
        s = starts[i] + 8  # commit_ts within a row header (docs/format/segment.md §1)
        for q in range(8):
            buf[s + q] = ts8[q]


@dataclass(frozen=True)
class Piece:
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
                       deleted: np.ndarray | None, pids: np.ndarray, keep: list[str]) -> list[Piece]:
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
        out.append(Piece(int(pids[a]), keys[a:b], None if deleted is None else deleted[a:b],
                         Encoded(enc.buf[lo:hi], enc.starts[a:b] - lo), *rows))
    return out


def _ascending(keys: np.ndarray) -> bool:
    return bool((keys[1:] > keys[:-1]).all())


def partition_order(pids: np.ndarray) -> np.ndarray:
    """Rows grouped by partition, in batch order within each (≤ 256 partitions: a uint8 key
    lets numpy's stable sort use its radix sort, ~7x faster)."""
    return np.argsort(pids.astype(np.uint8) if pids.max(initial=0) < 256 else pids, kind="stable")
