"""Row encoding: Arrow record batches <-> row-oriented bytes, vectorized.

Layout: docs/format/segment.md §1. Fixed-width parts of all rows are built
as one packed numpy structured array; numba kernels (``rowstore.kernels``)
scatter them and the variable-width bytes into the row buffer, and gather
them back. No per-row Python runs on either path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore import kernels
from rowstore.errors import RowCorruptionError, RowValidationError
from rowstore.schema import Column, SchemaVersion
from rowstore.types import LOWER_INC, LOWER_UNB, UPPER_INC, UPPER_UNB, Kind

HEADER = np.dtype([("len", "<u4"), ("ver", "<u4"), ("ts", "<u8"), ("flags", "u1")])  # 17 bytes
DELETED = 0x01  # row flag: a tombstone (part of the format)


@dataclass(frozen=True)
class Layout:
    """The fixed part of a row of one schema version, as a packed numpy dtype."""

    schema: SchemaVersion
    dtype: np.dtype
    fixed: tuple[Column, ...]
    var: tuple[Column, ...]

    @property
    def size(self) -> int:
        return self.dtype.itemsize


@functools.lru_cache(maxsize=1024)
def layout(schema: SchemaVersion) -> Layout:
    nb = (len(schema.columns) + 7) // 8
    fields = [(n, HEADER.fields[n][0]) for n in HEADER.names] + [("nulls", "u1", (nb,))]
    fixed = tuple(c for c in schema.columns if not c.type.variable)
    var = tuple(c for c in schema.columns if c.type.variable)
    for c in fixed:
        st = c.type.storage()
        fields.append((f"c{c.id}",) + (st if isinstance(st, tuple) else (st,)))
    if var:
        fields.append(("vend", "<u4", (len(var),)))
    return Layout(schema, np.dtype(fields), fixed, var)


# -- encoding -----------------------------------------------------------------------


@dataclass(frozen=True)
class Encoded:
    buf: np.ndarray  # uint8, rows back to back
    starts: np.ndarray  # int64 offset of each row in buf

    @property
    def nbytes(self) -> int:
        return int(self.buf.shape[0])


def encode_rows(batch: pa.RecordBatch | pa.Table, schema: SchemaVersion, commit_ts: int,
                deleted: np.ndarray | None = None) -> Encoded:
    """Encode every row of ``batch`` (columns by name, as in ``schema``)."""
    lay = layout(schema)
    n = batch.num_rows
    fx = np.zeros(n, lay.dtype)
    fx["ver"], fx["ts"] = schema.version, commit_ts
    if deleted is not None:
        fx["flags"] = np.where(deleted, DELETED, 0)
    var_lens, var_src = [], []
    for i, col in enumerate(schema.columns):
        arr = _column(batch, col)
        null = _null_mask(arr)
        fx["nulls"][:, i // 8] |= null.astype(np.uint8) << (i % 8)
        if col.type.variable:
            data, start, lens = _var_values(arr, null)
            var_src.append((data, start))
            var_lens.append(lens)
        else:
            fx[f"c{col.id}"] = _fixed_values(col, arr, null)
    var_total = np.zeros(n, np.int64)
    if lay.var:
        ends = np.cumsum(np.stack(var_lens, axis=1), axis=1)
        fx["vend"] = ends
        var_total = ends[:, -1]
    row_len = lay.size + var_total
    fx["len"] = row_len
    starts = np.zeros(n, np.int64)
    np.cumsum(row_len[:-1], out=starts[1:])
    out = np.empty(int(row_len.sum()), np.uint8)
    kernels.scatter_rows(out, starts, fx.view(np.uint8).reshape(n, lay.size), lay.size)
    prev = np.zeros(n, np.int64)
    for (data, src_start), lens in zip(var_src, var_lens):
        kernels.scatter_runs(out, starts + lay.size + prev, data, src_start, lens)
        prev = prev + lens
    return Encoded(out, starts)


def _column(batch, col: Column) -> pa.Array:
    idx = batch.schema.get_field_index(col.name)
    want = col.type.arrow()
    if idx < 0:
        if not col.nullable:
            raise RowValidationError(f"column {col.name!r} is missing and cannot be null")
        return pa.nulls(batch.num_rows, want)
    arr = batch.column(idx)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not arr.type.equals(want):
        raise RowValidationError(f"column {col.name!r} has type {arr.type}, expected {want} ({col.type})")
    if not col.nullable and arr.null_count:
        raise RowValidationError(f"column {col.name!r} has nulls and is not nullable")
    return arr


def _null_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.zeros(len(arr), bool)
    return arr.is_null().to_numpy(zero_copy_only=False)


def _num(arr: pa.Array, dtype) -> np.ndarray:
    """Values as numpy with nulls as zeros (vectorized)."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, arr.type) if not pa.types.is_boolean(arr.type) else False)
    return np.asarray(arr.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _fixed_values(col: Column, arr: pa.Array, null: np.ndarray):
    k = col.type.kind
    if k in (Kind.TIMESTAMP, Kind.DATE):
        return _num(arr.cast(pa.int64() if k == Kind.TIMESTAMP else pa.int32()), np.int64)
    if k == Kind.UUID:
        raw = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * 16 : (arr.offset + len(arr)) * 16]
        vals = raw.reshape(-1, 16).copy()
        vals[null] = 0
        return vals
    if k in (Kind.POINT, Kind.BOX):
        names = ("x", "y") if k == Kind.POINT else ("xmin", "ymin", "xmax", "ymax")
        return np.stack([_num(_child(arr, f), np.float64) for f in names], axis=1)
    if k == Kind.RANGE:
        return _range_values(col, arr, null)
    return _num(arr, col.type.storage())


