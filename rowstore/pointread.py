"""Point reads: one encoded row straight to a Python dict (docs/format/segment.md §1).

The vectorized decoder (``rowcodec.decode_rows``) builds Arrow arrays, a fixed cost of
~100 µs that dominates a single-row get. This decodes one row with one
``struct.unpack_from`` per (row version, target version) plan, giving exactly what
``decode_rows(...).batch.to_pylist()[0]`` gives (a property test holds them equal).
"""
from __future__ import annotations

import datetime as dt
import struct
from typing import Callable
from zoneinfo import ZoneInfo

import pyarrow as pa

from rowstore.errors import RowCorruptionError
from rowstore.rowcodec import HEADER, layout
from rowstore.schema import SchemaVersion
from rowstore.types import LOWER_UNB, UPPER_UNB, Kind

_UTC = ZoneInfo("UTC")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_HEAD = struct.Struct("<IIQB")
_FMT = {Kind.INT8: "b", Kind.INT16: "h", Kind.INT32: "i", Kind.INT64: "q", Kind.UINT8: "B",
        Kind.UINT16: "H", Kind.UINT32: "I", Kind.UINT64: "Q", Kind.FLOAT32: "f", Kind.FLOAT64: "d",
        Kind.BOOL: "B", Kind.TIMESTAMP: "q", Kind.DATE: "i", Kind.UUID: "16s", Kind.POINT: "dd",
        Kind.BOX: "dddd"}


def _ts(us: int):
    try:
        return _EPOCH + dt.timedelta(microseconds=us)
    except OverflowError:
        return pa.scalar(us, pa.timestamp("us", tz="UTC")).as_py()


def _date(days: int):
    try:
        return _EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        return pa.scalar(days, pa.date32()).as_py()


def _converter(col) -> tuple[str, int, Callable]:
    """(struct format, number of struct fields, values -> Python value)."""
    k = col.type.kind
    if k == Kind.RANGE:
        elem = col.type.elem
        conv = _ts if elem == Kind.TIMESTAMP else (lambda v: v)

        def rng(v):
            lo, hi, f = v
            return {"lower": None if f & LOWER_UNB else conv(lo), "upper": None if f & UPPER_UNB else conv(hi),
                    "lower_inclusive": bool(f & 0x01), "upper_inclusive": bool(f & 0x02)}
        return ("ddB" if elem == Kind.FLOAT64 else "qqB"), 3, rng
    fmt = _FMT[k]
    if k == Kind.POINT:
        return fmt, 2, lambda v: {"x": v[0], "y": v[1]}
    if k == Kind.BOX:
        return fmt, 4, lambda v: {"xmin": v[0], "ymin": v[1], "xmax": v[2], "ymax": v[3]}
    one = {Kind.BOOL: lambda v: bool(v[0]), Kind.TIMESTAMP: lambda v: _ts(v[0]),
           Kind.DATE: lambda v: _date(v[0])}.get(k, lambda v: v[0])
    return fmt, 1, one


_PLANS: dict[tuple[int, int], tuple] = {}


def _plan(row_schema: SchemaVersion, target: SchemaVersion):
    """Cached by identity (hashing a schema costs more than decoding the row)."""
    got = _PLANS.get((id(row_schema), id(target)))
    if got is None or got[0] is not row_schema or got[1] is not target:
        if len(_PLANS) > 4096:
            _PLANS.clear()
        got = _PLANS[(id(row_schema), id(target))] = (row_schema, target, _make_plan(row_schema, target))
    return got[2]


def _make_plan(row_schema: SchemaVersion, target: SchemaVersion):
    """How to build the target's dict from a row of ``row_schema``: ONE struct for the whole
    fixed part (values in column order, then the var ends), and per target column where its
    value sits in the unpacked tuple and how to convert it."""
    lay = layout(row_schema)
    pos = {c.id: i for i, c in enumerate(row_schema.columns)}
    nb = (len(row_schema.columns) + 7) // 8
    fmt, at, where = "<", 0, {}
    for c in lay.fixed:  # packed in column order right after the null bitmap
        f, n, conv = _converter(c)
        fmt += f
        where[c.id] = (at, n, conv)
        at += n
    var = {c.id: j for j, c in enumerate(lay.var)}
    fmt += "I" * len(lay.var)
    fixed = struct.Struct(fmt)
    assert 17 + nb + fixed.size == lay.size, "layout and struct disagree"  # part of the format
    steps = []
    for c in target.columns:
        if c.id not in pos:
            steps.append((c.name, -1, 0, 0, 0, None))
            continue
        i = pos[c.id]
        if c.id in var:
            steps.append((c.name, 17 + (i >> 3), 1 << (i & 7), 1, var[c.id], c.type.kind == Kind.BINARY))
        else:
            a, n, conv = where[c.id]
            plain = n == 1 and c.type.kind not in (Kind.BOOL, Kind.TIMESTAMP, Kind.DATE)
            steps.append((c.name, 17 + (i >> 3), 1 << (i & 7), 0, a, None if plain else (n, conv)))
    return lay.size, fixed, 17 + nb, at, len(lay.var), steps


def decode_one(raw: bytes, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
               where: str = "row") -> dict:
    """The row as ``{column name of target: value}`` (None when null or absent)."""
    if len(raw) < HEADER.itemsize:
        raise RowCorruptionError(where, None, "row shorter than its header")
    ln, ver, _ts_, _flags = _HEAD.unpack_from(raw, 0)
    if ln != len(raw):
        raise RowCorruptionError(where, None, f"row length {ln} != {len(raw)} bytes read")
    size, fixed, start, nfix, nvar, steps = _plan(schemas(ver), target)
    if size > ln:
        raise RowCorruptionError(where, None, "row shorter than its fixed part")
    vals = fixed.unpack_from(raw, start)
    if size + (vals[-1] if nvar else 0) != ln:
        raise RowCorruptionError(where, None, "row length does not match its columns")
    out = {}
    for name, nbyte, bit, is_var, a, how in steps:
        if nbyte < 0 or raw[nbyte] & bit:
            out[name] = None
        elif is_var:
            lo = vals[nfix + a - 1] if a else 0
            b = raw[size + lo : size + vals[nfix + a]]
            out[name] = b if how else b.decode("utf-8")
        elif how is None:
            out[name] = vals[a]
        else:
            out[name] = how[1](vals[a : a + how[0]])
    return out
