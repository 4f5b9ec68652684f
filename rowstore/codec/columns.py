"""Column pages: one column's values for a run of rows <-> page bytes, vectorized.

Layout and encodings: docs/format/segment.md §7 (columnar sealed segments, version 2). A
page holds ``rows`` values of one column: an optional validity bitmap, then one *stream*
per physical part of the type (a point is two float64 streams, a range three), each with
its own encoding, chosen per page by size: integers plain, frame of reference or delta;
floats byte-stream-split; booleans as bits; strings, binary and JSON plain or with a
dictionary. Compression, checksums and encryption are TerrascaleFS's, per block: a page is
one block (``terrafs.sealed.Aligned``).

Every constant here is part of the format.
"""
from __future__ import annotations

import struct
from typing import Any
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import ColumnCorruptionError, RowstoreError
from rowstore.types import LOWER_INC, LOWER_UNB, UPPER_INC, UPPER_UNB, ColumnType, Kind

# stream encodings (part of the format)
PLAIN, PLAIN_VAR, DICT, FOR, DELTA, BSS, BITS = 0, 1, 2, 3, 4, 5, 6
HAS_NULLS = 0x01  # page flag: a validity bitmap follows the header
PAGE_HEAD = struct.Struct("<IBBH")  # rows, flags, streams, reserved
STREAM_HEAD = struct.Struct("<BBHI")  # encoding, width, reserved, body length

# the physical stream types: (numpy dtype, integer?) per part of a column type
_INT_KINDS = {Kind.INT8: "<i1", Kind.INT16: "<i2", Kind.INT32: "<i4", Kind.INT64: "<i8",
              Kind.UINT8: "<u1", Kind.UINT16: "<u2", Kind.UINT32: "<u4", Kind.UINT64: "<u8",
              Kind.TIMESTAMP: "<i8", Kind.DATE: "<i4"}


def streams_of(t: ColumnType) -> list[str]:
    """The physical streams of a column type: a numpy dtype string each, ``"bits"``,
    ``"var"`` (variable-width bytes) or ``"b16"`` (16 fixed bytes)."""
    k = t.kind
    if k in _INT_KINDS:
        return [_INT_KINDS[k]]
    if k == Kind.FLOAT32:
        return ["<f4"]
    if k == Kind.FLOAT64:
        return ["<f8"]
    if k == Kind.BOOL:
        return ["bits"]
    if k == Kind.UUID:
        return ["b16"]
    if t.variable:
        return ["var"]
    if k == Kind.POINT:
        return ["<f8", "<f8"]
    if k == Kind.BOX:
        return ["<f8"] * 4
    elem = "<f8" if t.elem == Kind.FLOAT64 else "<i8"  # a range: lower, upper, flags
    return [elem, elem, "<u1"]


# -- encoding --------------------------------------------------------------------------------


def encode_page(arr: pa.Array, t: ColumnType) -> bytes:
    """One page of ``arr``'s values (every row of it)."""
    n = len(arr)
    valid = None
    if arr.null_count:
        valid = np.packbits(arr.is_valid().to_numpy(zero_copy_only=False), bitorder="little").tobytes()
    parts = [PAGE_HEAD.pack(n, HAS_NULLS if valid is not None else 0, len(streams_of(t)), 0)]
    if valid is not None:
        parts.append(valid)
    for kind, values in zip(streams_of(t), _stream_values(arr, t)):
        enc, width, body = _encode_stream(kind, values, n)
        parts.append(STREAM_HEAD.pack(enc, width, 0, sum(len(b) for b in body)))
        parts.extend(body)
    return b"".join(parts)


def _stream_values(arr: pa.Array, t: ColumnType) -> list[object]:
    """Each stream's values: numpy arrays (nulls filled), bits, or (offsets, data)."""
    k = t.kind
    if k == Kind.BOOL:
        return [_bools(arr)]
    if k == Kind.UUID:
        return [_fixed(arr, 16, np.dtype("u1")).reshape(-1, 16)]
    if t.variable:
        return [arr]
    if k == Kind.POINT:
        return [_filled(arr.field("x")), _filled(arr.field("y"))]
    if k == Kind.BOX:
        return [_filled(arr.field(f)) for f in ("xmin", "ymin", "xmax", "ymax")]
    if k == Kind.RANGE:
        lo, hi = arr.field("lower"), arr.field("upper")
        if t.elem == Kind.TIMESTAMP:
            lo, hi = lo.cast(pa.int64()), hi.cast(pa.int64())
        flags = np.where(_bools(arr.field("lower_inclusive")), LOWER_INC, 0)
        flags |= np.where(_bools(arr.field("upper_inclusive")), UPPER_INC, 0)
        flags |= np.where(lo.is_null().to_numpy(zero_copy_only=False), LOWER_UNB, 0)
        flags |= np.where(hi.is_null().to_numpy(zero_copy_only=False), UPPER_UNB, 0)
        if arr.null_count:
            flags[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
        return [_filled(lo), _filled(hi), flags.astype(np.uint8)]
    if k == Kind.TIMESTAMP:
        arr = arr.cast(pa.int64())
    return [_filled(arr)]


def _fixed(arr: pa.Array, width: int, dtype: np.dtype) -> np.ndarray:
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr) * width // dtype.itemsize, dtype)
    return np.frombuffer(buf, dtype, count=len(arr) * width // dtype.itemsize,
                         offset=arr.offset * width).copy()