def _child(arr: pa.StructArray, name: str) -> pa.Array:
    return arr.field(name)  # .field() applies the struct's offset


def _range_values(col: Column, arr: pa.StructArray, null: np.ndarray) -> np.ndarray:
    st = col.type.storage()
    out = np.zeros(len(arr), st)
    lo, hi = _child(arr, "lower"), _child(arr, "upper")
    if col.type.elem == Kind.TIMESTAMP:
        lo, hi = lo.cast(pa.int64()), hi.cast(pa.int64())
    out["lo"], out["hi"] = _num(lo, st["lo"]), _num(hi, st["hi"])
    flags = np.where(_num(_child(arr, "lower_inclusive"), bool), LOWER_INC, 0)
    flags |= np.where(_num(_child(arr, "upper_inclusive"), bool), UPPER_INC, 0)
    flags |= np.where(_null_mask(lo), LOWER_UNB, 0) | np.where(_null_mask(hi), UPPER_UNB, 0)
    out["f"] = np.where(null, 0, flags)
    return out


def _var_values(arr: pa.Array, null: np.ndarray):
    """(data bytes, start of each value in data, length of each value; 0 when null)."""
    if not pa.types.is_large_binary(arr.type):
        arr = arr.cast(pa.large_binary())
    offs = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    lens = np.where(null, 0, offs[1:] - offs[:-1])
    return data, offs[:-1].copy(), lens.astype(np.int64)


# -- decoding -------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    batch: pa.RecordBatch  # columns of the target schema
    commit_ts: np.ndarray  # uint64 per row
    deleted: np.ndarray  # bool per row
    schema_ver: np.ndarray  # uint32 per row


def decode_row_list(raws: list[bytes], schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
                    where: str) -> Decoded:
    """Decode separately fetched rows (point gets) in one vectorized call."""
    buf = np.frombuffer(b"".join(raws), np.uint8)
    starts = np.zeros(len(raws), np.int64)
    np.cumsum([len(r) for r in raws[:-1]], out=starts[1:])
    return decode_rows(buf, starts, schemas, target, where)


