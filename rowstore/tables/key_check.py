"""Primary keys from users: the one check of a key against its column's type.

Every path that takes a key (point gets, ``get_many``, deletes, scans, ``where`` terms on
the key column, the key column of upserted rows — whichever client sent it) checks it
here *before* it is encoded (``tables.keys.encode_one``, ``index.key_memtable.encode_keys``), so
no key outside its type can reach the encoders, which would otherwise map it onto
another key (docs/REFERENCE.md §4). A key that does not fit is an :class:`InvalidKeyError`
naming the column and the key; the HTTP edge answers it with 400 ``bad_request``.

What a key of each primary-key type is:

======  ===============================================================================
int64   an integer (not a bool, not a float) in [-2^63, 2^63-1]; where keys arrive as
        text (a URL, a ``where`` value from the CLI), its ASCII decimal digits with an
        optional sign — no other digits, no spaces, no underscores
string  text of at most ``MAX_KEY_BYTES`` UTF-8 bytes with no NUL character (fixed-width
        numpy keys strip trailing NULs, which would merge distinct keys) and no lone
        surrogate (not UTF-8)
uuid    the canonical text: 8-4-4-4-12 hexadecimal digits (either case); or 16 bytes
======  ===============================================================================

A column of a key of several columns (or of one column of another type: a *tuple* key,
docs/format/keys.md) may also be:

==========  =========================================================================
int8…       an integer in the type's range (as int64 above), uint8…uint64 likewise
timestamp   integer microseconds since the epoch, or ISO-8601 text (``Z`` or an offset;
            without one, UTC), or a ``datetime``
date        ``YYYY-MM-DD`` text, integer days since 1970-01-01, or a ``date``
bool        true or false (as text: ``true``/``false``)
binary      bytes, or their base64 text (JSON, URLs)
string      as above, NUL allowed (the tuple encoding escapes it)
==========  =========================================================================
"""
from __future__ import annotations

import base64
import binascii
import datetime as dt
import operator
import re
from typing import Iterable, Sequence, SupportsIndex, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import InvalidKeyError, RowValidationError
from rowstore.schema import Column, PrimaryKey
from rowstore.types import TS, Kind

MAX_KEY_BYTES = 1024  # a string key's UTF-8 length; index runs and the memtable rely on it
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
_UUID_RE = re.compile(_UUID, re.ASCII)
_SHOWN = 48  # characters of a bad key quoted in an error
_INT_RANGES = {Kind.INT8: (-(1 << 7), (1 << 7) - 1), Kind.INT16: (-(1 << 15), (1 << 15) - 1),
               Kind.INT32: (-(1 << 31), (1 << 31) - 1), Kind.INT64: (INT64_MIN, INT64_MAX),
               Kind.UINT8: (0, (1 << 8) - 1), Kind.UINT16: (0, (1 << 16) - 1), Kind.UINT32: (0, (1 << 32) - 1),
               Kind.UINT64: (0, (1 << 64) - 1), Kind.DATE: (-(1 << 31), (1 << 31) - 1),
               Kind.TIMESTAMP: (INT64_MIN, INT64_MAX)}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


Key = int | str | bytes  # a checked key component (bool is an int; timestamps µs, dates days)


def check_key(value: object, key: Column, text: bool = True, nul_ok: bool = False) -> Key:
    """``value`` as the canonical Python value of the key column ``key`` (int, bool, str, or
    bytes; a timestamp as microseconds, a date as days), or an :class:`InvalidKeyError`
    naming the key. ``text``: a key may come as text (URLs, ``where`` values); JSON rows and
    Arrow data may not, except where JSON itself writes the type as text (timestamps,
    dates, binary). ``nul_ok``: a string may hold NUL (the tuple encoding escapes it)."""
    kind = key.type.kind
    if kind in _INT_RANGES and kind != Kind.INT64 or kind == Kind.INT64 and nul_ok:
        return _component(value, key, text)
    if kind in (Kind.BOOL, Kind.BINARY):
        return _component(value, key, text)
    if kind == Kind.INT64:
        if type(value) is int and INT64_MIN <= value <= INT64_MAX:  # the common case, first
            return value
        return _int64(value, key, text)
    if kind == Kind.STRING:
        if not isinstance(value, str):
            raise _bad(value, key, "is not a string")
        if len(value) > MAX_KEY_BYTES:  # before encoding: never copy a huge string
            raise _bad(value, key, f"is longer than the key limit of {MAX_KEY_BYTES} bytes")
        try:
            n = len(value.encode())
        except UnicodeEncodeError:
            raise _bad(value, key, "is not valid Unicode text (a lone surrogate)") from None
        if n > MAX_KEY_BYTES:
            raise _bad(value, key, f"is {n} bytes in UTF-8, over the key limit of {MAX_KEY_BYTES} bytes")
        if "\0" in value and not nul_ok:
            raise _bad(value, key, "contains a NUL character")
        return value
    if kind == Kind.UUID:
        if isinstance(value, (bytes, bytearray, memoryview)):
            b = bytes(value)
            if len(b) != 16:
                raise _bad(value, key, f"is {len(b)} bytes, not the 16 of a uuid")
            return b
        if not isinstance(value, str) or len(value) != 36 or not _UUID_RE.fullmatch(value):
            raise _bad(value, key, "is not a uuid in its canonical form (8-4-4-4-12 hexadecimal digits)")
        return bytes.fromhex(value.replace("-", ""))
    raise InvalidKeyError(f"column {key.name!r} is {key.type}, which cannot be a primary key")