def _filled(arr: pa.Array) -> np.ndarray:
    """Values with nulls as zero (a null's value is unspecified by the format)."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(0, arr.type))
    out: np.ndarray = np.ascontiguousarray(arr.to_numpy(zero_copy_only=False))
    return out


def _bools(arr: pa.Array) -> npt.NDArray[np.bool_]:
    if arr.null_count:
        arr = pc.fill_null(arr, False)
    out: npt.NDArray[np.bool_] = arr.to_numpy(zero_copy_only=False).astype(bool, copy=False)
    return out


def _width(top: int) -> int:
    """Bytes per packed value for offsets up to ``top`` (0: every offset is 0)."""
    return 0 if top == 0 else 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8


# Values sampled before trying a dictionary (the writer's choice): 1,000 sensors' names repeat
# in 4,096 rows but hardly in 256.
_DICT_SAMPLE = 4096
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _encode_stream(kind: str, values: Any, n: int) -> tuple[int, int, list[bytes]]:
    if kind == "bits":
        return BITS, 1, [np.packbits(np.asarray(values, bool), bitorder="little").tobytes()]
    if kind == "b16":
        return PLAIN, 16, [np.ascontiguousarray(values).tobytes()]
    if kind == "var":
        return _encode_var(values)
    v = np.asarray(values).astype(kind, copy=False)
    if v.dtype.kind == "f":
        w = v.dtype.itemsize
        return BSS, w, [np.ascontiguousarray(v.view(np.uint8).reshape(-1, w).T).tobytes()]
    return _encode_int(v)


def _encode_int(v: np.ndarray) -> tuple[int, int, list[bytes]]:
    """The smallest of plain, frame of reference (values - min) and delta (each difference
    - the smallest difference), all in 64-bit modular arithmetic; ties keep the simpler."""
    w = v.dtype.itemsize
    best = (w * len(v), PLAIN, w, [v.tobytes()])
    if len(v) == 0:
        return best[1], best[2], best[3]
    signed = v.dtype.kind == "i"
    u = v.astype(np.int64).view(np.uint64) if signed else v.astype(np.uint64)
    lo = np.uint64(v.min().astype(np.int64).view(np.uint64)) if signed else np.uint64(v.min())
    off = u - lo
    wf = _width(int(off.max()))
    if 8 + wf * len(v) < best[0]:
        best = (8 + wf * len(v), FOR, wf, [struct.pack("<Q", int(lo)), _pack(off, wf)])
    if len(v) > 1:
        d = (u[1:] - u[:-1]).view(np.int64)
        dlo = d.min()
        doff = d.view(np.uint64) - np.uint64(dlo.view(np.uint64))
        wd = _width(int(doff.max()))
        if 16 + wd * (len(v) - 1) < best[0]:
            best = (16 + wd * (len(v) - 1), DELTA, wd,
                    [struct.pack("<Qq", int(u[0]), int(dlo)), _pack(doff, wd)])
    return best[1], best[2], best[3]


def _pack(off: np.ndarray, width: int) -> bytes:
    return b"" if width == 0 else off.astype(_UINT[width]).tobytes()


def _encode_var(arr: pa.Array) -> tuple[int, int, list[bytes]]:
    """Plain (u32 offsets, then the bytes) or a dictionary of the distinct values plus an
    index per row (1, 2 or 4 bytes), whichever is smaller (a dictionary is tried only when
    at least half of the page's first ``_DICT_SAMPLE`` values repeat one another)."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        raise ColumnCorruptionError("column page", None, "values over 2 GiB in one page")
    n = len(arr)
    offs, data = _var_parts(arr)
    plain = 4 * (n + 1) + len(data)
    if n and pc.count_distinct(arr.slice(0, _DICT_SAMPLE)).as_py() * 2 <= min(n, _DICT_SAMPLE):  # try a dictionary
        enc = pc.dictionary_encode(arr.cast(pa.binary()) if arr.null_count == 0 else
                                   pc.fill_null(arr.cast(pa.binary()), b""))
        dic = enc.dictionary
        idx = enc.indices.to_numpy(zero_copy_only=False)
        wi = _width(len(dic) - 1) or 1
        wi = 4 if wi == 8 else wi
        doffs, ddata = _var_parts(dic)
        size = 4 + 4 * (len(dic) + 1) + len(ddata) + wi * n
        if size < plain:
            return DICT, wi, [struct.pack("<I", len(dic)), doffs.tobytes(), ddata, idx.astype(_UINT[wi]).tobytes()]
    return PLAIN_VAR, 0, [offs.tobytes(), data]


def _var_parts(arr: pa.Array) -> tuple[np.ndarray, bytes]:
    """u32 offsets from 0 (a null is empty) and the bytes they index."""
    n = len(arr)
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar(b"" if pa.types.is_binary(arr.type) else "", arr.type))
    bufs = arr.buffers()
    if n == 0 or bufs[1] is None:
        return np.zeros(n + 1, "<u4"), b""
    offs = np.frombuffer(bufs[1], np.int32, count=n + 1, offset=arr.offset * 4)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return (offs - offs[0]).astype("<u4"), data[offs[0] : offs[-1]].tobytes()


