"""Column types <-> Spark types, and the vectorized Arrow conversions between them.

Every column type (docs/REFERENCE.md §4) maps to one Spark type (docs/spark.md has the table):
integers and floats to the Spark type of the same width, unsigned integers widened to the
next signed type that holds every value (``uint64`` to ``DecimalType(20, 0)``), ``timestamp``
to ``TimestampType`` (UTC), ``uuid`` to its canonical string, ``json`` to its text, ``point``,
``box`` and ``range<…>`` to structs of the fields the HTTP API uses.

Spark does not cast what a Python data source yields: a batch must carry exactly the Arrow
types ``pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")`` derives from the
source's schema, so :func:`to_spark_batch` produces exactly those, column by column, without
a Python loop over rows. :func:`to_table_batch` goes the other way for writes.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType, BooleanType, ByteType, DataType, DateType, DecimalType, DoubleType, FloatType, IntegerType,
    LongType, ShortType, StringType, StructField, StructType, TimestampType,
)

from rowstore.errors import RowValidationError
from rowstore.tables.key_check import check_keys
from rowstore.schema import Column, SchemaVersion
from rowstore.types import ColumnType, Kind
from spark_bridge.errors import BridgeError

TYPE_KEY = "terrascale.type"  # Spark field metadata: the column type a column has in the table

_SCALAR: dict[Kind, DataType] = {
    Kind.INT8: ByteType(), Kind.INT16: ShortType(), Kind.INT32: IntegerType(), Kind.INT64: LongType(),
    Kind.UINT8: ShortType(), Kind.UINT16: IntegerType(), Kind.UINT32: LongType(), Kind.UINT64: DecimalType(20, 0),
    Kind.FLOAT32: FloatType(), Kind.FLOAT64: DoubleType(), Kind.BOOL: BooleanType(), Kind.STRING: StringType(),
    Kind.BINARY: BinaryType(), Kind.TIMESTAMP: TimestampType(), Kind.DATE: DateType(), Kind.UUID: StringType(),
    Kind.JSON: StringType(),
}
_WIDEN = {Kind.UINT8: pa.int16(), Kind.UINT16: pa.int32(), Kind.UINT32: pa.int64()}
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
_UUID_HEX_AT = np.array([i for i in range(36) if i not in (8, 13, 18, 23)])  # the 32 hex digits' places
_UNHEX = np.full(256, 255, np.uint8)
_UNHEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_UNHEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_UNHEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def spark_type(t: ColumnType) -> DataType:
    if t.kind in _SCALAR:
        return _SCALAR[t.kind]
    if t.kind == Kind.POINT:
        return StructType([StructField("x", DoubleType()), StructField("y", DoubleType())])
    if t.kind == Kind.BOX:
        return StructType([StructField(n, DoubleType()) for n in ("xmin", "ymin", "xmax", "ymax")])
    e = _SCALAR[t.elem]
    return StructType([StructField("lower", e), StructField("upper", e), StructField("lower_inclusive", BooleanType()),
                       StructField("upper_inclusive", BooleanType())])


def spark_schema(schema: SchemaVersion, extra: list[StructField] = (), columns: list[Column] | None = None
                 ) -> StructType:
    """The Spark schema of a table's columns at one schema version (or of ``columns`` of it),
    plus ``extra`` fields."""
    return StructType([StructField(c.name, spark_type(c.type), c.nullable, {TYPE_KEY: str(c.type)})
                       for c in (schema.columns if columns is None else columns)] + list(extra))


def select_columns(schema: SchemaVersion, names, table: str = "the table") -> list[Column]:
    """The columns ``names`` (matched case-insensitively, as Spark does) in that order; all
    of them for None. An unknown name is a :class:`BridgeError` listing the columns."""
    if names is None:
        return list(schema.columns)
    out = []
    for n in names:
        col = next((c for c in schema.columns if c.name.lower() == n.lower()), None)
        if col is None:
            raise BridgeError(f"option columns: {table} has no column {n!r} at this snapshot "
                              f"(its columns: {', '.join(c.name for c in schema.columns)})")
        out.append(col)
    return out


def decoding_schema(schema: SchemaVersion, keep: list[Column]) -> SchemaVersion:
    """``schema`` narrowed to ``keep`` plus the primary key (rows decode by column id, and a
    column the target lacks is skipped: fewer columns, less decoding)."""
    ids = {c.id for c in keep} | set(schema.primary_key)
    return replace(schema, columns=tuple(c for c in schema.columns if c.id in ids))


def spark_arrow_schema(schema: StructType) -> pa.Schema:
    """Exactly the Arrow schema Spark checks a Python data source's batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


# -- reads: table Arrow -> Spark Arrow ------------------------------------------------------


