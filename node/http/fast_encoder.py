"""A few JSON rows straight to encoded rows (docs/format/segment.md §1), no Arrow on the way.

The full path (``node.codec.rows_to_table`` → ``conform`` → ``encode_rows``) builds Arrow
arrays and runs numba kernels: fixed costs of ~0.4 ms that dominate a one-row write. This
encodes one JSON object with a function generated per schema version (as the point-read
path decodes with ``rowstore.codec.point_decoder``): each value is checked in place and the
whole fixed part is one ``struct.pack``.

It accepts a *subset* of what the full path accepts — values whose JSON type is exactly the
column's (an integer in range, a finite number, an ISO-8601 ``…Z`` timestamp, …) — and
answers ``None`` for anything else, which then takes the full path: that path stays the
reference for what is valid and for every error message. Where both accept a row, the bytes
are identical (``tests/node/http/test_fast_encoder.py`` holds them equal, property-based).
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
import re
import struct
from typing import Any, Callable

from rowstore.codec.rows import DELETED, layout
from rowstore.errors import RowstoreError
from rowstore.schema import SchemaVersion
from rowstore.tables.conform import TS_RANGE_US
from rowstore.tables.keys import encode_one
from rowstore.types import Kind
from node.errors import NodeError

_INT = {Kind.INT8: ("b", -(2**7), 2**7), Kind.INT16: ("h", -(2**15), 2**15), Kind.INT32: ("i", -(2**31), 2**31),
        Kind.INT64: ("q", -(2**63), 2**63), Kind.UINT8: ("B", 0, 2**8), Kind.UINT16: ("H", 0, 2**16),
        Kind.UINT32: ("I", 0, 2**32), Kind.UINT64: ("Q", 0, 2**64)}
_F32_MAX = 3.4028234663852886e38
_ISO_Z = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?Z\Z")
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_DATE = dt.date(1970, 1, 1)


Encode = Callable[[Any], tuple[bytes, Any]]  # a JSON row (or key) -> (row bytes, the key's value)


class NotFast(NodeError):
    """The value is not one the fast path is sure about: the request takes the full path."""


def _iso_us(v: str) -> int:
    m = _ISO_Z.match(v)
    if m is None:
        raise NotFast
    y, mo, d, h, mi, s, frac = m.groups()
    t = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(s))  # ValueError: a bad date
    us = (t - _EPOCH) // dt.timedelta(microseconds=1)
    return us + (int(frac.ljust(6, "0")) if frac else 0)


def _date_days(v: str) -> int:
    if len(v) != 10:
        raise NotFast
    return (dt.date.fromisoformat(v) - _EPOCH_DATE).days


def _uuid_bytes(v: str) -> bytes:
    if _UUID.match(v) is None:
        raise NotFast
    return bytes.fromhex(v.replace("-", ""))


def _b64(v: str) -> bytes:
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise NotFast from None


def _f32(v: float) -> float:
    x = float(v)
    if not math.isfinite(x) or abs(x) > _F32_MAX:
        raise NotFast
    return x


_FIXED = {Kind.FLOAT64: "d", Kind.FLOAT32: "f", Kind.BOOL: "B", Kind.TIMESTAMP: "q", Kind.DATE: "i",
          Kind.UUID: "16s", Kind.POINT: "dd", Kind.BOX: "dddd"}
_STRUCT = {Kind.POINT: ("x", "y"), Kind.BOX: ("xmin", "ymin", "xmax", "ymax")}
SUPPORTED = set(_INT) | set(_FIXED) | {Kind.STRING, Kind.BINARY}


def _value_code(kind: Kind, x: str) -> tuple[list[str], str, int]:
    """(checks run on ``x``, the expression of its stored value(s), fields it packs)."""
    if kind in _INT:
        _, lo, hi = _INT[kind]
        return [f"if type({x}) is not int or not {lo} <= {x} < {hi}: raise NotFast"], x, 1
    if kind == Kind.FLOAT64:
        return [f"if type({x}) is not float and type({x}) is not int: raise NotFast"], f"float({x})", 1
    if kind == Kind.FLOAT32:
        return [f"if type({x}) is not float and type({x}) is not int: raise NotFast"], f"_f32({x})", 1
    if kind == Kind.BOOL:
        return [f"if type({x}) is not bool: raise NotFast"], f"1 if {x} else 0", 1
    if kind == Kind.TIMESTAMP:
        return [f"if type({x}) is str: {x} = _iso_us({x})",
                f"elif type({x}) is not int: raise NotFast",
                f"if not {TS_RANGE_US[0]} <= {x} <= {TS_RANGE_US[1]}: raise NotFast"], x, 1  # a read writes it back
    if kind == Kind.DATE:
        return [f"if type({x}) is not str: raise NotFast"], f"_date_days({x})", 1
    if kind == Kind.UUID:
        return [f"if type({x}) is not str: raise NotFast"], f"_uuid_bytes({x})", 1
    if kind in _STRUCT:
        f = _STRUCT[kind]
        keys = "{" + ", ".join(repr(k) for k in f) + "}"
        vals = ", ".join(f"{x}[{k!r}]" for k in f)
        return [f"if type({x}) is not dict or {x}.keys() != {keys}: raise NotFast",
                f"{x} = ({vals})",
                f"if not all((type(q) is float or type(q) is int) and _finite(q) for q in {x}): raise NotFast"], \
            ", ".join(f"float({x}[{i}])" for i in range(len(f))), len(f)
    if kind == Kind.STRING:
        return [f"if type({x}) is not str: raise NotFast"], f"{x}.encode()", 1
    if kind == Kind.BINARY:
        return [f"if type({x}) is not str: raise NotFast"], f"_b64({x})", 1
    raise AssertionError(kind)


def _zero(kind: Kind) -> str:
    return {Kind.UUID: "bytes(16)", Kind.POINT: "0.0, 0.0", Kind.BOX: "0.0, 0.0, 0.0, 0.0"}.get(
        kind, "0.0" if kind in (Kind.FLOAT32, Kind.FLOAT64) else "0")


class RowEncoder:
    """The generated encoders of one schema version: ``row(obj)`` → (row bytes, the key's
    value) for an upsert, ``tombstone(key)`` → (row bytes, key) for a delete; both raise
    :class:`NotFast` when the full path must decide."""

    def __init__(self, schema: SchemaVersion):
        self.schema = schema
        self.row, self.tombstone = _make(schema, False), _make(schema, True)


_ENCODERS: dict[int, tuple[SchemaVersion, RowEncoder | None]] = {}


def encoder(schema: SchemaVersion) -> RowEncoder | None:
    """The encoders of ``schema`` (cached by identity), or None when one of its column types
    has no fast path (json, range), or its key is a tuple (docs/format/keys.md): such tables
    always take the full path."""
    got = _ENCODERS.get(id(schema))
    if got is None or got[0] is not schema:
        if len(_ENCODERS) > 1024:
            _ENCODERS.clear()
        ok = all(c.type.kind in SUPPORTED for c in schema.columns) and schema.pk.kind != "tuple"
        got = _ENCODERS[id(schema)] = (schema, RowEncoder(schema) if ok else None)
    return got[1]


def _make(schema: SchemaVersion, tombstone: bool) -> Encode:
    """Python source for one schema version, compiled once: check every value, then one
    ``struct.pack`` of header, null bytes, fixed values and var ends, plus the var bytes.
    A tombstone (``r`` is the key) has the key, nulls where the column allows them and zeros
    (or empty bytes) elsewhere, as ``Database.delete`` writes it."""
    lay = layout(schema)
    nb = (len(schema.columns) + 7) // 8
    key = schema.pk.columns[0]  # a key of one column (``encoder``)
    body = [] if tombstone else ["for k in r:", "    if k not in NAMES: raise NotFast"]
    nulls: list[tuple[int, str]] = []  # (column position, expression of its null bit)
    vals: dict[int, str] = {}  # column id -> the packed value(s) / the var bytes
    for i, c in enumerate(schema.columns):
        x = f"x{i}"
        checks, val, _ = _value_code(c.type.kind, x)
        if c.id == key.id:
            body += [f"{x} = r" if tombstone else f"{x} = r.get({c.name!r})", *checks, f"key = {x}"]
            vals[c.id] = val
        elif tombstone:
            if c.nullable:
                nulls.append((i, str(1 << (i & 7))))
            vals[c.id] = "b''" if c.type.variable else _zero(c.type.kind)
        else:
            empty = "b''" if c.type.variable else f"({_zero(c.type.kind)},)"
            body += [f"{x} = r.get({c.name!r})", f"if {x} is None:"]
            if not c.nullable:
                body.append("    raise NotFast")
            else:
                body += [f"    n{i} = {1 << (i & 7)}", f"    {x} = {empty}"]
            body += ["else:", *("    " + ln for ln in checks), f"    n{i} = 0",
                     f"    {x} = {val}" if c.type.variable else f"    {x} = ({val},)"]
            if c.nullable:
                nulls.append((i, f"n{i}"))
            vals[c.id] = x if c.type.variable else f"*{x}"
    fmt = "<IIQB" + "B" * nb
    for c in lay.fixed:
        fmt += _FIXED.get(c.type.kind) or _INT[c.type.kind][0]
    fmt += "I" * len(lay.var)
    ends = []
    for j, c in enumerate(lay.var):
        body += [f"v{j} = {vals[c.id]}", f"e{j} = {f'e{j - 1} + ' if j else ''}len(v{j})"]
        ends.append(f"e{j}")
    total = f"{lay.size} + e{len(ends) - 1}" if ends else str(lay.size)
    null_bytes = [" | ".join(e for i, e in nulls if i >> 3 == b) or "0" for b in range(nb)]
    args = [total, str(schema.version), "0", str(DELETED if tombstone else 0), *null_bytes,
            *(vals[c.id] for c in lay.fixed), *ends]
    tail = "".join(f" + v{j}" for j in range(len(ends)))
    body += [f"return pack({', '.join(args)}){tail}, key"]
    src = "\n".join(["def encode(r):", *("    " + ln for ln in body)])
    env: dict[str, Any] = {
        "NotFast": NotFast, "NAMES": frozenset(c.name for c in schema.columns), "pack": struct.Struct(fmt).pack,
        "_iso_us": _iso_us, "_date_days": _date_days, "_uuid_bytes": _uuid_bytes, "_b64": _b64, "_f32": _f32,
        "_finite": math.isfinite}
    assert struct.calcsize(fmt) == lay.size, "layout and struct disagree"  # part of the format
    exec(compile(src, f"<row encoder v{schema.version}{' tombstone' if tombstone else ''}>", "exec"), env)
    return _guarded(env["encode"])


def _guarded(fn: Encode) -> Encode:
    def encode(r: Any) -> tuple[bytes, Any]:
        try:
            return fn(r)
        except (ValueError, TypeError, OverflowError, UnicodeError, KeyError, struct.error):
            raise NotFast from None
    encode.__wrapped__ = fn  # type: ignore[attr-defined]  # an attribute set on a function (inspect.unwrap)
    return encode


def index_key(key: object, kind: str) -> int | bytes:
    """A key value as the index's order-preserving scalar (``rowstore.tables.keys.encode_one``,
    which never wraps); NotFast for keys the full path has to judge (out of range, NUL in a
    string key, over the size limit, an empty string)."""
    if kind == "uuid" and isinstance(key, str):
        key = _uuid_bytes(key)
    if kind == "string" and key == "":
        raise NotFast
    try:
        ik: int | bytes = encode_one(key, kind)
        return ik
    except (RowstoreError, TypeError, AttributeError, UnicodeError):
        raise NotFast from None
