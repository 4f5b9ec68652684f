"""Parsing the primary-key index's run pages (docs/format/index-run.md §2): one page at a
time (point lookups, the parsed-page LRU), or every page of a stretch at once by a numba
kernel (full scans, whole runs), which copies each page's blocks without a numpy call per
page. A malformed page is a ``RowCorruptionError`` naming it either way."""
from __future__ import annotations

import struct
from typing import Any

import numba
import numpy as np
import numpy.typing as npt

from rowstore.errors import RowCorruptionError
from rowstore.index.key_memtable import Run


def parse_pages(raw: bytes | memoryview, offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                counts: npt.NDArray[np.int64], kind: str, where: str, base: int) -> Run:
    """Pages at ``offs``..``ends`` of ``raw`` (each holding ``counts`` entries; ``base``: the
    file offset of ``raw``) as one run, in page order."""
    buf = np.frombuffer(raw, np.uint8)
    n = int(counts.sum())
    ts, rids = np.empty(n * 8, np.uint8), np.empty(n * 8, np.uint8)  # little-endian u64 each
    if kind in ("int64", "uuid"):
        kw = 8 if kind == "int64" else 16
        keys = np.empty(n * kw, np.uint8)
        bad = _gather_fixed(buf, offs, ends, counts, kw, keys, ts, rids)
        width = kw
    else:
        width = int(_var_width(buf, offs, ends, counts))
        bad = -width - 1 if width < 0 else -1
        if bad < 0:
            mat = np.zeros((n, width), np.uint8)
            bad = _gather_var(buf, offs, ends, counts, mat, ts, rids)
            keys = mat.ravel()
    if bad >= 0:  # the page's own parse names what is wrong with it
        a, b = int(offs[bad]), int(ends[bad])
        _parse_page(bytes(raw[a:b]), kind, int(counts[bad]), where, base + a)
        raise RowCorruptionError(where, base + a, "malformed index page")
    if kind == "int64":
        k: npt.NDArray[Any] = keys.view("<u8").astype(np.uint64, copy=False)
    else:
        k = keys.view(f"S{width}") if n else np.zeros(0, "S1")
    return Run(k, ts.view("<u8").astype(np.uint64, copy=False), rids.view("<u8").astype(np.uint64, copy=False))


@numba.njit(cache=True, nogil=True)
def _u32(buf: npt.NDArray[np.uint8], p: int) -> int:
    return int(buf[p]) | (int(buf[p + 1]) << 8) | (int(buf[p + 2]) << 16) | (int(buf[p + 3]) << 24)


@numba.njit(cache=True, nogil=True)
def _gather_fixed(buf: npt.NDArray[np.uint8], offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                  counts: npt.NDArray[np.int64], kw: int, keys: npt.NDArray[np.uint8],
                  ts: npt.NDArray[np.uint8], rids: npt.NDArray[np.uint8]) -> int:
    """Fixed-width keys' pages into ``keys``, ``ts`` and ``rids``: -1, or the first malformed page."""
    at = 0
    for i in range(offs.shape[0]):
        p, c = offs[i], counts[i]
        if p + 4 > ends[i] or _u32(buf, p) != c or p + 4 + (kw + 16) * c > ends[i]:
            return i
        q = p + 4
        keys[kw * at : kw * (at + c)] = buf[q : q + kw * c]
        q += kw * c
        ts[8 * at : 8 * (at + c)] = buf[q : q + 8 * c]
        rids[8 * at : 8 * (at + c)] = buf[q + 8 * c : q + 16 * c]
        at += c
    return -1


@numba.njit(cache=True, nogil=True)
def _var_width(buf: npt.NDArray[np.uint8], offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
               counts: npt.NDArray[np.int64]) -> int:
    """The longest key of the pages (at least 1), or -(i + 1) for the first malformed page i."""
    width = 1
    for i in range(offs.shape[0]):
        p, c = offs[i], counts[i]
        if p + 4 + 4 * c > ends[i] or _u32(buf, p) != c:
            return -(i + 1)
        start = 0
        for j in range(c):
            e = _u32(buf, p + 4 + 4 * j)
            if e < start:
                return -(i + 1)
            width = max(width, e - start)
            start = e
        if p + 4 + 4 * c + start + 16 * c > ends[i]:
            return -(i + 1)
    return width


