"""Point reads: one encoded row straight to a Python dict (docs/format/segment.md §1).

The vectorized decoder (``rowcodec.decode_rows``) builds Arrow arrays, a fixed cost of
~100 µs that dominates a single-row get. This decodes one row with a function generated
per (row version, target version): one ``struct.unpack_from`` and one dict display, giving
exactly what ``decode_rows(...).batch.to_pylist()[0]`` gives (a property test holds them equal).
"""
from __future__ import annotations

import datetime as dt
import struct
from typing import Any, Callable
from zoneinfo import ZoneInfo

import pyarrow as pa

from rowstore.errors import RowCorruptionError
from rowstore.codec.rows import HEADER, layout
from rowstore.schema import Column, SchemaVersion
from rowstore.types import LOWER_UNB, UPPER_UNB, Kind

_UTC = ZoneInfo("UTC")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=_UTC)
_EPOCH_DATE = dt.date(1970, 1, 1)
_LEN_VER = struct.Struct("<II")
_HEADER_LEN = HEADER.itemsize
_FMT = {Kind.INT8: "b", Kind.INT16: "h", Kind.INT32: "i", Kind.INT64: "q", Kind.UINT8: "B",
        Kind.UINT16: "H", Kind.UINT32: "I", Kind.UINT64: "Q", Kind.FLOAT32: "f", Kind.FLOAT64: "d",
        Kind.BOOL: "B", Kind.TIMESTAMP: "q", Kind.DATE: "i", Kind.UUID: "16s", Kind.POINT: "dd",
        Kind.BOX: "dddd"}

RowDecoder = Callable[[bytes, int, str], dict[str, Any]]  # (row, its length from the header, where) -> row
_Convert = Callable[[tuple[Any, ...]], Any]  # a fixed-width value's struct fields -> its Python value


def _ts(us: int) -> dt.datetime:
    try:
        return _EPOCH + dt.timedelta(microseconds=us)
    except OverflowError:
        far: dt.datetime = pa.scalar(us, pa.timestamp("us", tz="UTC")).as_py()
        return far


def _date(days: int) -> dt.date:
    try:
        return _EPOCH_DATE + dt.timedelta(days=days)
    except OverflowError:
        far: dt.date = pa.scalar(days, pa.date32()).as_py()
        return far


def _converter(col: Column) -> tuple[str, int, _Convert | None]:
    """(struct format, number of struct fields, fields -> Python value for several fields)."""
    k = col.type.kind
    if k == Kind.RANGE:
        elem = col.type.elem
        conv: Callable[[Any], Any] = _ts if elem == Kind.TIMESTAMP else (lambda v: v)

        def rng(v: tuple[Any, ...]) -> dict[str, Any]:
            lo, hi, f = v
            return {"lower": None if f & LOWER_UNB else conv(lo), "upper": None if f & UPPER_UNB else conv(hi),
                    "lower_inclusive": bool(f & 0x01), "upper_inclusive": bool(f & 0x02)}
        return ("ddB" if elem == Kind.FLOAT64 else "qqB"), 3, rng
    fmt = _FMT[k]
    if k == Kind.POINT:
        return fmt, 2, lambda v: {"x": v[0], "y": v[1]}
    if k == Kind.BOX:
        return fmt, 4, lambda v: {"xmin": v[0], "ymin": v[1], "xmax": v[2], "ymax": v[3]}
    return fmt, 1, None  # one field: converted inline (``_SCALAR``)


_SCALAR = {Kind.BOOL: "bool({})", Kind.TIMESTAMP: "_ts({})", Kind.DATE: "_date({})"}  # one-field conversions
_DECODERS: dict[tuple[int, int], tuple[SchemaVersion, SchemaVersion, RowDecoder]] = {}


def decoder(row_schema: SchemaVersion, target: SchemaVersion) -> RowDecoder:
    """The decoder of rows of ``row_schema`` into ``target``'s dict, cached by identity (hashing
    a schema costs more than decoding the row)."""
    got = _DECODERS.get((id(row_schema), id(target)))
    if got is None or got[0] is not row_schema or got[1] is not target:
        if len(_DECODERS) > 4096:
            _DECODERS.clear()
        got = _DECODERS[(id(row_schema), id(target))] = (row_schema, target, _make_decoder(row_schema, target))
    return got[2]


