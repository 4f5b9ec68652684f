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
"""
from __future__ import annotations

import operator
import re
from typing import Iterable, Sequence, SupportsIndex, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import InvalidKeyError, RowValidationError
from rowstore.schema import Column
from rowstore.types import Kind

MAX_KEY_BYTES = 1024  # a string key's UTF-8 length; index runs and the memtable rely on it
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_DECIMAL = re.compile(r"[+-]?[0-9]+", re.ASCII)
_UUID = r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"
_UUID_RE = re.compile(_UUID, re.ASCII)
_SHOWN = 48  # characters of a bad key quoted in an error


def check_key(value: object, key: Column, text: bool = True) -> int | str | bytes:
    """``value`` as the canonical Python value of the key column ``key`` (int, str, or 16
    bytes), or an :class:`InvalidKeyError` naming the key. ``text``: an int64 key may come
    as its decimal text (URLs, ``where`` values); JSON rows and Arrow data may not."""
    kind = key.type.kind
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
        if "\0" in value:
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


def check_keys(values: object, key: Column, where: str = "keys", text: bool = True) -> pa.Array:
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
            return _arrow_keys(values, key)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as e:
            try:
                _locate(values.to_pylist(), key, where, text=False)
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
            return _arrow_keys(arr, key)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        pass  # located value by value below
    return pa.array(_locate(values, key, where, text), key.type.arrow())


def _fast_list(values: Sequence[object], key: Column) -> pa.Array | None:
    """The list as an Arrow array at C speed when every value has the key's own type."""
    types = set(map(type, values))
    kind = key.type.kind
    if kind == Kind.INT64 and types <= {int}:
        return pa.array(values, pa.int64())  # beyond int64 raises: located below
    if kind == Kind.STRING and types <= {str}:
        return pa.array(values, pa.string())  # a lone surrogate raises: located below
    if kind == Kind.UUID and types <= {str}:
        return pa.array(values, pa.string())
    return None


def _locate(values: Iterable[object], key: Column, where: str, text: bool) -> list[int | str | bytes]:
    out = []
    for i, v in enumerate(values):
        try:
            out.append(check_key(v, key, text))
        except InvalidKeyError as e:
            raise InvalidKeyError(f"{where}[{i}]: {e}") from None
    return out


def _arrow_keys(arr: pa.Array, key: Column) -> pa.Array:
    """An Arrow array of keys as the key's Arrow type, every value checked (vectorized)."""
    kind, t = key.type.kind, arr.type
    if t == key.type.arrow() and kind != Kind.STRING:
        return arr  # int64, binary(16): every value fits
    if kind == Kind.INT64:
        if not pa.types.is_integer(t):
            raise InvalidKeyError(f"primary key {key.name!r} is int64; {t} values are not integers")
        return arr.cast(pa.int64(), safe=True)  # out of range raises: located by the caller
    if kind == Kind.STRING:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InvalidKeyError(f"primary key {key.name!r} is a string; {t} values are not strings")
        arr.validate(full=True)  # UTF-8 (an Arrow IPC body is not validated on read)
        if len(arr) and pc.max(pc.binary_length(arr)).as_py() > MAX_KEY_BYTES or \
                pc.any(pc.match_substring(arr, "\x00")).as_py():
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