@numba.njit(cache=True, nogil=True)
def _gather_var(buf: npt.NDArray[np.uint8], offs: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
                counts: npt.NDArray[np.int64], keys: npt.NDArray[np.uint8], ts: npt.NDArray[np.uint8],
                rids: npt.NDArray[np.uint8]) -> int:
    """Variable-length keys' pages (checked by ``_var_width``) into ``keys`` (zero-padded rows),
    ``ts`` and ``rids``."""
    at = 0
    for i in range(offs.shape[0]):
        p, c = offs[i], counts[i]
        kstart, start = p + 4 + 4 * c, 0
        for j in range(c):
            e = _u32(buf, p + 4 + 4 * j)
            keys[at + j, : e - start] = buf[kstart + start : kstart + e]
            start = e
        q = kstart + start
        ts[8 * at : 8 * (at + c)] = buf[q : q + 8 * c]
        rids[8 * at : 8 * (at + c)] = buf[q + 8 * c : q + 16 * c]
        at += c
    return -1


def _fixed_width(raw: bytes, pos: int, ends: npt.NDArray[np.int64], where: str, at: int) -> npt.NDArray[Any]:
    """Variable-length keys (their end offsets after ``pos``) as one ``S{longest}`` array,
    copied by one kernel (a page's entries are not sliced one by one)."""
    if not len(ends):
        return np.zeros(0, "S1")
    w = int(ends[0])
    if w and int(ends[-1]) == w * len(ends) and pos + w * len(ends) <= len(raw) and \
            bool((np.diff(ends) == w).all()):  # keys of one length (a sensor name, a timestamp): no copy loop
        return np.frombuffer(raw, f"S{w}", len(ends), pos).copy()
    buf = np.frombuffer(raw, np.uint8)
    out = _scatter(buf, pos, ends)
    if out is None:
        raise RowCorruptionError(where, at, "malformed index page: key offsets out of order or past the page")
    return out.view(f"S{out.shape[1]}").ravel()


@numba.njit(cache=True, nogil=True)
def _scatter(buf: npt.NDArray[np.uint8], pos: int, ends: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8] | None:
    width, start = 1, 0
    for e in ends:
        if e < start or pos + e > buf.shape[0]:
            return None
        width = max(width, e - start)
        start = e
    out = np.zeros((ends.shape[0], width), np.uint8)
    start = 0
    for i in range(ends.shape[0]):
        for j in range(ends[i] - start):
            out[i, j] = buf[pos + start + j]
        start = ends[i]
    return out


def _parse_page(raw: bytes, kind: str, count: int, where: str, at: int) -> Run:
    try:
        (n,) = struct.unpack_from("<I", raw, 0)
        if n != count:
            raise RowCorruptionError(where, at, f"page holds {n} entries; the fence says {count}")
        pos = 4
        if kind == "int64":
            keys = np.frombuffer(raw, "<u8", n, pos).astype(np.uint64)
            pos += 8 * n
        elif kind == "uuid":
            keys = np.frombuffer(raw, "S16", n, pos).copy()
            pos += 16 * n
        else:
            ends = np.frombuffer(raw, "<u4", n, pos).astype(np.int64)
            pos += 4 * n
            keys = _fixed_width(raw, pos, ends, where, at)
            pos += int(ends[-1]) if n else 0
        ts = np.frombuffer(raw, "<u8", n, pos).astype(np.uint64)
        rowids = np.frombuffer(raw, "<u8", n, pos + 8 * n).astype(np.uint64)
    except (struct.error, ValueError) as e:
        raise RowCorruptionError(where, at, f"malformed index page: {e}") from e
    return Run(keys, ts, rowids)