def _component(value: object, key: Column, text: bool) -> Key:
    """A component of a tuple key of another type than int64, string or uuid."""
    kind = key.type.kind
    if kind == Kind.BOOL:
        if isinstance(value, (bool, np.bool_)):
            return bool(value)
        if text and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise _bad(value, key, "is not true or false")
    if kind == Kind.BINARY:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise _bad(value, key, "is not base64") from None
        raise _bad(value, key, "is not bytes (or their base64 text)")
    digits = text and isinstance(value, str) and _DECIMAL.fullmatch(value) is not None  # a URL's integer
    if kind == Kind.TIMESTAMP and not isinstance(value, (int, np.integer)) and not digits:
        value = _timestamp_of(value, key)
    elif kind == Kind.DATE and not isinstance(value, (int, np.integer)) and not digits:
        value = _date_of(value, key)
    v = _int64(value, key, text) if kind != Kind.UINT64 else _uint64(value, key, text)
    lo, hi = _INT_RANGES[kind]
    if not lo <= v <= hi:
        raise _bad(value, key, f"is out of range for {kind.value}")
    return v


def _timestamp_of(value: object, key: Column) -> int:
    if isinstance(value, dt.datetime):
        t = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        d = t - _EPOCH
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    if isinstance(value, str):
        try:
            return timestamp_us(value)
        except (ValueError, OverflowError):
            raise _bad(value, key, "is not an ISO-8601 timestamp") from None
    raise _bad(value, key, "is not a timestamp (ISO-8601 text or integer microseconds)")


def _date_of(value: object, key: Column) -> int:
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return (value - dt.date(1970, 1, 1)).days
    if isinstance(value, str) and len(value) == 10:
        try:
            return (dt.date.fromisoformat(value) - dt.date(1970, 1, 1)).days
        except ValueError:
            pass
    raise _bad(value, key, "is not a date YYYY-MM-DD")


def timestamp_us(v: object) -> int:
    """Integer microseconds, or an ISO-8601 string (``Z`` or an offset; naive means UTC)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if not isinstance(v, str):
        raise ValueError("timestamp")
    t = dt.datetime.fromisoformat(v.replace("Z", "+00:00") if v.endswith("Z") else v)
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    delta = t - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _uint64(value: object, key: Column, text: bool) -> int:
    if text and isinstance(value, str) and _DECIMAL.fullmatch(value) and len(value) <= 21:
        return int(value)
    if isinstance(value, (bool, np.bool_)) or isinstance(value, str):
        raise _bad(value, key, "is not an integer")
    try:
        return operator.index(cast(SupportsIndex, value))
    except TypeError:
        raise _bad(value, key, f"is {_what(value)}, not an integer") from None


def _int64(value: object, key: Column, text: bool) -> int:
    if text and type(value) is str and len(value) <= 18 and value.isascii() and value.isdigit():
        return int(value)  # a URL's key: 18 ASCII digits are always in range
    if isinstance(value, str):
        if not text:
            raise _bad(value, key, "is a string, not an integer")
        if not _DECIMAL.fullmatch(value):
            raise _bad(value, key, "is not an integer (ASCII decimal digits with an optional sign)")
        if len(value.lstrip("+-").lstrip("0")) > 19:  # no int() of thousands of digits
            raise _bad(value, key, "is out of range for int64")
        v = int(value)
    elif isinstance(value, (bool, np.bool_)):
        raise _bad(value, key, "is a boolean, not an integer")
    else:
        try:
            # ints and numpy integers; floats are refused (cast: any other type's TypeError is the answer)
            v = operator.index(cast(SupportsIndex, value))
        except TypeError:
            raise _bad(value, key, f"is {_what(value)}, not an integer") from None
    if not INT64_MIN <= v <= INT64_MAX:
        raise _bad(value, key, "is out of range for int64")
    return v


def check_keys(values: object, key: Column, where: str = "keys", text: bool = True, nul_ok: bool = False) -> pa.Array:
    """Many keys (a list, or an Arrow array) checked as :func:`check_key` does, as an Arrow
    array of the key's type. Vectorized when the values have the key's own type; a failure
    is then located value by value, so the error names the first bad key and its index
    (``where[i]``). A null key is a RowValidationError (a row without a key)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        if values.null_count:
            raise RowValidationError(f"primary key {key.name!r} values cannot be null")
        try:
            return _arrow_keys(values, key, nul_ok)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
            try:
                _locate(values.to_pylist(), key, where, False, nul_ok)
            except (pa.ArrowException, ValueError):  # not even convertible to Python values
                pass
            raise InvalidKeyError(f"{where}: primary key {key.name!r}: {str(e).splitlines()[0]}") from None
    if not isinstance(values, (list, tuple)):
        raise InvalidKeyError(f"{where} must be a list of primary key values")
    if any(v is None for v in values):
        raise RowValidationError(f"primary key {key.name!r} values cannot be null")
    try:
        arr = _fast_list(values, key)
        if arr is not None:
            return _arrow_keys(arr, key, nul_ok)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass  # located value by value below
    return component_array(_locate(values, key, where, text, nul_ok), key)