# -- decoding --------------------------------------------------------------------------------


class PageError(RowstoreError):
    """A page that does not parse (internal: :func:`decode_page` turns it into a
    :class:`ColumnCorruptionError` naming the segment and column)."""

    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset, self.reason = offset, reason


def decode_page(page: bytes | memoryview | np.ndarray, t: ColumnType, where: str = "column page",
                base: int = 0) -> pa.Array:
    """The Arrow array of a page written by :func:`encode_page` for type ``t``. A page that does
    not hold what its header says is a :class:`ColumnCorruptionError` naming ``where`` (the
    object, segment and column) and ``base`` + the offset in the page."""
    try:
        return _decode_page(page, t)
    except PageError as e:
        raise ColumnCorruptionError(where, base + e.offset, e.reason) from None


def decode_page_rows(page: bytes | memoryview | np.ndarray, t: ColumnType, rows: np.ndarray,
                     where: str = "column page", base: int = 0) -> pa.Array:
    """``decode_page(page, t).take(rows)`` (``rows``: sorted positions in the page) without
    decoding the other values where the encoding allows it: a point read wants one value of
    a page of thousands (plain, frame of reference, byte-stream split, bits, strings)."""
    try:
        n, valid, streams = _page_parts(page, t)
        rows = np.asarray(rows, np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= n):
            raise PageError(0, f"no row {int(rows[-1])} in a page of {n}")
        if valid is not None:
            valid = _bits(np.unpackbits(valid, count=n, bitorder="little")[rows].astype(bool))
        return _array(t, len(rows), valid, [_stream_rows(*x, n, rows) for x in streams])
    except PageError as e:
        raise ColumnCorruptionError(where, base + e.offset, e.reason) from None


def _decode_page(page: bytes | memoryview | np.ndarray, t: ColumnType) -> pa.Array:
    n, valid, streams = _page_parts(page, t)
    return _array(t, n, None if valid is None else pa.py_buffer(valid.tobytes()),
                  [_decode_stream(kind, enc, width, body, n, at) for kind, enc, width, body, at in streams])


def _page_parts(page: bytes | memoryview | np.ndarray, t: ColumnType,
                ) -> tuple[int, np.ndarray | None, list[tuple[str, int, int, np.ndarray, int]]]:
    """(rows, the validity bitmap's bytes or None, each stream's (kind, encoding, width, body,
    offset in the page)), every length checked against the page."""
    buf = np.frombuffer(page, np.uint8) if not isinstance(page, np.ndarray) else page
    if buf.shape[0] < PAGE_HEAD.size:
        raise PageError(0, "page shorter than its header")
    n, flags, count, _ = PAGE_HEAD.unpack(buf[: PAGE_HEAD.size].tobytes())
    kinds = streams_of(t)
    if count != len(kinds) or flags & ~HAS_NULLS:
        raise PageError(0, f"page header names {count} streams (flags {flags}); type {t} has {len(kinds)}")
    at = PAGE_HEAD.size
    valid = None
    if flags & HAS_NULLS:
        nb = (n + 7) // 8
        if at + nb > buf.shape[0]:
            raise PageError(at, "validity bitmap past the end of the page")
        valid = buf[at : at + nb]
        at += nb
    streams = []
    for kind in kinds:
        if at + STREAM_HEAD.size > buf.shape[0]:
            raise PageError(at, "stream header past the end of the page")
        enc, width, _, ln = STREAM_HEAD.unpack(buf[at : at + STREAM_HEAD.size].tobytes())
        body = buf[at + STREAM_HEAD.size : at + STREAM_HEAD.size + ln]
        if body.shape[0] != ln:
            raise PageError(at, "stream past the end of the page")
        streams.append((kind, enc, width, body, at))
        at += STREAM_HEAD.size + ln
    if at != buf.shape[0]:
        raise PageError(at, f"{buf.shape[0] - at} bytes after the last stream")
    return n, valid, streams


