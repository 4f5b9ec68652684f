"""Rows between JSON and Arrow, exactly as docs/REFERENCE.md §4 says.

JSON in (``{"rows": [...]}``): every value is checked against its column's type
and the batch is rejected whole on the first misfit, naming the row and column.
No silent coercion: a string is not a number, a float is not an integer, a
number is not a boolean. What each type takes:

=================  =====================================================================
int*/uint*         JSON integer in range
float32/float64    JSON number, or "NaN" / "Infinity" / "-Infinity" (protobuf's convention)
bool               true / false
string             JSON string
binary             base64 string
timestamp          ISO-8601 string (``Z`` or an offset; none means UTC) or integer µs
date               ``YYYY-MM-DD``
uuid               canonical string
json               any JSON value (stored as its compact text)
point / box        ``{"x", "y"}`` / ``{"xmin", "ymin", "xmax", "ymax"}`` of numbers
range<E>           ``{"lower", "upper", "lower_inclusive", "upper_inclusive"}``; a null or
                   missing bound is unbounded; flags default to ``[lower, upper)``
=================  =====================================================================

JSON out: the same shapes, timestamps as ISO-8601 ending in ``Z``. Columns are
converted whole (Arrow kernels where one exists), not value by value.
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import math
import uuid as uuidlib
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rowstore.tables import json_text
from rowstore.errors import RowValidationError
from rowstore.tables.key_check import check_keys
from rowstore.reads.predicates import timestamp_us
from rowstore.schema import Column, SchemaVersion
from rowstore.types import LOGICAL_KEY, ColumnType, Kind
from node.errors import NodeError
from node.json_columns import iso_strings, rows_of_columns

ARROW_STREAM = "application/vnd.apache.arrow.stream"
_INT_RANGE = {
    Kind.INT8: (-(2**7), 2**7), Kind.INT16: (-(2**15), 2**15), Kind.INT32: (-(2**31), 2**31),
    Kind.INT64: (-(2**63), 2**63), Kind.UINT8: (0, 2**8), Kind.UINT16: (0, 2**16),
    Kind.UINT32: (0, 2**32), Kind.UINT64: (0, 2**64),
}
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_EPOCH_DAY = dt.date(1970, 1, 1)
_Conv = Callable[[Any, ColumnType], object]  # a JSON value checked against its column type, as stored


class _Bad(NodeError):
    """One value does not fit its type (becomes a RowValidationError naming row and column)."""


# -- JSON in --------------------------------------------------------------------------------------


def rows_to_table(rows: object, schema: SchemaVersion) -> pa.Table:
    """``rows`` (a list of JSON objects) as an Arrow table of the columns they name.

    Columns no row names are left out (the engine fills them with nulls); a column
    some rows lack is null there. Raises RowValidationError on the first misfit."""
    if not isinstance(rows, list):
        raise RowValidationError('"rows" must be a list of objects')
    names: dict[str, Column] = {}
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise RowValidationError(f"rows[{i}]: expected an object, got {_jtype(r)}")
        for k in r:
            if k not in names:
                col = schema.by_name(k)
                if col is None:
                    raise RowValidationError(f"rows[{i}]: unknown column {k!r}")
                names[k] = col
    missing = [k for k in schema.pk.names if k not in names]
    if missing and rows:
        raise RowValidationError(f"the primary key column {missing[0]!r} is missing")
    arrays: list[pa.Array] = []
    fields: list[pa.Field] = []
    for name, col in names.items():
        values, nul_ok = [r.get(name) for r in rows], schema.pk.kind == "tuple"  # keys: the one key check
        arrays.append(check_keys(values, col, "rows", False, nul_ok) if col.id in schema.primary_key
                      else column_from_json(values, col))
        fields.append(col.field())
    if not rows:
        return schema.arrow().empty_table()
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def column_from_json(values: list[Any], col: Column) -> pa.Array:
    fast = _fast_column(values, col)
    if fast is not None:
        return fast
    conv = _IN[col.type.kind]
    out: list[object] = []
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        try:
            out.append(conv(v, col.type))
        except _Bad as e:
            raise RowValidationError(f"rows[{i}].{col.name}: {e}") from None
    try:
        return pa.array(out, col.type.arrow())
    except (pa.ArrowInvalid, OverflowError) as e:  # belt and braces: the checks above should catch it
        raise RowValidationError(f"column {col.name!r}: {e}") from None


_NONE = type(None)
_STRUCT_FIELDS = {Kind.POINT: ("x", "y"), Kind.BOX: ("xmin", "ymin", "xmax", "ymax")}


def _fast_column(values: list[Any], col: Column) -> pa.Array | None:
    """The whole column at C speed when every value already has the one right JSON type;
    None sends it to the value-by-value path (which also names the first misfit)."""
    k = col.type.kind
    types = set(map(type, values))
    types.discard(_NONE)
    want = col.type.arrow()
    try:
        if k in _INT_RANGE and types <= {int}:
            return pa.array(values, want)  # out of range raises: the slow path names the row
        if k == Kind.FLOAT64 and types <= {int, float}:
            return pa.array(values, want)
        if k == Kind.BOOL and types <= {bool} or k == Kind.STRING and types <= {str}:
            return pa.array(values, want)
        if k == Kind.TIMESTAMP and types <= {int}:
            return pa.array(values, pa.int64()).cast(want)
        if k == Kind.TIMESTAMP and types <= {str}:
            return pa.array(values, pa.string()).cast(want)  # ISO-8601 with Z or an offset
        if k in _STRUCT_FIELDS and types <= {dict}:
            fields = _STRUCT_FIELDS[k]
            keys = set(fields)
            if any(v.keys() != keys or not {type(x) for x in v.values()} <= {int, float}
                   for v in values if v is not None):
                return None
            arr = pa.array(values, want)
            if not all(pc.all(pc.is_finite(arr.field(f))).as_py() in (True, None) for f in fields):
                return None
            return arr
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError, ValueError):
        return None
    return None


def _jtype(v: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(v), "a number")


def _int(v: object, t: ColumnType) -> int:
    if type(v) is not int:
        raise _Bad(f"expected an integer ({t}), got {_jtype(v)} {v!r}")
    lo, hi = _INT_RANGE[t.kind]
    if not lo <= v < hi:
        raise _Bad(f"{_short(v)} is out of range for {t}")
    return v


def _float(v: Any, t: ColumnType | None = None) -> float:
    if type(v) in (int, float):
        try:
            f = float(v)
        except OverflowError:  # an integer beyond any float
            raise _Bad(f"the integer of {v.bit_length()} bits is out of range for {t or 'float64'}") from None
        if t is not None and t.kind == Kind.FLOAT32 and math.isfinite(f) and abs(f) > 3.4028234663852886e38:
            raise _Bad(f"{v} is out of range for float32")
        return f
    if isinstance(v, str) and v in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[v]
    raise _Bad(f"expected a number, got {_jtype(v)} {v!r}")


def finite_float(x: Any) -> float | None:
    """A JSON number as a finite float, or None (not a number, NaN, infinite, or an integer
    beyond any float)."""
    if type(x) not in (int, float):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _short(x: object) -> str:
    return f"an integer of {x.bit_length()} bits" if type(x) is int and x.bit_length() > 64 else repr(x)[:60]


def _bool(v: object, t: ColumnType) -> bool:
    if type(v) is not bool:
        raise _Bad(f"expected true or false, got {_jtype(v)} {v!r}")
    return v


def _string(v: object, t: ColumnType) -> str:
    if not isinstance(v, str):
        raise _Bad(f"expected a string, got {_jtype(v)} {v!r}")
    try:
        v.encode()
    except UnicodeEncodeError:  # JSON's "\ud800" escape: a lone surrogate is not text
        raise _Bad(f"{v[:40]!r} is not valid Unicode text (a lone surrogate)") from None
    return v


def _binary(v: object, t: ColumnType) -> bytes:
    if not isinstance(v, str):
        raise _Bad(f"expected a base64 string, got {_jtype(v)}")
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise _Bad(f"{v[:40]!r} is not valid base64") from None


def _timestamp(v: object, t: ColumnType | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise _Bad(f"expected an ISO-8601 string or integer microseconds, got {_jtype(v)} {v!r}")
    try:
        us = timestamp_us(v)
    except (ValueError, TypeError, OverflowError):
        raise _Bad(f"{v!r} is not an ISO-8601 timestamp") from None
    if not -(2**63) <= us < 2**63:
        raise _Bad(f"{v!r} is out of range for timestamp")
    return us


def _date(v: object, t: ColumnType) -> dt.date:
    if not isinstance(v, str) or len(v) != 10:
        raise _Bad(f"expected a date YYYY-MM-DD, got {_jtype(v)} {v!r}")
    try:
        return dt.date.fromisoformat(v)
    except ValueError:
        raise _Bad(f"{v!r} is not a date YYYY-MM-DD") from None


def _uuid(v: object, t: ColumnType) -> bytes:
    if not isinstance(v, str):
        raise _Bad(f"expected a uuid string, got {_jtype(v)} {v!r}")
    try:
        return uuidlib.UUID(v).bytes
    except ValueError:
        raise _Bad(f"{v!r} is not a uuid") from None


def _json(v: object, t: ColumnType) -> str:
    try:
        return json.dumps(v, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or Infinity inside: not JSON
        raise _Bad("NaN and Infinity are not JSON values") from None


def _struct(fields: tuple[str, ...]) -> _Conv:
    def conv(v: object, t: ColumnType) -> dict[str, float]:
        if not isinstance(v, dict):
            raise _Bad(f"expected an object {{{', '.join(fields)}}}, got {_jtype(v)}")
        if set(v) != set(fields):
            raise _Bad(f"expected exactly the fields {', '.join(fields)}; got {', '.join(sorted(v)) or 'none'}")
        out: dict[str, float] = {}
        for f in fields:
            x = v[f]
            fx = finite_float(x)
            if fx is None:
                raise _Bad(f"{f} must be a finite number, got {_short(x)}")
            out[f] = fx
        return out
    return conv


_RANGE_FIELDS = ("lower", "upper", "lower_inclusive", "upper_inclusive")


def _range(v: object, t: ColumnType) -> dict[str, object]:
    if not isinstance(v, dict):
        raise _Bad(f"expected an object {{{', '.join(_RANGE_FIELDS)}}}, got {_jtype(v)}")
    extra = set(v) - set(_RANGE_FIELDS)
    if extra:
        raise _Bad(f"unknown range field(s) {', '.join(sorted(extra))}")
    assert t.elem is not None  # a range type always has its element kind (ColumnType.parse)
    elems: dict[Kind, Callable[[Any], object]] = {
        Kind.INT64: lambda x: _int(x, ColumnType(Kind.INT64)), Kind.FLOAT64: _float, Kind.TIMESTAMP: _timestamp}
    elem = elems[t.elem]
    out: dict[str, object] = {}
    for f in ("lower", "upper"):
        out[f] = None if v.get(f) is None else elem(v[f])
    for f, default in (("lower_inclusive", True), ("upper_inclusive", False)):
        x = v.get(f, default)
        if type(x) is not bool:
            raise _Bad(f"{f} must be true or false, got {x!r}")
        out[f] = x
    return out


_IN: dict[Kind, _Conv] = {
    **{k: _int for k in _INT_RANGE}, Kind.FLOAT32: _float, Kind.FLOAT64: _float, Kind.BOOL: _bool,
    Kind.STRING: _string, Kind.BINARY: _binary, Kind.TIMESTAMP: _timestamp, Kind.DATE: _date,
    Kind.UUID: _uuid, Kind.JSON: _json, Kind.POINT: _struct(("x", "y")),
    Kind.BOX: _struct(("xmin", "ymin", "xmax", "ymax")), Kind.RANGE: _range,
}


# -- JSON out -------------------------------------------------------------------------------------


def column_type(field: pa.Field) -> ColumnType | None:
    """The column type a result field carries in its metadata (None: plain Arrow)."""
    meta = field.metadata or {}
    return ColumnType.parse(meta[LOGICAL_KEY].decode()) if LOGICAL_KEY in meta else None


def table_to_rows(t: pa.Table) -> list[dict[str, Any]]:
    """Every row as a JSON-ready dict (columns converted whole)."""
    cols: dict[str, list[Any]] = {}
    for field, arr in zip(t.schema, t.columns):
        ct = column_type(field)
        cols[field.name] = column_to_json(arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr, ct)
    if not cols:
        return [{} for _ in range(t.num_rows)]
    return rows_of_columns(list(cols), list(cols.values()))


def column_to_json(arr: pa.Array, ct: ColumnType | None) -> list[Any]:
    k = ct.kind if ct is not None else None
    if pa.types.is_timestamp(arr.type):
        return iso_strings(arr)
    if pa.types.is_date(arr.type):
        dates: list[Any] = arr.cast(pa.string()).to_pylist()
        return dates
    if k == Kind.UUID:
        return [None if b is None else str(uuidlib.UUID(bytes=b)) for b in arr.to_pylist()]
    if k == Kind.JSON:
        return [None if s is None else json.loads(s) for s in arr.to_pylist()]
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) or pa.types.is_fixed_size_binary(arr.type):
        return [None if b is None else base64.b64encode(b).decode() for b in arr.to_pylist()]
    if pa.types.is_floating(arr.type):
        if pc.all(pc.is_finite(arr)).as_py() in (True, None):  # no NaN or infinity: the values as they are
            floats: list[Any] = arr.to_pylist()
            return floats
        return [_float_out(x) for x in arr.to_pylist()]
    if k == Kind.RANGE and ct is not None and ct.elem == Kind.TIMESTAMP:
        lo, hi = iso_strings(arr.field("lower")), iso_strings(arr.field("upper"))
        vals = arr.to_pylist()
        return [None if v is None else dict(v, lower=a, upper=b) for v, a, b in zip(vals, lo, hi)]
    if k in (Kind.POINT, Kind.BOX, Kind.RANGE):
        return [None if v is None else {f: _float_out(x) if isinstance(x, float) else x for f, x in v.items()}
                for v in arr.to_pylist()]
    values: list[Any] = arr.to_pylist()
    return values


def _float_out(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def value_to_json(v: Any, ct: ColumnType | None) -> object:
    """One Python value as the engine's point read returns it (datetime, date, bytes, str
    for json, dicts for point/box/range) in its JSON form."""
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return iso_z(v)
    if isinstance(v, dt.date):
        return v.isoformat()
    k = ct.kind if ct is not None else None
    if k == Kind.UUID:
        return str(uuidlib.UUID(bytes=bytes(v)))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if k == Kind.JSON:
        return json.loads(v)
    if isinstance(v, float):
        return _float_out(v)
    if isinstance(v, dict):
        return {f: value_to_json(x, None) for f, x in v.items()}
    return v


def iso_z(t: dt.datetime) -> str:
    if t.tzinfo is not None:
        t = t.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def row_to_json(row: dict[str, Any], schema: SchemaVersion | None) -> dict[str, object]:
    types = {c.name: c.type for c in schema.columns} if schema is not None else {}
    return {name: value_to_json(v, types.get(name)) for name, v in row.items()}


# -- JSON bodies ----------------------------------------------------------------------------------


class BodyError(NodeError):
    """A request body that cannot be decoded (``status``, ``code``: 400 invalid_json)."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_json"):
        super().__init__(message)
        self.status, self.code = status, code


