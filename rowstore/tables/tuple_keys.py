"""The tuple key encoding (docs/format/keys.md): a primary key of one or more columns as bytes
whose byte order is the key's order, with no key a prefix of another.

Each component is a type tag, then its value: fixed-width integers big-endian with the sign
bit flipped (timestamps and dates as their int64 / int32), bool as one byte, uuid as its 16
bytes; strings and binary with every 0x00 written 0x00 0xFF, then a 0x00. A whole key ends
with 0x01 (``END``), so no key ends in 0x00 and fixed-width numpy byte arrays (``S``), which
drop trailing NULs, hold every key exactly. A *prefix* — the leading components of a key, as
scans and bounds name them — is encoded without the ``END``.

Everything here is part of the format: a change to a tag, a width or the escape fails the
known-answer tests (tests/rowstore/tables/test_tuple_keys.py).
"""
from __future__ import annotations

import struct
import uuid as uuidlib
from collections.abc import Sequence

import numba
import numpy as np
import pyarrow as pa

from rowstore.errors import InvalidKeyError
from rowstore.types import Kind

END = 0x01  # the last byte of every key (never a tag)
ESCAPE = 0xFF  # 0x00 inside a string or binary value is written 0x00 0xFF
MAX_KEY_BYTES = 1024  # an encoded key, END included
TAGS = {
    Kind.BOOL: 0x10, Kind.INT8: 0x11, Kind.INT16: 0x12, Kind.INT32: 0x13, Kind.INT64: 0x14,
    Kind.UINT8: 0x15, Kind.UINT16: 0x16, Kind.UINT32: 0x17, Kind.UINT64: 0x18,
    Kind.DATE: 0x19, Kind.TIMESTAMP: 0x1A, Kind.STRING: 0x20, Kind.BINARY: 0x21, Kind.UUID: 0x30,
}
KINDS = frozenset(TAGS)  # the types a key component may have
_FIXED = {  # kind -> (width, signed)
    Kind.BOOL: (1, False), Kind.INT8: (1, True), Kind.INT16: (2, True), Kind.INT32: (4, True),
    Kind.INT64: (8, True), Kind.UINT8: (1, False), Kind.UINT16: (2, False), Kind.UINT32: (4, False),
    Kind.UINT64: (8, False), Kind.DATE: (4, True), Kind.TIMESTAMP: (8, True), Kind.UUID: (16, False),
}
_INT_OF = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_STRUCT = {1: "B", 2: ">H", 4: ">I", 8: ">Q"}
_BY_TAG = {t: k for k, t in TAGS.items()}


# -- many keys at once (vectorized; numba where a loop is needed) ---------------------------------

def encode_tuples(columns: Sequence[pa.Array], kinds: Sequence[Kind], end: bool = True) -> np.ndarray:
    """Keys (``end``) or prefixes of ``len(columns)`` components as a fixed-width ``S`` array,
    one per row. The values must be checked already: non-null, each of its column's type."""
    n = len(columns[0]) if columns else 0
    parts = [_component(_flat(c), k) for c, k in zip(columns, kinds)]
    lengths = np.full(n, 1 if end else 0, np.int64)
    for p in parts:
        lengths += p.lengths
    width = int(lengths.max()) if n else 1
    if width > MAX_KEY_BYTES:
        raise InvalidKeyError(f"a primary key encodes to {width} bytes, over the key limit of {MAX_KEY_BYTES}")
    out = np.zeros((n, max(width, 1)), np.uint8)
    pos = np.zeros(n, np.int64)
    for p in parts:
        p.put(out, pos)
    if end:
        _put_end(out, pos)
    return out.view(f"S{out.shape[1]}").ravel()