def _stream_rows(kind: str, enc: int, width: int, body: np.ndarray, at: int, n: int, rows: np.ndarray) -> object:
    """The values of ``rows`` of one stream, as :func:`_decode_stream` gives all of them."""
    if kind == "var":
        return _decode_var(enc, width, body, n, at, rows)
    dt = None if kind in ("bits", "b16") else np.dtype(kind)
    if dt is not None and dt.kind == "f" and enc == BSS and width == dt.itemsize and body.shape[0] == n * width:
        return np.ascontiguousarray(body.reshape(width, n)[:, rows].T).view(dt).ravel()
    if dt is not None and dt.kind != "f" and enc == PLAIN and width == dt.itemsize and body.shape[0] == n * width:
        return body.view(dt)[rows]
    if dt is not None and dt.kind != "f" and enc == FOR and width in (1, 2, 4, 8) and body.shape[0] == 8 + width * n:
        return _narrow(body[8:].view(_UINT[width])[rows].astype(np.uint64) + body[:8].view("<u8")[0], dt)
    got = _decode_stream(kind, enc, width, body, n, at)  # the rest: whole, then the rows
    if kind == "bits":
        return np.packbits(np.unpackbits(np.asarray(got), count=n, bitorder="little")[rows], bitorder="little")
    if kind == "b16":
        return np.asarray(got).reshape(n, 16)[rows].ravel()
    return np.asarray(got)[rows]


def _var_rows(offs: np.ndarray, data: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, bytes) of ``rows`` of the values at ``offs`` in ``data``."""
    starts, lens = offs[rows], offs[rows + 1] - offs[rows]
    out = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out.astype(np.int32), data[np.repeat(starts - out[:-1], lens) + np.arange(int(out[-1]))]


def _decode_stream(kind: str, enc: int, width: int, body: np.ndarray, n: int, at: int) -> object:
    if kind == "bits":
        if enc != BITS or body.shape[0] != (n + 7) // 8:
            raise PageError(at, f"bool stream encoding {enc} of {body.shape[0]} bytes")
        return body
    if kind == "b16":
        if enc != PLAIN or width != 16 or body.shape[0] != 16 * n:
            raise PageError(at, f"uuid stream encoding {enc} of {body.shape[0]} bytes")
        return body
    if kind == "var":
        return _decode_var(enc, width, body, n, at)
    dt = np.dtype(kind)
    if dt.kind == "f":
        if enc != BSS or width != dt.itemsize or body.shape[0] != n * width:
            raise PageError(at, f"float stream encoding {enc} width {width} of {body.shape[0]} bytes")
        return np.ascontiguousarray(body.reshape(width, n).T).view(dt).ravel()
    return _decode_int(dt, enc, width, body, n, at)


def _decode_int(dt: np.dtype, enc: int, width: int, body: np.ndarray, n: int, at: int) -> np.ndarray:
    if enc == PLAIN:
        if width != dt.itemsize or body.shape[0] != n * width:
            raise PageError(at, f"plain stream of {body.shape[0]} bytes for {n} values")
        return body.view(dt)
    if enc == FOR:
        if width not in (0, 1, 2, 4, 8) or body.shape[0] != 8 + width * n:
            raise PageError(at, f"frame-of-reference stream width {width} of {body.shape[0]} bytes")
        base = body[:8].view("<u8")[0]
        off = body[8:].view(_UINT[width]).astype(np.uint64) if width else np.zeros(n, np.uint64)
        return _narrow(off + base, dt)
    if enc == DELTA:
        if n == 0 or width not in (0, 1, 2, 4, 8) or body.shape[0] != 16 + width * (n - 1):
            raise PageError(at, f"delta stream width {width} of {body.shape[0]} bytes")
        first, dlo = body[:8].view("<u8")[0], body[8:16].view("<u8")[0]
        d = body[16:].view(_UINT[width]).astype(np.uint64) if width else np.zeros(n - 1, np.uint64)
        out = np.empty(n, np.uint64)
        out[0] = first
        np.cumsum(d + dlo, out=out[1:])
        out[1:] += first
        return _narrow(out, dt)
    raise PageError(at, f"unknown integer encoding {enc}")


def _narrow(u: np.ndarray, dt: np.dtype) -> np.ndarray:
    """64-bit modular values back to the stream's type (they fit: the writer took them from it)."""
    return u.view(np.int64).astype(dt) if dt.kind == "i" else u.astype(dt)