def _make_decoder(row_schema: SchemaVersion, target: SchemaVersion) -> RowDecoder:
    """Python source for one (row version, target version) pair, compiled once (as
    ``collections.namedtuple`` does): ONE struct unpack for the whole fixed part (values in
    column order, then the var ends), then one dict display whose entries test the null bit
    and convert in place — no per-column loop, no step tuples at decode time."""
    lay = layout(row_schema)
    pos = {c.id: i for i, c in enumerate(row_schema.columns)}
    nb = (len(row_schema.columns) + 7) // 8
    fmt, at = "<", 0
    where: dict[int, tuple[int, int, _Convert | None]] = {}  # column id -> (first field, fields, converter)
    for c in lay.fixed:  # packed in column order right after the null bitmap
        f, n, conv = _converter(c)
        fmt += f
        where[c.id] = (at, n, conv)
        at += n
    var = {c.id: j for j, c in enumerate(lay.var)}
    fmt += "I" * len(lay.var)
    fixed = struct.Struct(fmt)
    assert 17 + nb + fixed.size == lay.size, "layout and struct disagree"  # part of the format
    size, nvar = lay.size, len(lay.var)
    env: dict[str, Any] = {"unpack": fixed.unpack_from, "Err": RowCorruptionError, "_ts": _ts, "_date": _date}
    entries = []
    for c in target.columns:
        if c.id not in pos:
            entries.append(f"{c.name!r}: None")
            continue
        i = pos[c.id]
        null = f"raw[{17 + (i >> 3)}] & {1 << (i & 7)}"
        if c.id in var:
            j = at + var[c.id]
            lo = f"{size} + v[{j - 1}]" if var[c.id] else f"{size}"
            val = f"raw[{lo} : {size} + v[{j}]]" + ("" if c.type.kind == Kind.BINARY else '.decode("utf-8")')
        else:
            a, n, conv = where[c.id]
            if n == 1:
                val = _SCALAR.get(c.type.kind, "{}").format(f"v[{a}]")
            else:
                env[f"conv{i}"] = conv
                val = f"conv{i}(v[{a} : {a + n}])"
        entries.append(f"{c.name!r}: None if {null} else {val}")
    src = "\n".join([
        "def decode(raw, ln, where):",
        "    if ln != len(raw):",
        "        raise Err(where, None, f'row length {ln} != {len(raw)} bytes read')",
        f"    if {size} > ln:",
        "        raise Err(where, None, 'row shorter than its fixed part')",
        f"    v = unpack(raw, {17 + nb})",
        f"    if {size} + {f'v[{at + nvar - 1}]' if nvar else 0} != ln:",
        "        raise Err(where, None, 'row length does not match its columns')",
        "    return {" + ", ".join(entries) + "}",
    ])
    exec(compile(src, f"<row decoder v{row_schema.version} -> v{target.version}>", "exec"), env)
    decode: RowDecoder = env["decode"]
    return decode


def decode_one(raw: bytes, schemas: Callable[[int], SchemaVersion], target: SchemaVersion,
               where: str = "row") -> dict[str, Any]:
    """The row as ``{column name of target: value}`` (None when null or absent)."""
    return PointDecoder(schemas, target)(raw, where)


class PointDecoder:
    """``decode_one`` into one target for one table's rows: the decoder of each row version
    is looked up once (the schema lookup and the identity cache cost as much as a decode)."""

    def __init__(self, schemas: Callable[[int], SchemaVersion], target: SchemaVersion) -> None:
        self.schemas, self.target = schemas, target
        self._by_ver: dict[int, RowDecoder] = {}

    def __call__(self, raw: bytes, where: str) -> dict[str, Any]:
        if len(raw) < _HEADER_LEN:
            raise RowCorruptionError(where, None, "row shorter than its header")
        ln, ver = _LEN_VER.unpack_from(raw, 0)
        dec = self._by_ver.get(ver)
        if dec is None:
            dec = self._by_ver[ver] = decoder(self.schemas(ver), self.target)
        return dec(raw, ln, where)