def _flat(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


class _Fixed:
    """A fixed-width component: its big-endian bytes as an (n, width) matrix."""

    def __init__(self, tag: int, mat: np.ndarray):
        self.tag, self.mat = tag, mat
        self.lengths = np.full(len(mat), 1 + mat.shape[1], np.int64)

    def put(self, out: np.ndarray, pos: np.ndarray) -> None:
        _put_fixed(out, pos, self.tag, self.mat)


class _Var:
    """A string or binary component: its bytes, escaped and terminated as they are copied."""

    def __init__(self, tag: int, data: np.ndarray, offsets: np.ndarray):
        self.tag, self.data, self.offsets = tag, data, offsets
        self.lengths = np.diff(offsets) + _zeros(data, offsets) + 2  # tag, escapes, terminator

    def put(self, out: np.ndarray, pos: np.ndarray) -> None:
        _put_var(out, pos, self.tag, self.data, self.offsets)


def _component(arr: pa.Array, kind: Kind) -> _Fixed | _Var:
    tag = TAGS[kind]
    if kind in (Kind.STRING, Kind.BINARY):
        arr = arr.cast(pa.large_binary())
        _, offs, data = arr.buffers()
        offsets = np.frombuffer(offs, np.int64)[arr.offset : arr.offset + len(arr) + 1]
        raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
        return _Var(tag, raw, offsets)
    width, signed = _FIXED[kind]
    if kind == Kind.UUID:
        mat = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * 16 : (arr.offset + len(arr)) * 16]
        return _Fixed(tag, mat.reshape(len(arr), 16))
    if kind == Kind.BOOL:
        return _Fixed(tag, arr.to_numpy(zero_copy_only=False).astype(np.uint8).reshape(len(arr), 1))
    if kind in (Kind.TIMESTAMP, Kind.DATE):
        arr = arr.view(pa.int64() if kind == Kind.TIMESTAMP else pa.int32())
    u = arr.to_numpy(zero_copy_only=False).view(_INT_OF[width])
    if signed:
        u = u ^ _INT_OF[width](1 << (8 * width - 1))
    big = u.astype(u.dtype.newbyteorder(">"))
    return _Fixed(tag, big.view(np.uint8).reshape(len(arr), width))


@numba.njit(cache=True, nogil=True)
def _zeros(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    out = np.zeros(offsets.shape[0] - 1, np.int64)
    for i in range(out.shape[0]):
        n = 0
        for j in range(offsets[i], offsets[i + 1]):
            n += data[j] == 0
        out[i] = n
    return out


@numba.njit(cache=True, nogil=True)
def _put_fixed(out: np.ndarray, pos: np.ndarray, tag: int, mat: np.ndarray) -> None:
    for i in range(out.shape[0]):
        p = pos[i]
        out[i, p] = tag
        for j in range(mat.shape[1]):
            out[i, p + 1 + j] = mat[i, j]
        pos[i] = p + 1 + mat.shape[1]


@numba.njit(cache=True, nogil=True)
def _put_var(out: np.ndarray, pos: np.ndarray, tag: int, data: np.ndarray, offsets: np.ndarray) -> None:
    for i in range(out.shape[0]):
        p = pos[i]
        out[i, p] = tag
        p += 1
        for j in range(offsets[i], offsets[i + 1]):
            b = data[j]
            out[i, p] = b
            p += 1
            if b == 0:
                out[i, p] = 0xFF
                p += 1
        out[i, p] = 0  # the terminator (the matrix is zeroed: written for clarity)
        pos[i] = p + 1


@numba.njit(cache=True, nogil=True)
def _put_end(out: np.ndarray, pos: np.ndarray) -> None:
    for i in range(out.shape[0]):
        out[i, pos[i]] = 1
        pos[i] += 1


def prefix_heads(keys: np.ndarray, components: int) -> np.ndarray:
    """The index of each run of keys sharing their first ``components`` components in sorted
    encoded ``keys`` (``S``; every key has more components than that)."""
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int64)
    if components == 0:
        return np.zeros(1, np.int64)
    mat = np.ascontiguousarray(keys).view(np.uint8).reshape(n, keys.dtype.itemsize)
    return _heads(mat, components, _WIDTH_OF_TAG)


_WIDTH_OF_TAG = np.full(256, -1, np.int64)  # a component's value bytes after its tag (-1: escaped, terminated)
for _k, _t in TAGS.items():
    if _k in _FIXED:
        _WIDTH_OF_TAG[_t] = _FIXED[_k][0]


@numba.njit(cache=True, nogil=True)
def _heads(mat: np.ndarray, components: int, widths: np.ndarray) -> np.ndarray:
    n, w = mat.shape
    out = np.empty(n, np.int64)
    h, prev = 0, -1
    for i in range(n):
        p = 0
        for _ in range(components):
            width = widths[mat[i, p]]
            p += 1
            if width >= 0:
                p += width
                continue
            while p < w:  # a string's bytes: 0x00 0xFF is an escaped zero, a lone 0x00 ends it
                b = mat[i, p]
                p += 1
                if b == 0:
                    if p < w and mat[i, p] == 0xFF:
                        p += 1
                    else:
                        break
        new = i == 0 or p != prev
        if not new:
            for k in range(p):
                if mat[i, k] != mat[i - 1, k]:
                    new = True
                    break
        if new:
            out[h] = i
            h += 1
        prev = p
    return out[:h]


