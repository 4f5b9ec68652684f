"""The column types (docs/REFERENCE.md §4), each mapped to one Arrow type
and to its fixed-width row storage (docs/format/segment.md §1)."""
from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rowstore.errors import SchemaError

TS = pa.timestamp("us", tz="UTC")
LOGICAL_KEY = b"terrascale.type"  # Arrow field metadata naming the logical type


class Kind(str, enum.Enum):
    INT8 = "int8"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"
    UINT16 = "uint16"
    UINT32 = "uint32"
    UINT64 = "uint64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BOOL = "bool"
    STRING = "string"
    BINARY = "binary"
    TIMESTAMP = "timestamp"
    DATE = "date"
    UUID = "uuid"
    JSON = "json"
    POINT = "point"
    BOX = "box"
    RANGE = "range"


_RANGE_ELEMS = {Kind.INT64, Kind.FLOAT64, Kind.TIMESTAMP}
_PRIMITIVE_ARROW = {
    Kind.INT8: pa.int8(), Kind.INT16: pa.int16(), Kind.INT32: pa.int32(), Kind.INT64: pa.int64(),
    Kind.UINT8: pa.uint8(), Kind.UINT16: pa.uint16(), Kind.UINT32: pa.uint32(), Kind.UINT64: pa.uint64(),
    Kind.FLOAT32: pa.float32(), Kind.FLOAT64: pa.float64(), Kind.BOOL: pa.bool_(),
    Kind.STRING: pa.string(), Kind.BINARY: pa.binary(), Kind.TIMESTAMP: TS, Kind.DATE: pa.date32(),
    Kind.UUID: pa.binary(16), Kind.JSON: pa.string(),
}
# numpy storage of fixed-width kinds (part of the format, docs/format/segment.md §1)
_STORAGE: dict[Kind, str | tuple[str, tuple[int]]] = {
    Kind.INT8: "<i1", Kind.INT16: "<i2", Kind.INT32: "<i4", Kind.INT64: "<i8",
    Kind.UINT8: "<u1", Kind.UINT16: "<u2", Kind.UINT32: "<u4", Kind.UINT64: "<u8",
    Kind.FLOAT32: "<f4", Kind.FLOAT64: "<f8", Kind.BOOL: "<u1", Kind.TIMESTAMP: "<i8",
    Kind.DATE: "<i4", Kind.UUID: ("u1", (16,)), Kind.POINT: ("<f8", (2,)), Kind.BOX: ("<f8", (4,)),
}
VARIABLE = {Kind.STRING, Kind.BINARY, Kind.JSON}
# a key of one column of these types keeps its single-column encoding (docs/format/keys.md)
PRIMARY_KEY_KINDS = {Kind.INT64, Kind.STRING, Kind.UUID}
# the types a primary key's columns may have (any key of others is tuple-encoded)
KEY_KINDS = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64,
             Kind.STRING, Kind.BINARY, Kind.UUID, Kind.TIMESTAMP, Kind.DATE, Kind.BOOL}
MAX_KEY_COLUMNS = 16
# the kinds a table may cluster its segments by (``cluster_by``; docs/rfcs/0009-gc.md)
CLUSTERABLE = {Kind.TIMESTAMP, Kind.DATE, Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8, Kind.UINT16,
               Kind.UINT32, Kind.UINT64, Kind.FLOAT32, Kind.FLOAT64, Kind.POINT, Kind.BOX}

# range flags (part of the format)
LOWER_INC, UPPER_INC, LOWER_UNB, UPPER_UNB = 0x01, 0x02, 0x04, 0x08

_RANGE_RE = re.compile(r"^range<\s*(\w+)\s*>$")


@dataclass(frozen=True, slots=True)
class ColumnType:
    kind: Kind
    elem: Kind | None = None  # element kind of range<...>

    @classmethod
    def parse(cls, text: str) -> "ColumnType":
        t = text.strip().lower()
        m = _RANGE_RE.match(t)
        if m:
            try:
                elem = Kind(m.group(1))
            except ValueError:
                elem = None
            if elem not in _RANGE_ELEMS:
                raise SchemaError(f"range<{m.group(1)}>: ranges are of int64, float64 or timestamp")
            return cls(Kind.RANGE, elem)
        try:
            kind = Kind(t)
        except ValueError:
            raise SchemaError(f"unknown type {text!r}") from None
        if kind == Kind.RANGE:
            raise SchemaError("range needs an element type: range<int64|float64|timestamp>")
        return cls(kind)

    def __str__(self) -> str:
        name: str = self.kind.value  # read before narrowing: mypy types a narrowed enum's .value as Any
        if self.kind != Kind.RANGE:
            return name
        assert self.elem is not None  # parse() gives every range its element kind
        return f"range<{self.elem.value}>"

    @property
    def variable(self) -> bool:
        return self.kind in VARIABLE

    def arrow(self) -> pa.DataType:
        """The one Arrow type this column type maps to."""
        got = _PRIMITIVE_ARROW.get(self.kind)
        return got if got is not None else _struct_arrow(self)

    def _struct(self) -> pa.DataType:
        if self.kind == Kind.POINT:
            return pa.struct([("x", pa.float64()), ("y", pa.float64())])
        if self.kind == Kind.BOX:
            return pa.struct([(n, pa.float64()) for n in ("xmin", "ymin", "xmax", "ymax")])
        assert self.elem is not None  # a range: parse() gives it its element kind
        e = _PRIMITIVE_ARROW[self.elem]
        return pa.struct([("lower", e), ("upper", e), ("lower_inclusive", pa.bool_()),
                          ("upper_inclusive", pa.bool_())])

    def storage(self) -> np.dtype[np.void] | str | tuple[str, tuple[int]] | None:
        """numpy dtype spec of the fixed-width storage (None for variable-width)."""
        if self.variable:
            return None
        if self.kind == Kind.RANGE:
            v = "<f8" if self.elem == Kind.FLOAT64 else "<i8"
            return np.dtype([("lo", v), ("hi", v), ("f", "u1")])
        return _STORAGE[self.kind]


@functools.lru_cache(maxsize=64)
def _struct_arrow(t: ColumnType) -> pa.DataType:
    """A struct column type's Arrow type, built once."""
    return t._struct()
