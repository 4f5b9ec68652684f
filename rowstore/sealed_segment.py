"""Sealed segments: rows, a B+ tree of localid -> offset, and a fixed footer.

Format: docs/format/segment.md §3. :func:`sealed_bytes` streams the object's
logical bytes from an active segment (rows only: write-ahead framing,
progress/opaque records and flush padding are dropped); TerrascaleFS
offloads that stream. :class:`SealedSegment` pages in the footer, the
pages on the path to a row, and the row — nothing else.
"""
from __future__ import annotations

import asyncio
import struct
from bisect import bisect_right
from dataclasses import dataclass
from typing import AsyncIterator, Callable

import numba
import numpy as np
from crc32c import crc32c

from rowstore.errors import RowCorruptionError
from rowstore.memtable import encode_keys
from rowstore.rowcodec import Decoded, decode_row_list, decode_rows
from rowstore.schema import SchemaVersion
from terrafs.sealed import SealedFile

SEG_MAGIC = b"TRSEGSL1"  # part of the format
SEG_VERSION = 1
PAGE = 4096
LEAF_CAP = (PAGE - 8) // 4  # 1022 offsets
NODE_CAP = (PAGE - 4) // 8  # 511 children
KEY_PREFIX = 24
_SCAN_DECODE = 4 << 20  # bytes of rows per decode call in a scan
MAX_VERSIONS = 8
FOOTER = struct.Struct("<8sHHIQQQQIQQI8IH24sH24sI28sI")
FOOTER_LEN = FOOTER.size  # 192
assert FOOTER_LEN == 192


@dataclass(frozen=True)
class Footer:
    segid: int
    rows: int
    rows_len: int
    root_off: int
    height: int
    min_ts: int
    max_ts: int
    versions: tuple[int, ...]
    min_key: bytes
    max_key: bytes
    min_key_len: int
    max_key_len: int
    index_crc: int

    def pack(self) -> bytes:
        vers = list(self.versions) + [0] * (MAX_VERSIONS - len(self.versions))
        body = FOOTER.pack(SEG_MAGIC, SEG_VERSION, FOOTER_LEN, self.segid, self.rows, 0, self.rows_len,
                           self.root_off, self.height, self.min_ts, self.max_ts, len(self.versions), *vers,
                           self.min_key_len, self.min_key[:KEY_PREFIX].ljust(KEY_PREFIX, b"\0"),
                           self.max_key_len, self.max_key[:KEY_PREFIX].ljust(KEY_PREFIX, b"\0"),
                           self.index_crc, bytes(28), 0)
        return body[:-4] + struct.pack("<I", crc32c(body[:-4]))

    @classmethod
    def unpack(cls, raw: bytes, where: str, at: int) -> "Footer":
        if len(raw) != FOOTER_LEN:
            raise RowCorruptionError(where, at, "object too short for a segment footer")
        f = FOOTER.unpack(raw)
        if f[0] != SEG_MAGIC:
            raise RowCorruptionError(where, at, f"bad segment magic {f[0]!r}")
        if crc32c(raw[:-4]) != f[-1]:
            raise RowCorruptionError(where, at, "segment footer checksum mismatch")
        if f[1] != SEG_VERSION or f[2] != FOOTER_LEN:
            raise RowCorruptionError(where, at, f"unsupported segment version {f[1]}")
        nver = f[11]
        if nver > MAX_VERSIONS:
            raise RowCorruptionError(where, at, f"footer names {nver} schema versions")
        return cls(f[3], f[4], f[6], f[7], f[8], f[9], f[10], tuple(f[12 : 12 + nver]),
                   f[21][: min(f[20], KEY_PREFIX)], f[23][: min(f[22], KEY_PREFIX)], f[20], f[22], f[24])


def key_bytes(keys: np.ndarray) -> bytes:
    """One encoded key (``memtable.encode_keys``) as bytes whose order is the key order."""
    if keys.dtype == np.uint64:
        return int(keys).to_bytes(8, "big")
    return bytes(keys)