def parse_json_body(body: bytes, max_depth: int) -> Any:
    """A request body as strict JSON nested at most ``max_depth`` deep (``rowstore/tables/json_text.py``:
    no bare NaN / Infinity — a float column takes the strings "NaN", "Infinity", "-Infinity";
    the depth is checked before parsing)."""
    try:
        return json_text.loads(body, max_depth)
    except json_text.JsonTextError as e:
        hint = " (node.max_json_depth)" if "deep" in str(e) else ""
        raise BodyError(f"the body {e}{hint}") from None


json_depth_over = json_text.depth_over


# -- Arrow IPC ------------------------------------------------------------------------------------


def read_arrow_stream(body: bytes) -> pa.Table:
    """An Arrow IPC stream body as a table; a malformed stream is a RowValidationError."""
    try:
        with pa.ipc.open_stream(pa.BufferReader(body)) as r:
            return r.read_all()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, OSError, ValueError) as e:
        raise RowValidationError(f"the body is not a valid Arrow IPC stream: {str(e).splitlines()[0]}") from None


def write_arrow_stream(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    out: bytes = sink.getvalue().to_pybytes()
    return out


def schema_to_json(schema: SchemaVersion) -> list[dict[str, Any]]:
    return [{"name": c.name, "type": str(c.type), "nullable": c.nullable, "id": c.id} for c in schema.columns]