def row_versions(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The schema version id of each row (vectorized 4-byte gather)."""
    idx = starts[:, None] + np.arange(4, 8)
    return buf[idx].view("<u4").ravel()


def decode_rows(buf: np.ndarray, starts: np.ndarray, schemas: Callable[[int], SchemaVersion],
                target: SchemaVersion, where: str = "rows") -> Decoded:
    """Decode rows at ``starts`` into ``target``'s columns, whatever versions wrote them.

    Columns are matched by id: a column the row's version lacks is null, a
    column the target lacks is skipped.
    """
    buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
    starts = np.asarray(starts, np.int64)
    n = starts.shape[0]
    if n and (starts.min() < 0 or starts.max() + HEADER.itemsize > buf.shape[0]):
        raise RowCorruptionError(where, int(starts.max()), "row header past the end of the data")
    vers = row_versions(buf, starts) if n else np.zeros(0, np.uint32)
    parts, order = [], []
    for v in np.unique(vers):
        sel = np.nonzero(vers == v)[0]
        parts.append(_decode_version(buf, starts[sel], schemas(int(v)), target, where))
        order.append(sel)
    if not parts:
        empty = pa.RecordBatch.from_arrays([pa.array([], c.type.arrow()) for c in target.columns],
                                           schema=target.arrow())
        return Decoded(empty, np.zeros(0, np.uint64), np.zeros(0, bool), vers)
    if len(parts) == 1:
        b, ts, de = parts[0]
        return Decoded(b, ts, de, vers)
    perm = np.argsort(np.concatenate(order), kind="stable")
    table = pa.Table.from_batches([p[0] for p in parts]).take(pa.array(perm))
    return Decoded(table.combine_chunks().to_batches()[0], np.concatenate([p[1] for p in parts])[perm],
                   np.concatenate([p[2] for p in parts])[perm], vers)


def _decode_version(buf, starts, schema: SchemaVersion, target: SchemaVersion, where: str):
    lay = layout(schema)
    n = starts.shape[0]
    if starts.max() + lay.size > buf.shape[0]:
        raise RowCorruptionError(where, int(starts.max()), "row runs past the end of the data")
    raw = np.empty((n, lay.size), np.uint8)
    kernels.gather_fixed(buf, starts, lay.size, raw)
    fx = raw.view(lay.dtype).ravel()
    _check_lengths(fx, lay, starts, buf.shape[0], where)
    pos = {c.id: i for i, c in enumerate(schema.columns)}
    var_idx = {c.id: j for j, c in enumerate(lay.var)}
    arrays = []
    for col in target.columns:
        src = schema.by_id(col.id)
        if src is None or str(src.type) != str(col.type):
            arrays.append(pa.nulls(n, col.type.arrow()))
            continue
        i = pos[col.id]
        null = (fx["nulls"][:, i // 8] >> (i % 8)) & 1 == 1
        if col.type.variable:
            arrays.append(_var_array(buf, starts, fx, lay, var_idx[col.id], col, null))
        else:
            arrays.append(_fixed_array(fx[f"c{col.id}"], col, null))
    batch = pa.RecordBatch.from_arrays(arrays, schema=target.arrow())
    return batch, fx["ts"].copy(), (fx["flags"] & DELETED) != 0


def _check_lengths(fx, lay: Layout, starts, size: int, where: str) -> None:
    lens = fx["len"].astype(np.int64)
    var_end = fx["vend"][:, -1].astype(np.int64) if lay.var else 0
    bad = (lens != lay.size + var_end) | (starts + lens > size)
    if lay.var and lay.var.__len__() > 1:
        bad |= np.any(np.diff(fx["vend"].astype(np.int64), axis=1) < 0, axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise RowCorruptionError(where, int(starts[i]), "row length disagrees with its fields")


def _validity(null: np.ndarray):
    if not null.any():
        return None
    return pa.py_buffer(np.packbits(~null, bitorder="little"))


def _fixed_array(vals, col: Column, null: np.ndarray) -> pa.Array:
    k, t = col.type.kind, col.type.arrow()
    mask = pa.array(null) if null.any() else None
    if k == Kind.BOOL:
        return pa.array(vals.astype(bool), type=t, mask=null if null.any() else None)
    if k == Kind.TIMESTAMP:
        return pa.array(vals.astype(np.int64), pa.int64(), mask=null if null.any() else None).cast(t)
    if k == Kind.DATE:
        return pa.array(vals.astype(np.int32), pa.int32(), mask=null if null.any() else None).cast(t)
    if k == Kind.UUID:
        data = pa.py_buffer(np.ascontiguousarray(vals).tobytes())
        return pa.Array.from_buffers(t, len(vals), [_validity(null), data])
    if k in (Kind.POINT, Kind.BOX):
        names = ("x", "y") if k == Kind.POINT else ("xmin", "ymin", "xmax", "ymax")
        kids = [pa.array(np.ascontiguousarray(vals[:, j])) for j in range(len(names))]
        return pa.StructArray.from_arrays(kids, names=names, mask=mask)
    if k == Kind.RANGE:
        return _range_array(vals, col, null, mask)
    return pa.array(vals, type=t, mask=null if null.any() else None)


def _range_array(vals, col: Column, null: np.ndarray, mask) -> pa.Array:
    t = col.type.arrow()
    elem = t.field("lower").type
    f = vals["f"]
    base = pa.float64() if col.type.elem == Kind.FLOAT64 else pa.int64()
    lo = pa.array(vals["lo"], base, mask=(f & LOWER_UNB) != 0).cast(elem)
    hi = pa.array(vals["hi"], base, mask=(f & UPPER_UNB) != 0).cast(elem)
    kids = [lo, hi, pa.array((f & LOWER_INC) != 0), pa.array((f & UPPER_INC) != 0)]
    return pa.StructArray.from_arrays(kids, fields=list(t), mask=mask)


def _var_array(buf, starts, fx, lay: Layout, j: int, col: Column, null: np.ndarray) -> pa.Array:
    ends = fx["vend"].astype(np.int64)
    begin = ends[:, j - 1] if j else np.zeros(len(starts), np.int64)
    lens = ends[:, j] - begin
    offsets = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    kernels.gather_runs(buf, starts + lay.size + begin, lens, offsets[:-1], data)
    big = pa.large_string() if col.type.kind != Kind.BINARY else pa.large_binary()
    arr = pa.Array.from_buffers(big, len(starts), [_validity(null), pa.py_buffer(offsets),
                                                   pa.py_buffer(data)])
    return arr.cast(col.type.arrow())