def _decode_var(enc: int, width: int, body: np.ndarray, n: int, at: int,
                rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, bytes) of the values (``rows``: of those rows only)."""
    if enc == PLAIN_VAR:
        if body.shape[0] < 4 * (n + 1):
            raise PageError(at, "offsets past the end of the stream")
        offs = body[: 4 * (n + 1)].view("<u4")
        data = body[4 * (n + 1) :]
        _check_offsets(offs, data.shape[0], at)
        if rows is not None:
            return _var_rows(offs.astype(np.int64), data, rows)
        return offs.astype(np.int32), data
    if enc == DICT:
        if width not in (1, 2, 4) or body.shape[0] < 4:
            raise PageError(at, f"dictionary index width {width}")
        m = int(body[:4].view("<u4")[0])
        end = 4 + 4 * (m + 1)
        if end > body.shape[0]:
            raise PageError(at, "dictionary offsets past the end of the stream")
        doffs = body[4:end].view("<u4").astype(np.int64)
        ddata = body[end : body.shape[0] - width * n]
        if body.shape[0] - width * n < end:
            raise PageError(at, "dictionary indices past the end of the stream")
        _check_offsets(doffs, ddata.shape[0], at)
        idx = body[body.shape[0] - width * n :].view(_UINT[width]).astype(np.int64)
        if rows is not None:
            idx, n = idx[rows], len(rows)
        if n and int(idx.max()) >= m:
            raise PageError(at, "a dictionary index past the dictionary")
        lens = (doffs[1:] - doffs[:-1])[idx]
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        if offs[-1] >= 2**31:
            raise PageError(at, "values over 2 GiB in one page")
        starts = np.repeat(doffs[:-1][idx] - offs[:-1], lens) + np.arange(int(offs[-1]))
        return offs.astype(np.int32), ddata[starts]
    raise PageError(at, f"unknown string encoding {enc}")


def _check_offsets(offs: np.ndarray, size: int, at: int) -> None:
    if offs.shape[0] and (offs[0] != 0 or int(offs[-1]) != size or np.any(np.diff(offs.astype(np.int64)) < 0)):
        raise PageError(at, "value offsets are not increasing from 0 to the stream's end")


def _array(t: ColumnType, n: int, valid: pa.Buffer | None, s: list[Any]) -> pa.Array:
    k, at = t.kind, t.arrow()
    if k == Kind.BOOL:
        return pa.Array.from_buffers(at, n, [valid, pa.py_buffer(s[0])])
    if k == Kind.UUID or k in _INT_KINDS or k in (Kind.FLOAT32, Kind.FLOAT64):
        return pa.Array.from_buffers(at, n, [valid, pa.py_buffer(s[0])])
    if t.variable:
        offs, data = s[0]
        return pa.Array.from_buffers(at, n, [valid, pa.py_buffer(offs), pa.py_buffer(data)])
    if k in (Kind.POINT, Kind.BOX):
        kids = [pa.Array.from_buffers(pa.float64(), n, [None, pa.py_buffer(x)]) for x in s]
        return pa.StructArray.from_buffers(at, n, [valid], children=kids)
    lo, hi, f = s  # a range
    f = np.asarray(f)
    elem = at.field("lower").type
    kids = [pa.Array.from_buffers(elem, n, [_bits((f & LOWER_UNB) == 0), pa.py_buffer(lo)]),
            pa.Array.from_buffers(elem, n, [_bits((f & UPPER_UNB) == 0), pa.py_buffer(hi)]),
            pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits((f & LOWER_INC) != 0,
                                                                                bitorder="little"))]),
            pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits((f & UPPER_INC) != 0,
                                                                                bitorder="little"))])]
    return pa.StructArray.from_buffers(at, n, [valid], children=kids)


def _bits(mask: np.ndarray) -> pa.Buffer | None:
    return None if mask.all() else pa.py_buffer(np.packbits(mask, bitorder="little"))
