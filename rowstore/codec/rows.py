"""Row encoding: Arrow record batches <-> row-oriented bytes, vectorized.

Layout: docs/format/segment.md §1. Fixed-width parts of all rows are built
as one packed numpy structured array; numba kernels (``rowstore.codec.kernels``)
scatter them and the variable-width bytes into the row buffer, and gather
them back. No per-row Python runs on either path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.codec import kernels
from rowstore.errors import RowCorruptionError, RowValidationError
from rowstore.schema import Column, SchemaVersion
from rowstore.types import LOWER_INC, LOWER_UNB, UPPER_INC, UPPER_UNB, ColumnType, Kind

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
    header, names = HEADER.fields, HEADER.names
    assert header is not None and names is not None  # a structured dtype
    fields: list[tuple[Any, ...]] = [(n, header[n][0]) for n in names] + [("nulls", "u1", (nb,))]
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

    @property
    def bufs(self) -> list[np.ndarray]:
        return [self.buf]


@dataclass(frozen=True)
class EncodedParts:
    """Several encodings' rows as one batch, not copied together: the rows are ``bufs``
    back to back, row i at ``starts[i]`` of those bytes."""

    bufs: list[np.ndarray]
    starts: np.ndarray
    nbytes: int


def encode_rows(batch: pa.RecordBatch | pa.Table, schema: SchemaVersion, commit_ts: int,
                deleted: np.ndarray | None = None, order: np.ndarray | None = None) -> Encoded:
    """Encode every row of ``batch`` (columns by name, as in ``schema``).

    Each fixed-width field is read straight from its Arrow buffer (nulls are
    zeroed by the kernel, not filled here); one kernel pass writes every
    row's fixed part, then one copy per variable-width column. With ``order``
    (a permutation) the rows come out in that order — as if encoding
    ``batch.take(order)`` — without taking the batch: each row is written
    at its place in the permuted layout.
    """
    lay, fields = layout(schema), _enc_fields(schema)
    n = batch.num_rows
    nb = (len(schema.columns) + 7) // 8
    nulls = np.zeros((n, nb), np.uint8)
    srcs, var = [], []
    for i, col in enumerate(schema.columns):
        arr = _column(batch, col)
        null = None
        if arr.null_count:
            null = arr.is_null().to_numpy(zero_copy_only=False)
            nulls[:, i // 8] |= null.astype(np.uint8) << (i % 8)
        if col.type.variable:
            var.append(_var_values(arr, null))
        else:
            srcs.extend(_field_sources(col, arr, null))
    ends = np.zeros((n, len(var)), np.int64)
    if var:
        np.cumsum(np.stack([lens for _, _, lens in var], axis=1), axis=1, out=ends)
    row_len = np.full(n, lay.size, np.int64)
    if var:
        row_len += ends[:, -1]
    out_starts = np.zeros(n, np.int64)  # row offsets in output order
    np.cumsum(row_len[:-1] if order is None else row_len[order][:-1], out=out_starts[1:])
    starts: npt.NDArray[np.int64] = out_starts  # where each batch row is written
    if order is not None:
        starts = np.empty(n, np.int64)
        starts[order] = out_starts
    out = np.empty(int(row_len.sum()), np.uint8)
    src_off = np.zeros(len(srcs), np.int64)
    np.cumsum([a.shape[0] for a in srcs[:-1]], out=src_off[1:])
    src = np.concatenate(srcs) if srcs else np.zeros(0, np.uint8)
    flags = np.where(deleted, DELETED, 0).astype(np.uint8) if deleted is not None else np.zeros(n, np.uint8)
    ts = int(np.uint64(commit_ts).view(np.int64))  # the kernel writes the same 8 bytes
    kernels.scatter_fields(out, starts, row_len, schema.version, ts, flags,
                           nb, nulls, src, src_off, fields.width, fields.dst, fields.pos, fields.vend_off, ends)
    for j, (data, src_start, lens) in enumerate(var):
        kernels.scatter_runs(out, starts + lay.size + (ends[:, j - 1] if j else 0), data, src_start, lens)
    return Encoded(out, out_starts)


@dataclass(frozen=True)
class _EncFields:
    width: np.ndarray  # per field: bytes
    dst: np.ndarray  # per field: offset within the row
    pos: np.ndarray  # per field: the column's position (its null bit)
    vend_off: int


@functools.lru_cache(maxsize=1024)
def _enc_fields(schema: SchemaVersion) -> _EncFields:
    lay = layout(schema)
    offsets = lay.dtype.fields
    assert offsets is not None  # a layout is a structured dtype
    width, dst, pos = [], [], []
    for i, col in enumerate(schema.columns):
        if col.type.variable:
            continue
        at = offsets[f"c{col.id}"][1]
        for rel, w in _field_parts(col.type):
            width.append(w)
            dst.append(at + rel)
            pos.append(i)
    vend_off = offsets["vend"][1] if lay.var else lay.size
    return _EncFields(np.array(width, np.int64), np.array(dst, np.int64), np.array(pos, np.int64), vend_off)


def _raw(arr: pa.Array, width: int) -> np.ndarray:
    """The value bytes of a fixed-width array (garbage where null), zero-copy."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr) * width, np.uint8)
    return np.frombuffer(buf, np.uint8, count=len(arr) * width, offset=arr.offset * width)


