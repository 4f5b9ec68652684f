"""Rows coming in: conform an Arrow batch to a table schema, keys from user values.

A batch is checked whole before anything is written (CONTRACT.md §3): an unknown
column, a missing or null primary key, or a value of the wrong type rejects it.
Lossless conversions between Arrow types of the same family are applied (int32
data for an int64 column, large_string for string, timestamps in another unit
or zone); anything else is a wrong type.
"""
from __future__ import annotations

import uuid as uuidlib

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import RowValidationError
from rowstore.rowcodec import Encoded
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


def stamp(enc: Encoded, ts: int) -> None:
    """Write the commit timestamp into every encoded row's header."""
    if len(enc.starts):
        _stamp(enc.buf, enc.starts, np.frombuffer(np.uint64(ts).tobytes(), np.uint8))


@numba.njit(cache=True, nogil=True)
def _stamp(buf, starts, ts8):
    for i in range(starts.shape[0]):
        s = starts[i] + 8  # commit_ts within a row header (docs/format/segment.md §1)
        for q in range(8):
            buf[s + q] = ts8[q]


def split_encoded(enc: Encoded, order: np.ndarray, counts: list[int]) -> list[Encoded]:
    """Encoded rows regrouped: rows ``order[0:counts[0]]`` form the first piece, and so on."""
    ends = np.append(enc.starts[1:], enc.nbytes)
    lens = (ends - enc.starts)[order]
    out_starts = np.zeros(len(order), np.int64)
    np.cumsum(lens[:-1], out=out_starts[1:])
    buf = np.empty(enc.nbytes, np.uint8)
    _gather(enc.buf, enc.starts[order], lens, out_starts, buf)
    pieces, at = [], 0
    for n in counts:
        lo = int(out_starts[at]) if n else 0
        hi = int(out_starts[at + n]) if at + n < len(order) else enc.nbytes
        pieces.append(Encoded(buf[lo:hi], out_starts[at : at + n] - lo))
        at += n
    return pieces


@numba.njit(cache=True, nogil=True)
def _gather(src, src_starts, lens, dst_starts, dst):
    for i in range(src_starts.shape[0]):
        a, b, n = src_starts[i], dst_starts[i], lens[i]
        for q in range(n):
            dst[b + q] = src[a + q]