# -- one key (scalar: point reads, bounds, cursors, errors) ---------------------------------------

def encode_tuple(values: Sequence[object], kinds: Sequence[Kind], end: bool = True) -> bytes:
    """One key (``end``) or prefix from checked values: ints (timestamps in microseconds, dates in
    days), bool, str, bytes (binary, and a uuid's 16 bytes)."""
    out = bytearray()
    _put(out, values, kinds)
    if end:
        out.append(END)
    if len(out) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"a primary key encodes to {len(out)} bytes, over the key limit of {MAX_KEY_BYTES}")
    return bytes(out)


def encode_tuple_and_head(values: Sequence[object], kinds: Sequence[Kind], n: int) -> tuple[bytes, bytes]:
    """One whole key, and its first ``n`` components as a whole key (the partition hash's
    input), encoded once: the head's bytes are the key's first bytes."""
    out = bytearray()
    _put(out, values[:n], kinds[:n])
    head = bytes(out) + bytes((END,))
    _put(out, values[n:], kinds[n:])
    out.append(END)
    if len(out) > MAX_KEY_BYTES:
        raise InvalidKeyError(f"a primary key encodes to {len(out)} bytes, over the key limit of {MAX_KEY_BYTES}")
    return bytes(out), head


def _put(out: bytearray, values: Sequence[object], kinds: Sequence[Kind]) -> None:
    for v, k in zip(values, kinds):
        out.append(TAGS[k])
        if k in (Kind.STRING, Kind.BINARY):
            raw = v.encode() if isinstance(v, str) else _bytes(v)
            out += raw.replace(b"\x00", b"\x00\xff") + b"\x00"
        elif k == Kind.UUID:
            out += _bytes(v)
        elif isinstance(v, int):  # bool included
            width, signed = _FIXED[k]
            out += struct.pack(_STRUCT[width], (v + (1 << (8 * width - 1))) if signed else v)
        else:
            raise TypeError(f"a {k.value} key component is an int, not {type(v).__name__}")


def _bytes(v: object) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise TypeError(f"a key component of bytes, not {type(v).__name__}")


def decode_tuple(key: bytes, kinds: Sequence[Kind]) -> tuple[object, ...]:
    """The values of a key or prefix (as :func:`encode_tuple` takes them; a uuid as
    ``uuid.UUID``). Raises ValueError for bytes that are not an encoding of ``kinds``."""
    out: list[object] = []
    p = 0
    for k in kinds:
        if p >= len(key) or key[p] != TAGS[k]:
            raise ValueError(f"component {len(out)} of {key.hex()} is not a {k.value} (tag at byte {p})")
        p += 1
        if k in (Kind.STRING, Kind.BINARY):
            raw = bytearray()
            while True:
                if p >= len(key):
                    raise ValueError(f"{key.hex()}: an unterminated {k.value}")
                b = key[p]
                if b == 0 and p + 1 < len(key) and key[p + 1] == ESCAPE:
                    raw.append(0)
                    p += 2
                elif b == 0:
                    p += 1
                    break
                else:
                    raw.append(b)
                    p += 1
            out.append(raw.decode() if k == Kind.STRING else bytes(raw))
            continue
        width, signed = _FIXED[k]
        chunk = key[p : p + width]
        if len(chunk) != width:
            raise ValueError(f"{key.hex()}: component {len(out)} is cut short")
        p += width
        if k == Kind.UUID:
            out.append(uuidlib.UUID(bytes=chunk))
        elif k == Kind.BOOL:
            out.append(bool(chunk[0]))
        else:
            (u,) = struct.unpack(_STRUCT[width], chunk)
            out.append(u - (1 << (8 * width - 1)) if signed else u)
    if p < len(key) and not (key[p] == END and p + 1 == len(key)):
        raise ValueError(f"{key.hex()}: bytes after the last component")
    return tuple(out)


def prefix_end(prefix: bytes) -> bytes:
    """An upper bound, exclusive, of the keys whose leading components are ``prefix``: after
    a whole component comes a tag or ``END``, all below 0xFF. (A string value that only
    starts like the prefix's last one continues with the escape 0x00 0xFF, so it sorts at or
    after the bound: left out, as it should be.)"""
    return prefix + b"\xff"