def _field_sources(col: Column, arr: pa.Array, null: np.ndarray | None) -> list[np.ndarray]:
    """Per part of the column (``_field_parts``): its values as n * width bytes."""
    k = col.type.kind
    if k == Kind.BOOL:
        bits = arr.buffers()[1]
        if bits is None:
            return [np.zeros(len(arr), np.uint8)]
        return [np.unpackbits(np.frombuffer(bits, np.uint8), count=arr.offset + len(arr),
                              bitorder="little")[arr.offset :]]
    if k in (Kind.POINT, Kind.BOX):
        names = ("x", "y") if k == Kind.POINT else ("xmin", "ymin", "xmax", "ymax")
        return [_num(_child(arr, f), np.float64).view(np.uint8) for f in names]
    if k == Kind.RANGE:
        vals = _range_values(col, arr, null if null is not None else np.zeros(len(arr), bool))
        return [np.ascontiguousarray(vals[f]).view(np.uint8) for f in ("lo", "hi", "f")]
    return [_raw(arr, np.dtype(col.type.storage()).itemsize)]


def _column(batch: pa.RecordBatch | pa.Table, col: Column) -> pa.Array:
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
    mask: np.ndarray = arr.is_null().to_numpy(zero_copy_only=False)
    return mask


def _num(arr: pa.Array, dtype: npt.DTypeLike) -> np.ndarray:
    """Values as numpy with nulls as zeros (vectorized)."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, arr.type) if not pa.types.is_boolean(arr.type) else False)
    return np.asarray(arr.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)


def _child(arr: pa.StructArray, name: str) -> pa.Array:
    return arr.field(name)  # .field() applies the struct's offset


def _range_values(col: Column, arr: pa.StructArray, null: np.ndarray) -> np.ndarray:
    st = col.type.storage()
    assert isinstance(st, np.dtype)  # a range's storage is a structured dtype (lo, hi, f)
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


def _var_values(arr: pa.Array, null: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(data bytes, start of each value in data, length of each value; 0 when null)."""
    n = len(arr)
    bufs = arr.buffers()
    if bufs[1] is None:
        return np.zeros(0, np.uint8), np.zeros(n, np.int64), np.zeros(n, np.int64)
    large = pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)
    offs: np.ndarray = np.frombuffer(bufs[1], np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    offs = offs.astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lens = offs[1:] - offs[:-1]
    if null is not None:
        lens[null] = 0
    return data, offs[:-1], lens


# -- decoding -------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoded:
    batch: pa.RecordBatch  # columns of the target schema
    commit_ts: np.ndarray  # uint64 per row
    deleted: np.ndarray  # bool per row
    schema_ver: np.ndarray  # uint32 per row


_REASONS = {kernels.PAST_END: "row runs past the end of the data",
            kernels.BAD_LENGTH: "row length disagrees with its fields",
            kernels.NOT_CHAINED: "row does not end where the next one begins"}


def decode_row_list(raws: list[bytes], schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
                    where: str) -> Decoded:
    """Decode separately fetched rows (point gets) in one vectorized call."""
    buf = np.frombuffer(b"".join(raws), np.uint8)
    starts = np.zeros(len(raws), np.int64)
    np.cumsum([len(r) for r in raws[:-1]], out=starts[1:])
    return decode_rows(buf, starts, schemas, target, where)


def row_versions(buf: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The schema version id of each row."""
    return _header_u32(buf, np.ascontiguousarray(starts, np.int64), 4, "rows", 0)


def decode_rows(buf: np.ndarray, starts: np.ndarray, schemas: Callable[[int], SchemaVersion],
                target: SchemaVersion, where: str = "rows") -> Decoded:
    """Decode rows at ``starts`` into ``target``'s columns, whatever versions wrote them.

    Columns are matched by id: a column the row's version lacks is null, a
    column the target lacks is skipped.
    """
    return _decode(buf, starts, schemas, target, where, -1, 0)


def decode_run(buf: np.ndarray, starts: np.ndarray, schemas: Callable[[int], SchemaVersion],
               target: SchemaVersion, where: str, base: int = 0) -> Decoded:
    """Like :func:`decode_rows` for rows that fill ``buf`` back to back (a scan's run): also
    checks that every row ends where the next begins and the last at the end of ``buf``.
    Error offsets are ``base`` + the offset in ``buf``."""
    buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
    return _decode(buf, starts, schemas, target, where, buf.shape[0], base)


def _decode(buf: np.ndarray, starts: np.ndarray, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
            where: str, chain_end: int, base: int) -> Decoded:
    buf = np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf
    starts = np.ascontiguousarray(starts, np.int64)
    n = starts.shape[0]
    if n == 0:
        empty = pa.RecordBatch.from_arrays([pa.array([], c.type.arrow()) for c in target.columns],
                                           schema=_arrow(target))
        return Decoded(empty, np.zeros(0, np.uint64), np.zeros(0, bool), np.zeros(0, np.uint32))
    if starts.min() < 0 or starts.max() + HEADER.itemsize > buf.shape[0]:
        raise RowCorruptionError(where, base + int(starts.max()), "row header past the end of the data")
    first = int(buf[starts[0] + 4 : starts[0] + 8].view("<u4")[0])
    one = _decode_version(buf, starts, first, schemas(first), target, where, chain_end, base)
    if one is not None:  # the common case: every row has the same version, one pass
        return one
    vers = _header_u32(buf, starts, 4, where, base)
    if chain_end >= 0:
        ends = starts + _header_u32(buf, starts, 0, where, base)
        bad = ends != np.append(starts[1:], chain_end)
        if bad.any():
            raise RowCorruptionError(where, base + int(starts[np.argmax(bad)]), _REASONS[kernels.NOT_CHAINED])
    parts, order = [], []
    for v in np.unique(vers):
        sel = np.nonzero(vers == v)[0]
        part = _decode_version(buf, starts[sel], int(v), schemas(int(v)), target, where, -1, base)
        assert part is not None  # every row of sel has version v
        parts.append(part)
        order.append(sel)
    perm = np.argsort(np.concatenate(order), kind="stable")
    table = pa.Table.from_batches([p.batch for p in parts]).take(pa.array(perm))
    return Decoded(table.combine_chunks().to_batches()[0], np.concatenate([p.commit_ts for p in parts])[perm],
                   np.concatenate([p.deleted for p in parts])[perm], vers)


def _header_u32(buf: np.ndarray, starts: np.ndarray, at: int, where: str, base: int) -> np.ndarray:
    if starts.shape[0] and (starts.min() < 0 or starts.max() + HEADER.itemsize > buf.shape[0]):
        raise RowCorruptionError(where, base + int(starts.max()), "row header past the end of the data")
    out = np.empty(starts.shape[0], np.uint32)
    kernels.header_u32(buf, starts, at, out)
    return out


@functools.lru_cache(maxsize=1024)
def _arrow(schema: SchemaVersion) -> pa.Schema:
    return schema.arrow()


_PlanColumn = tuple[Column, int, tuple[int, ...], int]


@dataclass(frozen=True)
class _Plan:
    """How rows of one schema version become the columns of a target version."""

    lay: Layout
    vend_off: int  # offset of the var ends within a row
    fsrc: np.ndarray  # per field: offset within the row
    fwidth: np.ndarray  # per field: bytes
    vsel: np.ndarray  # per wanted var column: its index among the version's var columns
    # per target column: (column, position in the version or -1, field indexes, var slot or -1)
    cols: tuple[_PlanColumn, ...]


def _field_parts(t: ColumnType) -> list[tuple[int, int]]:
    """(offset, width) of the separately gathered parts of a fixed-width value: struct
    children become their own contiguous arrays."""
    if t.kind == Kind.POINT:
        return [(0, 8), (8, 8)]
    if t.kind == Kind.BOX:
        return [(0, 8), (8, 8), (16, 8), (24, 8)]
    if t.kind == Kind.RANGE:
        return [(0, 8), (8, 8), (16, 1)]
    return [(0, np.dtype(t.storage()).itemsize)]


@functools.lru_cache(maxsize=1024)
def _plan(schema: SchemaVersion, target: SchemaVersion) -> _Plan:
    lay = layout(schema)
    offsets = lay.dtype.fields
    assert offsets is not None  # a layout is a structured dtype
    fsrc: list[int] = []
    fwidth: list[int] = []
    vsel: list[int] = []
    cols: list[_PlanColumn] = []
    for col in target.columns:
        src = schema.by_id(col.id)
        if src is None or str(src.type) != str(col.type):
            cols.append((col, -1, (), -1))
        elif col.type.variable:
            cols.append((col, schema.columns.index(src), (), len(vsel)))
            vsel.append(lay.var.index(src))
        else:
            at = offsets[f"c{col.id}"][1]
            idx = []
            for rel, width in _field_parts(col.type):
                idx.append(len(fsrc))
                fsrc.append(at + rel)
                fwidth.append(width)
            cols.append((col, schema.columns.index(src), tuple(idx), -1))
    vend_off = offsets["vend"][1] if lay.var else lay.size
    return _Plan(lay, vend_off, np.array(fsrc, np.int64), np.array(fwidth, np.int64),
                 np.array(vsel, np.int64), tuple(cols))


def _decode_version(buf: np.ndarray, starts: np.ndarray, ver: int, schema: SchemaVersion, target: SchemaVersion,
                    where: str, chain_end: int, base: int) -> Decoded | None:
    """One kernel pass; None if some row has another version than ``ver``."""
    plan = _plan(schema, target)
    n = starts.shape[0]
    nb = (len(schema.columns) + 7) // 8
    sizes = -(-(plan.fwidth * n) // 64) * 64  # each column buffer 64-byte aligned
    fdst = np.zeros(len(sizes), np.int64)
    np.cumsum(sizes[:-1], out=fdst[1:])
    out8 = np.empty(max(int(sizes.sum()), 64), np.uint8)
    nulls = np.empty((n, nb), np.uint8)
    ts, flags = np.empty(n, np.uint64), np.empty(n, np.uint8)
    voffs = np.empty((len(plan.vsel), n + 1), np.int64)
    status, i = kernels.gather_columns(
        buf, starts, ver, plan.lay.size, plan.vend_off, len(plan.lay.var), chain_end, plan.fsrc, plan.fwidth,
        fdst, out8, out8.view(np.uint16), out8.view(np.uint32), out8.view(np.uint64), nb, nulls, ts, flags,
        plan.vsel, voffs)
    if status == kernels.OTHER_VERSION:
        return None
    if status != kernels.OK:
        raise RowCorruptionError(where, base + int(starts[i]), _REASONS[status])
    any_null = np.bitwise_or.reduce(nulls, axis=0)
    fields = [out8[d : d + w * n] for d, w in zip(fdst.tolist(), plan.fwidth.tolist())]
    arrays = []
    for col, pos, idx, slot in plan.cols:
        if pos < 0:
            arrays.append(pa.nulls(n, col.type.arrow()))
            continue
        valid = None
        if (any_null[pos // 8] >> (pos % 8)) & 1:
            valid = _bits(((nulls[:, pos // 8] >> (pos % 8)) & 1) == 0)
        if slot >= 0:
            arrays.append(_var_array(buf, starts, plan, slot, voffs[slot], col, valid))
        else:
            arrays.append(_fixed_array(col, [fields[k] for k in idx], n, valid))
    batch = pa.RecordBatch.from_arrays(arrays, schema=_arrow(target))
    return Decoded(batch, ts, (flags & DELETED) != 0, np.full(n, ver, np.uint32))


def _bits(mask: np.ndarray) -> pa.Buffer | None:
    """An Arrow bitmap buffer from a bool array (None when every bit is set)."""
    if mask.all():
        return None
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _fixed_array(col: Column, parts: list[np.ndarray], n: int, valid: pa.Buffer | None) -> pa.Array:
    k, t = col.type.kind, col.type.arrow()
    if k == Kind.BOOL:
        return pa.Array.from_buffers(t, n, [valid, pa.py_buffer(np.packbits(parts[0], bitorder="little"))])
    if k in (Kind.POINT, Kind.BOX):
        kids = [pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(p)]) for p in parts]
        return pa.Array.from_buffers(t, n, [valid], children=kids)
    if k == Kind.RANGE:
        return _range_array(col, parts, n, valid)
    return pa.Array.from_buffers(t, n, [valid, pa.py_buffer(parts[0])])


def _range_array(col: Column, parts: list[np.ndarray], n: int, valid: pa.Buffer | None) -> pa.Array:
    t = col.type.arrow()
    elem = t.field("lower").type
    lo, hi, f = parts
    kids = [pa.Array.from_buffers(elem, n, [_bits((f & LOWER_UNB) == 0), pa.py_buffer(lo)]),
            pa.Array.from_buffers(elem, n, [_bits((f & UPPER_UNB) == 0), pa.py_buffer(hi)]),
            pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits((f & LOWER_INC) != 0,
                                                                               bitorder="little"))]),
            pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits((f & UPPER_INC) != 0,
                                                                               bitorder="little"))])]
    return pa.Array.from_buffers(t, n, [valid], children=kids)


def _var_array(buf: np.ndarray, starts: np.ndarray, plan: _Plan, slot: int, offs: np.ndarray, col: Column,
               valid: pa.Buffer | None) -> pa.Array:
    n = starts.shape[0]
    data = np.empty(int(offs[-1]), np.uint8)
    kernels.gather_var(buf, starts, plan.lay.size, plan.vend_off, int(plan.vsel[slot]), offs, data)
    t = col.type.arrow()
    if offs[-1] < 2**31:
        return pa.Array.from_buffers(t, n, [valid, pa.py_buffer(offs.astype(np.int32)), pa.py_buffer(data)])
    big = pa.large_binary() if col.type.kind == Kind.BINARY else pa.large_string()
    return pa.Array.from_buffers(big, n, [valid, pa.py_buffer(offs), pa.py_buffer(data)]).cast(t)