def component_array(values: Sequence[Key], key: Column) -> pa.Array:
    """Checked key values (``check_key``'s) as an Arrow array of the key column's type."""
    kind = key.type.kind
    if kind == Kind.TIMESTAMP:
        return pa.array(values, pa.int64()).view(TS)
    if kind == Kind.DATE:
        return pa.array(values, pa.int32()).view(pa.date32())
    return pa.array(values, key.type.arrow())


def _fast_list(values: Sequence[object], key: Column) -> pa.Array | None:
    """The list as an Arrow array at C speed when every value has the key's own type."""
    types = set(map(type, values))
    kind = key.type.kind
    if kind in _INT_RANGES and kind not in (Kind.TIMESTAMP, Kind.DATE) and types <= {int}:
        return pa.array(values, key.type.arrow())  # out of range raises: located below
    if kind == Kind.TIMESTAMP and types <= {int}:
        return pa.array(values, pa.int64()).view(TS)
    if kind == Kind.BOOL and types <= {bool}:
        return pa.array(values, pa.bool_())
    if kind == Kind.STRING and types <= {str}:
        return pa.array(values, pa.string())  # a lone surrogate raises: located below
    if kind == Kind.UUID and types <= {str}:
        return pa.array(values, pa.string())
    return None


def _locate(values: Iterable[object], key: Column, where: str, text: bool, nul_ok: bool = False) -> list[Key]:
    out = []
    for i, v in enumerate(values):
        try:
            out.append(check_key(v, key, text, nul_ok))
        except InvalidKeyError as e:
            raise InvalidKeyError(f"{where}[{i}]: {e}") from None
    return out


def _arrow_keys(arr: pa.Array, key: Column, nul_ok: bool = False) -> pa.Array:
    """An Arrow array of keys as the key's Arrow type, every value checked (vectorized)."""
    kind, t = key.type.kind, arr.type
    if t == key.type.arrow() and kind != Kind.STRING:
        return arr  # the column's own type: every value fits
    if kind in _INT_RANGES and kind not in (Kind.TIMESTAMP, Kind.DATE):
        if not pa.types.is_integer(t):
            raise InvalidKeyError(f"primary key {key.name!r} is {kind.value}; {t} values are not integers")
        return arr.cast(key.type.arrow(), safe=True)  # out of range raises: located by the caller
    if kind == Kind.TIMESTAMP:
        if pa.types.is_timestamp(t):
            return arr.cast(TS, safe=True)
        if pa.types.is_integer(t):
            return arr.cast(pa.int64(), safe=True).view(TS)
        raise ValueError("timestamps as text")  # converted value by value by the caller
    if kind == Kind.DATE:
        if pa.types.is_date(t):
            return arr.cast(pa.date32(), safe=True)
        raise ValueError("dates as text")
    if kind == Kind.BOOL:
        if not pa.types.is_boolean(t):
            raise InvalidKeyError(f"primary key {key.name!r} is bool; {t} values are not booleans")
        return arr
    if kind == Kind.BINARY:
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return arr.cast(pa.binary())
        raise ValueError("binary as base64 text")
    if kind == Kind.STRING:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InvalidKeyError(f"primary key {key.name!r} is a string; {t} values are not strings")
        arr.validate(full=True)  # UTF-8 (an Arrow IPC body is not validated on read)
        if len(arr) and pc.max(pc.binary_length(arr)).as_py() > MAX_KEY_BYTES or \
                not nul_ok and pc.any(pc.match_substring(arr, "\x00")).as_py():
            raise ValueError("a key over the limit or with a NUL")  # located by the caller
        return arr.cast(pa.string())
    if kind == Kind.UUID:
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            if len(arr) and not pc.all(pc.match_substring_regex(arr, f"^{_UUID}$")).as_py():
                raise ValueError("a key that is not a canonical uuid")  # located by the caller
            return pa.array([bytes.fromhex(s.replace("-", "")) for s in arr.to_pylist()], pa.binary(16))
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
            raise InvalidKeyError(f"primary key {key.name!r} is a uuid; {t} values are not uuids")
        if len(arr) and (np.asarray(pc.binary_length(arr)) != 16).any():
            raise ValueError("a key that is not 16 bytes")  # located by the caller
        return arr.cast(pa.binary(16))
    raise InvalidKeyError(f"column {key.name!r} is {key.type}, which cannot be a primary key")


