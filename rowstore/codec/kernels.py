"""numba kernels for the byte loops of the row codec that numpy cannot vectorize.

Encoding scatters packed fixed parts and variable-length runs into the row
buffer. Decoding is one pass per schema version over the rows
(:func:`gather_columns`: checks every row header against the layout,
writes each fixed-width field straight into its own column buffer, copies
the null bytes, commit timestamps and flags, and computes the offsets of
every wanted variable-width column), then one copy per variable-width
column (:func:`gather_var`). Compiled once and cached on disk
(``cache=True``); ``nogil`` so scans decode in worker threads in parallel.
"""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

_U8 = npt.NDArray[np.uint8]
_I64 = npt.NDArray[np.int64]

# gather_columns status codes
OK, OTHER_VERSION, PAST_END, BAD_LENGTH, NOT_CHAINED = 0, 1, 2, 3, 4


# Byte copies below loop over two slices instead of assigning a slice: numba turns the
# loop into vector moves, while slice assignment runs a generic strided copy (5x slower
# on 100-byte runs).


@numba.njit(cache=True, nogil=True)
def scatter_rows(out: _U8, row_start: _I64, fixed: _U8, fixed_size: int) -> None:
    """Copy row i's fixed part (``fixed[i]``, ``fixed_size`` bytes) to ``out[row_start[i]:]``."""
    for i in range(row_start.shape[0]):
        s = row_start[i]
        src = fixed[i]
        dst = out[s : s + fixed_size]
        for q in range(fixed_size):
            dst[q] = src[q]


@numba.njit(cache=True, nogil=True)
def scatter_runs(out: _U8, dst_start: _I64, src: _U8, src_start: _I64, lens: _I64) -> None:
    """Copy ``lens[i]`` bytes from ``src[src_start[i]:]`` to ``out[dst_start[i]:]`` for every i."""
    for i in range(dst_start.shape[0]):
        d, s, n = dst_start[i], src_start[i], lens[i]
        a = src[s : s + n]
        b = out[d : d + n]
        for q in range(n):
            b[q] = a[q]


@numba.njit(cache=True, nogil=True)
def scatter_fields(out: _U8, starts: _I64, row_len: _I64, ver: int, ts: int, flags: _U8,
                   nb: int, nulls: _U8, src: _U8, src_off: _I64, fwidth: _I64,
                   fdst: _I64, fpos: _I64, vend_off: int, ends: _I64) -> None:
    """Write the fixed part of every row (docs/format/segment.md §1): header, null bytes,
    each field k (``fwidth[k]`` bytes of ``src`` at ``src_off[k] + i * fwidth[k]``) at
    ``fdst[k]`` within the row — zeros when column ``fpos[k]`` is null — and the var ends."""
    nf = fwidth.shape[0]
    nvar = ends.shape[1]
    for i in range(starts.shape[0]):
        s = starts[i]
        _put32(out, s, row_len[i])
        _put32(out, s + 4, ver)
        _put32(out, s + 8, ts & 0xFFFFFFFF)
        _put32(out, s + 12, ts >> 32)
        out[s + 16] = flags[i]
        for q in range(nb):
            out[s + 17 + q] = nulls[i, q]
        for k in range(nf):
            w = fwidth[k]
            dst = out[s + fdst[k] : s + fdst[k] + w]
            p = fpos[k]
            if (nulls[i, p >> 3] >> (p & 7)) & 1:
                for q in range(w):
                    dst[q] = 0
            else:
                a = src_off[k] + i * w
                val = src[a : a + w]
                for q in range(w):
                    dst[q] = val[q]
        for j in range(nvar):
            _put32(out, s + vend_off + 4 * j, ends[i, j])


@numba.njit(inline="always")
def _put32(b: _U8, p: int, v: int) -> None:
    b[p] = v & 0xFF
    b[p + 1] = (v >> 8) & 0xFF
    b[p + 2] = (v >> 16) & 0xFF
    b[p + 3] = (v >> 24) & 0xFF


@numba.njit(inline="always")
def _u16(b: _U8, p: int) -> np.uint16:
    return np.uint16(b[p]) | (np.uint16(b[p + 1]) << np.uint16(8))


@numba.njit(inline="always")
def _u32(b: _U8, p: int) -> np.int64:
    # byte loads with shifts: LLVM combines them into one unaligned load
    return (np.int64(b[p]) | (np.int64(b[p + 1]) << 8) | (np.int64(b[p + 2]) << 16)
            | (np.int64(b[p + 3]) << 24))


@numba.njit(inline="always")
def _u64(b: _U8, p: int) -> np.uint64:
    lo = np.uint64(_u32(b, p))
    hi = np.uint64(_u32(b, p + 4))
    return lo | (hi << np.uint64(32))


@numba.njit(cache=True, nogil=True)
def header_u32(buf: _U8, starts: _I64, at: int, out: npt.NDArray[np.uint32]) -> None:
    """``out[i]`` = the u32 at byte ``at`` of the row at ``starts[i]`` (headers in bounds)."""
    for i in range(starts.shape[0]):
        out[i] = _u32(buf, starts[i] + at)