# -- writing ----------------------------------------------------------------------------


async def sealed_bytes(segid: int, batches, schemas: Callable[[int], SchemaVersion],
                       key_schema: SchemaVersion, stats: dict | None = None) -> AsyncIterator[bytes]:
    """Stream a sealed segment: rows of the committed ``batches`` in localid order, then the tree."""
    offsets, pos, min_ts, max_ts = [], 0, None, None
    versions: set[int] = set()
    kmin = kmax = None
    async for b in batches:
        if len(b.starts) == 0:
            continue
        offsets.append(pos + b.starts)
        dec = decode_rows(b.rows, b.starts, schemas, key_schema)
        enc = encode_keys(dec.batch.column(0), str(key_schema.key.type))  # vectorized, order-preserving
        srt = np.sort(enc)  # numpy has no min/max for bytes; a sort is vectorized either way
        lo, hi = key_bytes(srt[0]), key_bytes(srt[-1])
        kmin = lo if kmin is None else min(kmin, lo)
        kmax = hi if kmax is None else max(kmax, hi)
        versions.update(int(v) for v in np.unique(dec.schema_ver))
        min_ts = b.commit_ts if min_ts is None else min(min_ts, b.commit_ts)
        max_ts = b.commit_ts if max_ts is None else max(max_ts, b.commit_ts)
        pos += b.rows.shape[0]
        yield b.rows.tobytes()
    offs = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
    if pos >= 2**32:
        raise RowCorruptionError(f"segment {segid}", None, "rows exceed 4 GiB; seal earlier")
    if len(versions) > MAX_VERSIONS:
        raise RowCorruptionError(f"segment {segid}", None, "more than 8 schema versions in one segment")
    pages, root, height = _tree(offs, pos)
    yield pages
    yield Footer(segid, len(offs), pos, root, height, min_ts or 0, max_ts or 0, tuple(sorted(versions)),
                 kmin or b"", kmax or b"", len(kmin or b""), len(kmax or b""), crc32c(pages)).pack()
    if stats is not None:
        stats.update(rows=len(offs), rows_len=pos, min_ts=min_ts, max_ts=max_ts)


def _tree(offs: np.ndarray, base: int) -> tuple[bytes, int, int]:
    """Leaf pages, then internal levels up to one root; returns (bytes, root offset, height)."""
    out = bytearray()
    level = []  # (first localid, page offset)
    for first in range(0, max(len(offs), 1), LEAF_CAP):
        chunk = offs[first : first + LEAF_CAP].astype("<u4")
        level.append((first, base + len(out)))
        out += struct.pack("<II", first, len(chunk)) + chunk.tobytes()
    height = 1
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), NODE_CAP):
            kids = np.array(level[i : i + NODE_CAP], "<u4")
            nxt.append((level[i][0], base + len(out)))
            out += struct.pack("<I", len(kids)) + kids.tobytes()
        level, height = nxt, height + 1
    return bytes(out), level[0][1], height


# -- reading -----------------------------------------------------------------------------