def _what(v: object) -> str:
    return {float: "a float", dict: "an object", list: "a list", bytes: "bytes"}.get(type(v), type(v).__name__)


def _bad(value: object, key: Column, why: str) -> InvalidKeyError:
    return InvalidKeyError(f"primary key {key.name!r} ({key.type}): {show(value)} {why}")


def show(value: object) -> str:
    """A key as an error quotes it: its repr, cut to a readable length."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"  # repr() refuses ints over 4300 digits
    if isinstance(value, (str, bytes, bytearray)) and len(value) > _SHOWN:
        return f"{value[:_SHOWN]!r}... ({len(value)} {'characters' if isinstance(value, str) else 'bytes'})"
    text = repr(value)
    return text if len(text) <= 2 * _SHOWN else f"{text[:2 * _SHOWN]}... ({len(text)} characters)"


# -- a table's key: every component ---------------------------------------------------------------

def _components(value: object, pk: PrimaryKey, what: str, whole: bool) -> list[object]:
    """A user's key (or, not ``whole``, a prefix of it) as its components: a key of one column
    may be its value or a list of one; a longer key is a list of its components."""
    n = len(pk.columns)
    if isinstance(value, (list, tuple)):
        parts = list(value)
    elif n == 1 and whole:
        parts = [value]
    else:
        raise InvalidKeyError(f"{what}: {show(value)} is not a list of key components "
                              f"({', '.join(pk.names)})")
    if whole and len(parts) != n or len(parts) > n:
        need = f"{n} components ({', '.join(pk.names)})" if whole else f"at most {n} components"
        raise InvalidKeyError(f"{what}: {show(value)} has {len(parts)} key components; the key has {need}")
    return parts


def check_key_tuple(value: object, pk: PrimaryKey, text: bool = True, what: str = "key") -> tuple[Key, ...]:
    """One user key as its checked components (``check_key``'s values, in key order)."""
    nul_ok = pk.kind == "tuple"
    return tuple(check_key(v, c, text, nul_ok) for v, c in zip(_components(value, pk, what, True), pk.columns))


def check_prefix(value: object, pk: PrimaryKey, what: str, text: bool = False) -> tuple[Key, ...]:
    """A leading run of a key's components (a scan's ``prefix``, ``start`` or ``end``)."""
    if value is None:
        return ()
    nul_ok = pk.kind == "tuple"
    return tuple(check_key(v, c, text, nul_ok) for v, c in zip(_components(value, pk, what, False), pk.columns))


def check_key_lists(keys: object, pk: PrimaryKey, where: str = "keys", text: bool = True) -> list[pa.Array]:
    """Many user keys as one Arrow array per key column (vectorized per column)."""
    if not isinstance(keys, (list, tuple)):
        raise InvalidKeyError(f"{where} must be a list of primary keys")
    nul_ok = pk.kind == "tuple"
    if len(pk.columns) == 1 and not any(isinstance(k, (list, tuple)) for k in keys):
        return [check_keys(keys, pk.columns[0], where, text, nul_ok)]
    rows = [_components(k, pk, f"{where}[{i}]", True) for i, k in enumerate(keys)]
    return [check_keys([r[j] for r in rows], c, f"{where} ({c.name})", text, nul_ok)
            for j, c in enumerate(pk.columns)]


def check_key_columns(arrays: Sequence[pa.Array], pk: PrimaryKey, where: str = "keys") -> list[pa.Array]:
    """Key columns that arrived as Arrow (a delete's keys, another node's share), each checked
    as its column's keys (vectorized) and as the column's Arrow type."""
    nul_ok = pk.kind == "tuple"
    return [check_keys(a, c, where, False, nul_ok) for a, c in zip(arrays, pk.columns)]