@numba.njit(cache=True, nogil=True)
def gather_columns(buf: _U8, starts: _I64, ver: int, row_size: int, vend_off: int, nvar: int,
                   chain_end: int, fsrc: _I64, fwidth: _I64, fdst: _I64,
                   out8: _U8, out16: npt.NDArray[np.uint16], out32: npt.NDArray[np.uint32],
                   out64: npt.NDArray[np.uint64], nb: int, nulls: _U8, ts: npt.NDArray[np.uint64],
                   flags: _U8, vsel: _I64, voffs: _I64) -> tuple[int, int]:
    """One pass over rows of schema version ``ver`` (docs/format/segment.md §1).

    For each row: header in bounds, version equal to ``ver``, var ends
    non-decreasing, ``row_len`` equal to the fixed size plus the var bytes
    and inside ``buf``; with ``chain_end >= 0`` also that each row ends
    where the next starts and the last at ``chain_end``. Then field k
    (``fwidth[k]`` bytes at ``fsrc[k]`` within the row) goes to its column
    buffer at byte ``fdst[k]`` (64-byte aligned) of ``out8`` (``out16``…
    ``out64`` are views of the same memory); ``nb`` null bytes to
    ``nulls[i]``; commit ts and flags; and for each wanted var column
    ``vsel[k]`` the running offsets ``voffs[k]``.

    Returns ``(status, row)``: ``(OK, n)`` or the first offending row.
    """
    n = starts.shape[0]
    size = buf.shape[0]
    nf = fsrc.shape[0]
    nsel = vsel.shape[0]
    for k in range(nsel):
        voffs[k, 0] = 0
    for i in range(n):
        s = starts[i]
        if s < 0 or s + 17 > size:
            return PAST_END, i
        if _u32(buf, s + 4) != ver:  # before the size check: another version has another size
            return OTHER_VERSION, i
        if s + row_size > size:
            return PAST_END, i
        var_len: int | np.int64 = 0
        for j in range(nvar):
            e = _u32(buf, s + vend_off + 4 * j)
            if e < var_len:
                return BAD_LENGTH, i
            var_len = e
        ln = _u32(buf, s)
        if ln != row_size + var_len or s + ln > size:
            return BAD_LENGTH, i
        if chain_end >= 0:
            nxt = starts[i + 1] if i + 1 < n else chain_end
            if s + ln != nxt:
                return NOT_CHAINED, i
        ts[i] = _u64(buf, s + 8)
        flags[i] = buf[s + 16]
        for q in range(nb):
            nulls[i, q] = buf[s + 17 + q]
        for k in range(nf):
            w = fwidth[k]
            src = s + fsrc[k]
            if w == 8:
                out64[fdst[k] // 8 + i] = _u64(buf, src)
            elif w == 4:
                out32[fdst[k] // 4 + i] = np.uint32(_u32(buf, src))
            elif w == 2:
                out16[fdst[k] // 2 + i] = _u16(buf, src)
            elif w == 1:
                out8[fdst[k] + i] = buf[src]
            else:  # a multiple of 8 (uuid)
                words = w // 8
                at = fdst[k] // 8 + i * words
                for q in range(words):
                    out64[at + q] = _u64(buf, src + 8 * q)
        for k in range(nsel):
            j = vsel[k]
            begin = _u32(buf, s + vend_off + 4 * (j - 1)) if j else 0
            voffs[k, i + 1] = voffs[k, i] + _u32(buf, s + vend_off + 4 * j) - begin
    return OK, n


@numba.njit(cache=True, nogil=True)
def gather_var(buf: _U8, starts: _I64, row_size: int, vend_off: int, j: int, offs: _I64,
               out: _U8) -> None:
    """Concatenate var column ``j`` of every row into ``out`` at ``offs`` (from gather_columns)."""
    for i in range(starts.shape[0]):
        s = starts[i]
        begin = _u32(buf, s + vend_off + 4 * (j - 1)) if j else 0
        d = offs[i]
        m = offs[i + 1] - d
        src = buf[s + row_size + begin : s + row_size + begin + m]
        dst = out[d : d + m]
        for q in range(m):
            dst[q] = src[q]


def warm_up() -> None:
    """Compile (or load from cache) every kernel with the dtypes the codec uses."""
    b = np.zeros(64, np.uint8)
    i64 = np.zeros(1, np.int64)
    scatter_rows(b, i64, np.zeros((1, 1), np.uint8), 1)
    scatter_runs(b, i64, b, i64, i64)
    u8 = np.zeros(1, np.uint8)
    scatter_fields(b, i64, i64, 0, 0, u8, 1, np.zeros((1, 1), np.uint8), b, i64, i64, i64, i64, 17,
                   np.zeros((1, 0), np.int64))
    header_u32(b, i64, 4, np.zeros(1, np.uint32))
    gather_columns(b, i64, 0, 17, 17, 0, -1, i64, i64, i64, b, b.view(np.uint16), b.view(np.uint32),
                   b.view(np.uint64), 0, np.zeros((1, 0), np.uint8), np.zeros(1, np.uint64),
                   np.zeros(1, np.uint8), i64[:0], np.zeros((0, 2), np.int64))
    gather_var(b, i64, 17, 17, 0, np.zeros(2, np.int64), b)