@numba.njit(cache=True, nogil=True)
def walk_rows(buf, end):
    """Starts of the complete rows in ``buf[:end]`` and where the first incomplete one begins."""
    out = np.empty(end // 17 + 1, np.int64)
    n, pos = 0, 0
    while pos + 4 <= end:
        ln = buf[pos] | (buf[pos + 1] << 8) | (buf[pos + 2] << 16) | (np.int64(buf[pos + 3]) << 24)
        if ln < 17:
            return out[:0], -pos - 1  # a corrupt length: report where
        if pos + ln > end:
            break
        out[n] = pos
        n += 1
        pos += ln
    return out[:n], pos


class SealedSegment:
    def __init__(self, sf: SealedFile, footer: Footer):
        self.sf, self.footer, self.where = sf, footer, sf.where
        self._pages: dict[int, list[int]] = {}
        self._firsts: dict[int, list[int]] = {}  # internal page -> first localids of its children

    @property
    def segid(self) -> int:
        return self.footer.segid

    @classmethod
    async def open(cls, sf: SealedFile) -> "SealedSegment":
        at = sf.size - FOOTER_LEN
        if at < 0:
            raise RowCorruptionError(sf.where, 0, "file too short for a segment footer")
        return cls(sf, Footer.unpack(await sf.read(at, FOOTER_LEN), sf.where, at))

    async def _page(self, off: int, leaf: bool) -> list[int]:
        """A parsed page as a Python list (list indexing and bisect beat numpy for one lookup):
        leaf -> [first, count, offset...]; internal node -> [count, first, child, first, child...]."""
        p = self._pages.get(off)
        if p is None:
            raw = await self.sf.read(off, PAGE)
            n = struct.unpack_from("<I", raw, 4 if leaf else 0)[0]
            width = 8 + 4 * n if leaf else 4 + 8 * n
            if n > (LEAF_CAP if leaf else NODE_CAP) or len(raw) < width:
                raise RowCorruptionError(self.where, off, "index page count out of range")
            p = np.frombuffer(raw[:width], "<u4").tolist()
            self._pages[off] = p
            if not leaf:
                self._firsts[off] = p[1::2]
        return p

    async def locate(self, localid: int) -> tuple[int, int]:
        """(offset, length) of a row, walking root -> leaf."""
        f = self.footer
        if not 0 <= localid < f.rows:
            raise RowCorruptionError(self.where, None, f"no row {localid} in segment {f.segid} ({f.rows} rows)")
        off = f.root_off
        for _ in range(f.height - 1):
            node = await self._page(off, leaf=False)
            off = node[2 * bisect_right(self._firsts[off], localid)]
        leaf = await self._page(off, leaf=True)
        i = localid - leaf[0]
        if not 0 <= i < leaf[1]:
            raise RowCorruptionError(self.where, off, f"leaf does not hold localid {localid}")
        start = leaf[2 + i]
        if i + 1 < leaf[1]:
            end = leaf[3 + i]
        else:
            end = start + struct.unpack("<I", await self.sf.read(start, 4))[0]
        if not start < end <= f.rows_len:
            raise RowCorruptionError(self.where, off, f"row {localid} has a bad offset")
        return start, end - start

    async def get_raw(self, localid: int) -> bytes:
        start, ln = await self.locate(localid)
        return await self.sf.read(start, ln)

    async def get(self, localids, schemas, target: SchemaVersion) -> Decoded:
        raws = [await self.get_raw(int(i)) for i in np.atleast_1d(localids)]
        return decode_row_list(raws, schemas, target, self.where)

    async def scan(self, schemas, target: SchemaVersion) -> AsyncIterator[Decoded]:
        """Every row in localid order, as decoded batches, reading the row section sequentially.

        Blocks are gathered into ~4 MiB runs before decoding: a decode call has
        a fixed cost that one 32 KiB block would not amortize.
        """
        pieces, have, carry, base = [], 0, np.zeros(0, np.uint8), 0
        async for off, data in self.sf.scan(0):
            piece = np.frombuffer(data, np.uint8)[: max(self.footer.rows_len - off, 0)]
            if piece.shape[0]:
                pieces.append(piece)
                have += piece.shape[0]
            last = off + len(data) >= self.footer.rows_len
            if have >= _SCAN_DECODE or (last and pieces):
                buf = np.concatenate([carry, *pieces])
                pieces, have = [], 0
                starts, consumed = walk_rows(buf, buf.shape[0])
                if consumed < 0:
                    raise RowCorruptionError(self.where, base - consumed - 1, "row length below the header size")
                if len(starts):
                    yield await asyncio.to_thread(decode_rows, buf, starts, schemas, target, self.where)
                carry, base = buf[consumed:], base + consumed
            if last:
                break
        if carry.shape[0]:
            raise RowCorruptionError(self.where, base, "a row runs past the row section")