def to_spark_column(arr: pa.Array, t: ColumnType) -> pa.Array:
    """One column of the engine's Arrow type as the Arrow type of its Spark type."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    k = t.kind
    if k in _WIDEN:
        return arr.cast(_WIDEN[k])
    if k == Kind.UINT64:
        return _uint64_to_decimal(arr)
    if k == Kind.UUID:
        return uuid_strings(arr)
    return arr


def to_spark_batch(batch: pa.RecordBatch | pa.Table, kinds: list[ColumnType], target: pa.Schema) -> pa.RecordBatch:
    """``batch`` (columns in ``target``'s order, of the engine's types ``kinds``) as a record
    batch of exactly ``target``'s schema."""
    cols = [to_spark_column(batch.column(i), kinds[i]) for i in range(len(kinds))]
    cols += [batch.column(i) for i in range(len(kinds), batch.num_columns)]
    cols = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]
    return pa.RecordBatch.from_arrays(cols, schema=target)


def _uint64_to_decimal(arr: pa.Array) -> pa.Array:
    """uint64 -> decimal128(20, 0) by laying the values into the 16-byte little-endian
    two's-complement slots (the high half is zero: every uint64 fits)."""
    n = len(arr)
    slots = np.zeros((n, 2), np.uint64)
    slots[:, 0] = np.asarray(arr.fill_null(0))
    validity = _validity(arr)
    return pa.Array.from_buffers(pa.decimal128(20, 0), n, [validity, pa.py_buffer(slots)], null_count=arr.null_count)


def uuid_strings(arr: pa.Array) -> pa.Array:
    """binary(16) -> the canonical ``8-4-4-4-12`` lowercase strings."""
    n = len(arr)
    raw = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * 16:(arr.offset + n) * 16].reshape(n, 16)
    text = np.full((n, 36), ord("-"), np.uint8)
    digits = np.empty((n, 32), np.uint8)
    digits[:, 0::2] = _HEX[raw >> 4]
    digits[:, 1::2] = _HEX[raw & 15]
    text[:, _UUID_HEX_AT] = digits
    offsets = pa.py_buffer(np.arange(0, 36 * (n + 1), 36, dtype=np.int32))
    return pa.Array.from_buffers(pa.string(), n, [_validity(arr), offsets, pa.py_buffer(text)],
                                 null_count=arr.null_count)


def _validity(arr: pa.Array) -> pa.Buffer | None:
    """``arr``'s validity bitmap starting at bit 0 (sliced arrays start mid-byte)."""
    if arr.null_count == 0:
        return None
    if arr.offset == 0:
        return arr.buffers()[0]
    bits = np.asarray(arr.is_valid()).astype(np.uint8)
    return pa.py_buffer(np.packbits(bits, bitorder="little"))


# -- writes: Spark Arrow -> table Arrow ------------------------------------------------------


def to_table_batch(batch: pa.RecordBatch, schema: SchemaVersion) -> pa.RecordBatch:
    """A batch from Spark as the table's own Arrow types, matching columns by name (case
    insensitively, as Spark does). Lossy or impossible conversions are a :class:`BridgeError`
    naming the column; a column the table does not have is one too."""
    cols, fields = [], []
    for name, arr in zip(batch.schema.names, batch.columns):
        col = next((c for c in schema.columns if c.name.lower() == name.lower()), None)
        if col is None:
            raise BridgeError(f"column {name!r} is not a column of the table (columns: "
                              f"{', '.join(c.name for c in schema.columns)})")
        arr = _from_spark(arr, col.type, col.name)
        if col.id in schema.primary_key:  # the node's one key check, here before anything is sent
            try:
                arr = check_keys(arr, col, "rows", False, schema.pk.kind == "tuple")
            except RowValidationError as e:
                raise BridgeError(f"column {name!r}: {e}") from None
        cols.append(arr)
        fields.append(col.field())
    return pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))


def _from_spark(arr: pa.Array, t: ColumnType, name: str) -> pa.Array:
    want = t.arrow()
    if arr.type.equals(want):
        return arr
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), want)
    try:
        if t.kind == Kind.UUID and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            return uuid_bytes(arr, name)
        return arr.cast(want, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise BridgeError(f"column {name!r}: {arr.type} values do not fit type {t}: {e}") from None


def uuid_bytes(arr: pa.Array, name: str = "uuid") -> pa.Array:
    """Canonical uuid strings (dashes optional, any case) -> binary(16)."""
    n = len(arr)
    compact = pc.replace_substring(arr.cast(pa.string()).fill_null("0" * 32), "-", "")
    if n and (pc.min(pc.binary_length(compact)).as_py() != 32 or pc.max(pc.binary_length(compact)).as_py() != 32):
        raise BridgeError(f"column {name!r}: uuid values are 32 hex digits (with or without dashes)")
    chars = np.frombuffer(compact.buffers()[2], np.uint8)
    start = np.frombuffer(compact.buffers()[1], np.int32)[compact.offset]
    nib = _UNHEX[chars[start:start + 32 * n]].reshape(n, 32)
    if (nib == 255).any():
        raise BridgeError(f"column {name!r}: a uuid value has a character that is not a hex digit")
    raw = (nib[:, 0::2] << 4) | nib[:, 1::2]
    return pa.Array.from_buffers(pa.binary(16), n, [_validity(arr), pa.py_buffer(raw.astype(np.uint8))],
                                 null_count=arr.null_count)
