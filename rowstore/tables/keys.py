"""Primary keys -> order-preserving numpy keys and hash partitions (docs/rfcs/0001-row-index.md).

The partition of a key is part of the on-disk format: rows of a key live in its
partition's segments and index, so the hash below must never change.

* int64 keys (sign-flipped uint64): ``splitmix64(key) % P``;
* string and uuid keys (numpy ``S`` bytes, trailing NULs stripped as numpy does):
  ``fnv1a64(bytes) % P``.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable, Generic, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import InvalidKeyError, RowValidationError
from rowstore.schema import PrimaryKey
from rowstore.tables.key_check import MAX_KEY_BYTES, Key, show
from rowstore.tables.tuple_keys import encode_tuple, encode_tuple_and_head, encode_tuples, prefix_end
from rowstore.types import Kind

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@numba.njit(cache=True, nogil=True)
def _splitmix(keys: npt.NDArray[np.uint64], parts: int) -> npt.NDArray[np.int64]:
    out = np.empty(keys.shape[0], np.int64)
    for i in range(keys.shape[0]):
        z = keys[i] + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        out[i] = np.int64(z % np.uint64(parts))
    return out


@numba.njit(cache=True, nogil=True)
def _fnv(mat: npt.NDArray[np.uint8], parts: int, offset: np.uint64, prime: np.uint64) -> npt.NDArray[np.int64]:
    n, w = mat.shape
    out = np.empty(n, np.int64)
    for i in range(n):
        ln = w
        while ln > 0 and mat[i, ln - 1] == 0:
            ln -= 1
        h = offset
        for j in range(ln):
            h = (h ^ np.uint64(mat[i, j])) * prime
        out[i] = np.int64(h % np.uint64(parts))
    return out


def partition_of(keys: np.ndarray, parts: int) -> np.ndarray:
    """The partition (0..parts-1) of each encoded key."""
    if len(keys) == 0:
        return np.zeros(0, np.int64)
    if keys.dtype == np.uint64:
        return _splitmix(keys, parts)
    w = keys.dtype.itemsize
    return _fnv(np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), w), parts, _FNV_OFFSET, _FNV_PRIME)


@numba.njit(cache=True, nogil=True)
def _fill_fixed(data: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64], out: npt.NDArray[np.uint8]) -> None:
    for i in range(out.shape[0]):
        a, b = offsets[i], offsets[i + 1]
        for j in range(b - a):
            out[i, j] = data[a + j]


def string_keys(arr: pa.Array) -> np.ndarray:
    """UTF-8 string keys as a fixed-width ``S`` array (vectorized; NUL is refused because
    numpy's ``S`` strips trailing NULs, which would merge distinct keys)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, "S1")
    if pc.any(pc.match_substring(arr, "\x00")).as_py():
        raise RowValidationError("string primary keys must not contain NUL characters")
    arr = arr.cast(pa.large_string()) if arr.type != pa.large_string() else arr
    _, offs, data = arr.buffers()
    offsets = np.frombuffer(offs, np.int64)[arr.offset : arr.offset + len(arr) + 1]
    lens = np.diff(offsets)
    width = max(int(lens.max()), 1)
    if width > MAX_KEY_BYTES:  # checked before (rowstore/tables/key_check.py); never allocate n x a huge key
        raise InvalidKeyError(f"a string primary key is {width} bytes, over the key limit of {MAX_KEY_BYTES}")
    out = np.zeros((len(arr), width), np.uint8)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    _fill_fixed(raw, offsets, out)
    return out.view(f"S{width}").ravel()


def encode_keys(arr: pa.Array, kind: str) -> np.ndarray:
    """Checked primary keys (``rowstore.tables.key_check.check_keys``) as an order-preserving numpy
    array; an array of another type raises rather than being converted (no wrapping)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    want = {"int64": pa.int64(), "uuid": pa.binary(16)}.get(kind)
    if want is not None and arr.type != want:
        raise InvalidKeyError(f"{kind} primary keys come as {want}, not {arr.type}")
    if kind == "int64":
        flipped: np.ndarray = arr.to_numpy(zero_copy_only=False).view(np.uint64) ^ np.uint64(1 << 63)
        return flipped
    if kind == "uuid":
        return np.frombuffer(arr.buffers()[1], "S16")[arr.offset : arr.offset + len(arr)].copy()
    return string_keys(arr)


def decode_keys(keys: np.ndarray, kind: str) -> list[int] | list[bytes] | list[str]:
    if kind == "int64":
        ints: list[int] = (keys ^ np.uint64(1 << 63)).view(np.int64).tolist()
        return ints
    if kind == "uuid":
        return [bytes(k).ljust(16, b"\0") for k in keys]
    return [k.decode() for k in keys]


_M64 = (1 << 64) - 1


def partition_one(key: int | bytes, parts: int) -> int:
    """:func:`partition_of` for one encoded key (an int, or bytes) without arrays."""
    if isinstance(key, int):
        z = (key + 0x9E3779B97F4A7C15) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return (z ^ (z >> 31)) % parts
    h = 0xCBF29CE484222325
    for b in bytes(key).rstrip(b"\0"):
        h = ((h ^ b) * 0x100000001B3) & _M64
    return h % parts


def encode_one(key: object, kind: str) -> int | bytes:
    """One checked key (``rowstore.tables.key_check.check_key``) as the index's order-preserving scalar
    (int for int64, else bytes). Never wraps or truncates: a key outside its type raises."""
    # ``key`` is an object: node/http/fast_encoder.index_key passes values unchecked and relies on
    # the TypeError or AttributeError a value of another type raises here. The casts: ``kind``
    # says which a checked key is (int, bytes or str).
    if kind == "int64":
        enc = operator.index(cast(int, key)) + (1 << 63)  # == (key mod 2^64) ^ 2^63 for an int64
        if not 0 <= enc <= _M64:
            raise InvalidKeyError(f"primary key {show(key)} is out of range for int64")
        return enc
    if kind == "uuid":
        b = bytes(cast(bytes, key))
        if len(b) != 16:
            raise InvalidKeyError(f"primary key {show(key)} is not the 16 bytes of a uuid")
        return b
    b = cast(str, key).encode()
    if b"\0" in b:
        raise RowValidationError("string primary keys must not contain NUL characters")
    if len(b) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"primary key {show(key)} is over the key limit of {MAX_KEY_BYTES} bytes")
    return b


# -- a table's key, whatever its kind (docs/format/keys.md) ---------------------------------------

def key_arrays(pk: PrimaryKey, data: pa.RecordBatch | pa.Table) -> list[pa.Array]:
    """The key columns of ``data``, in key order."""
    out = []
    for name in pk.names:
        col = data.column(data.schema.get_field_index(name))
        out.append(col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col)
    return out


def _kinds(pk: PrimaryKey) -> list[Kind]:
    return [c.type.kind for c in pk.columns]


def encode_columns(pk: PrimaryKey, arrays: Sequence[pa.Array]) -> np.ndarray:
    """Checked key columns as the index's order-preserving keys (``u64`` or ``S``)."""
    if pk.kind != "tuple":
        return encode_keys(arrays[0], pk.kind)
    return encode_tuples(arrays, _kinds(pk))


def partitions_of(pk: PrimaryKey, arrays: Sequence[pa.Array], parts: int,
                  encoded: np.ndarray | None = None) -> np.ndarray:
    """The partition of each key (``encoded``: the keys' encoding, when the caller has it)."""
    n = pk.partition_columns
    if pk.kind != "tuple" or n == len(pk.columns):
        return partition_of(encoded if encoded is not None else encode_columns(pk, arrays), parts)
    return partition_of(encode_tuples(arrays[:n], _kinds(pk)[:n]), parts)


def encode_key(pk: PrimaryKey, values: Sequence[Key]) -> int | bytes:
    """One checked key (``check_key_tuple``) as the index's scalar: an int (kind int64) or bytes."""
    if pk.kind != "tuple":
        return encode_one(values[0], pk.kind)
    return encode_tuple(values, _kinds(pk))


def key_and_partition(pk: PrimaryKey, values: Sequence[Key], parts: int) -> tuple[int | bytes, int]:
    """:func:`encode_key` and :func:`partition_of_key` of one checked key, encoded once."""
    n = pk.partition_columns
    if pk.kind != "tuple" or n == len(pk.columns):
        k = encode_key(pk, values)
        return k, partition_one(k, parts)
    k, head = encode_tuple_and_head(values, _kinds(pk), n)
    return k, partition_one(head, parts)


def partition_of_key(pk: PrimaryKey, values: Sequence[Key], parts: int) -> int:
    n = pk.partition_columns
    if pk.kind != "tuple":
        return partition_one(encode_one(values[0], pk.kind), parts)
    return partition_one(encode_tuple(values[:n], _kinds(pk)[:n]), parts)


K = TypeVar("K", int, bytes)  # one kind's encoded keys: ints (kind int64) or bytes


@dataclass(frozen=True)
class KeyRange(Generic[K]):
    """Encoded keys between two bounds, each inclusive or not (None: unbounded)."""

    lo: K | None = None
    lo_inc: bool = True
    hi: K | None = None
    hi_inc: bool = False

    def slice_of(self, keys: np.ndarray) -> tuple[int, int]:
        """``[a, b)``: where the range lies in sorted ``keys``."""
        a = 0 if self.lo is None else int(np.searchsorted(keys, key_scalar(keys, self.lo),
                                                          "left" if self.lo_inc else "right"))
        b = len(keys) if self.hi is None else int(np.searchsorted(keys, key_scalar(keys, self.hi),
                                                                  "right" if self.hi_inc else "left"))
        return a, max(a, b)

    def holds(self, key: K) -> bool:
        return (self.lo is None or (key >= self.lo if self.lo_inc else key > self.lo)) and \
            (self.hi is None or (key <= self.hi if self.hi_inc else key < self.hi))

    def after(self, key: K) -> KeyRange[K]:
        """The part of this range above ``key`` (a scan's next page starts there)."""
        if self.lo is not None and (key < self.lo or key == self.lo and self.lo_inc):
            return self
        return KeyRange(key, False, self.hi, self.hi_inc)

    def starting_at(self, key: K) -> KeyRange[K]:
        """This range from ``key`` on, inclusive (a scan's next round)."""
        return replace(self, lo=key, lo_inc=True)

    def empty(self) -> bool:
        if self.lo is None or self.hi is None:
            return False
        return self.lo > self.hi or self.lo == self.hi and not (self.lo_inc and self.hi_inc)


def key_scalar(keys: np.ndarray, key: int | bytes) -> np.generic:
    """``key`` as numpy compares it with ``keys``: a u64, or bytes (numpy drops a bound's
    trailing NULs, and pads what it compares with NULs: the same order)."""
    return np.uint64(key) if keys.dtype == np.uint64 else np.bytes_(key)


def key_range(pk: PrimaryKey, prefix: Sequence[Key] = (), start: Sequence[Key] | None = None,
              end: Sequence[Key] | None = None) -> KeyRange[int] | KeyRange[bytes]:
    """The encoded keys that start with the components ``prefix`` and lie in ``[start, end)``,
    each a leading run of the key's components (checked values)."""
    if pk.kind == "int64":
        return _range(prefix, start, end, lambda v: cast(int, encode_one(v[0], "int64")))
    if pk.kind != "tuple":  # string, uuid: one component is the key itself
        return _range(prefix, start, end, lambda v: cast(bytes, encode_one(v[0], pk.kind)))
    kinds = _kinds(pk)
    enc: Callable[[Sequence[Key]], bytes] = lambda v: encode_tuple(v, kinds[: len(v)], end=False)  # noqa: E731
    r: KeyRange[bytes] = KeyRange()
    if prefix:
        p = enc(prefix)
        r = KeyRange(p, True, prefix_end(p), False)
    if start:
        r = _lower(r, enc(start))
    if end:
        r = _upper(r, enc(end))
    return r


def _range(prefix: Sequence[Key], start: Sequence[Key] | None, end: Sequence[Key] | None,
           enc: Callable[[Sequence[Key]], K]) -> KeyRange[K]:
    """A one-column key's range: its prefix is the key itself, its bounds are keys."""
    r: KeyRange[K] = KeyRange()
    if prefix:
        k = enc(prefix)
        r = KeyRange(k, True, k, True)
    if start:
        r = _lower(r, enc(start))
    if end:
        r = _upper(r, enc(end))
    return r


def _lower(r: KeyRange[K], lo: K) -> KeyRange[K]:
    return r if r.lo is not None and r.lo >= lo else KeyRange(lo, True, r.hi, r.hi_inc)


def _upper(r: KeyRange[K], hi: K) -> KeyRange[K]:
    return r if r.hi is not None and (r.hi < hi or r.hi == hi and not r.hi_inc) else KeyRange(r.lo, r.lo_inc, hi, False)


def bounded_range(pk: PrimaryKey, equal: Sequence[Key], lower: tuple[Key, bool] | None = None,
                  upper: tuple[Key, bool] | None = None) -> KeyRange[int] | KeyRange[bytes]:
    """The keys whose leading components are ``equal`` and whose next component lies within
    ``lower`` and ``upper`` (each a value and whether it is included): what a read's ``where``
    terms on the key's leading columns allow (docs/format/keys.md, "A prefix bounds its keys")."""
    n = len(equal)
    if pk.kind != "tuple":  # one column; Any: an int or bytes, by the kind (one type per range)
        if n:
            k: Any = encode_one(equal[0], pk.kind)
            return KeyRange(k, True, k, True)
        lo: Any = None if lower is None else encode_one(lower[0], pk.kind)
        hi: Any = None if upper is None else encode_one(upper[0], pk.kind)
        return KeyRange(lo, lower is None or lower[1], hi, upper is not None and upper[1])
    kinds = _kinds(pk)
    p = encode_tuple(equal, kinds[:n], end=False)
    r: KeyRange[bytes] = KeyRange(p or None, True, prefix_end(p) if p else None, False)
    if n < len(kinds):
        if lower is not None:
            b = encode_tuple([*equal, lower[0]], kinds[: n + 1], end=False)
            r = replace(r, lo=b if lower[1] else prefix_end(b), lo_inc=True)
        if upper is not None:
            b = encode_tuple([*equal, upper[0]], kinds[: n + 1], end=False)
            r = replace(r, hi=prefix_end(b) if upper[1] else b, hi_inc=False)
    return r
