"""Sealed segments: rows, a B+ tree of localid -> offset, and a fixed footer.

Format: docs/format/segment.md §3. :func:`sealed_bytes` streams the object's
logical bytes from an active segment (rows only: write-ahead framing,
progress/opaque records and flush padding are dropped); TerrascaleFS
offloads that stream. :class:`SealedSegment` pages in the footer, the
pages on the path to a row, and the row — nothing else.
"""
from __future__ import annotations

import asyncio
import itertools
import struct
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterable, AsyncIterator, Callable, Protocol

import numba
import numpy as np
import numpy.typing as npt

from catalog.checksum import crc32c
from rowstore.errors import RowCorruptionError
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.codec.rows import Decoded, decode_row_list, decode_rows, decode_run
from rowstore.schema import SchemaVersion
from terrafs.sealed import SealedFile

SEG_MAGIC = b"TRSEGSL1"  # part of the format
SEG_VERSION = 1
PAGE = 4096
LEAF_CAP = (PAGE - 8) // 4  # 1022 offsets
NODE_CAP = (PAGE - 4) // 8  # 511 children
KEY_PREFIX = 24
_SCAN_RUN = 2 << 20  # bytes of whole rows fetched and decoded as one unit of a scan
_SCAN_AHEAD = 2  # runs in flight at once (one per core here)
MAX_VERSIONS = 8
_U32 = struct.Struct("<I")
FOOTER = struct.Struct("<8sHHIQQQQIQQI8IH24sH24sI24s4sI")
CLUSTER = struct.Struct("<BBHI16s")  # kind, 0, 0, column id, range (24 bytes at offset 160)
CLUSTER_NONE, CLUSTER_BOX, CLUSTER_INT, CLUSTER_FLOAT = 0, 1, 2, 3  # part of the format
ClusterRange = tuple[int | float, ...]  # (kind, column id, lo..., hi...): see ``relocate.cluster_range``
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
    cluster: ClusterRange | None = None  # see ``relocate.cluster_range``

    def pack(self) -> bytes:
        vers = list(self.versions) + [0] * (MAX_VERSIONS - len(self.versions))
        body = FOOTER.pack(SEG_MAGIC, SEG_VERSION, FOOTER_LEN, self.segid, self.rows, 0, self.rows_len,
                           self.root_off, self.height, self.min_ts, self.max_ts, len(self.versions), *vers,
                           self.min_key_len, self.min_key[:KEY_PREFIX].ljust(KEY_PREFIX, b"\0"),
                           self.max_key_len, self.max_key[:KEY_PREFIX].ljust(KEY_PREFIX, b"\0"),
                           self.index_crc, pack_cluster(self.cluster), bytes(4), 0)
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
                   f[21][: min(f[20], KEY_PREFIX)], f[23][: min(f[22], KEY_PREFIX)], f[20], f[22], f[24],
                   unpack_cluster(f[25], where, at))


def pack_cluster(c: ClusterRange | None) -> bytes:
    """The footer's cluster range (docs/format/segment.md §3): a bounding box as float32
    (rounded outward by the caller), or an int64 / float64 value range."""
    if c is None:
        return bytes(CLUSTER.size)
    kind, cid, vals = c[0], c[1], c[2:]
    if kind == CLUSTER_BOX:
        body = struct.pack("<4f", *vals)
    elif kind == CLUSTER_INT:
        body = struct.pack("<2q", *vals)
    else:
        body = struct.pack("<2d", *vals)
    return CLUSTER.pack(kind, 0, 0, cid, body)


def unpack_cluster(raw: bytes, where: str, at: int) -> ClusterRange | None:
    kind, _, _, cid, body = CLUSTER.unpack(raw)
    if kind == CLUSTER_NONE:
        return None
    if kind == CLUSTER_BOX:
        return (kind, cid, *struct.unpack("<4f", body))
    if kind == CLUSTER_INT:
        return (kind, cid, *struct.unpack("<2q", body))
    if kind == CLUSTER_FLOAT:
        return (kind, cid, *struct.unpack("<2d", body))
    raise RowCorruptionError(where, at + 160, f"unknown cluster range kind {kind}")


def key_columns_schema(schema: SchemaVersion) -> SchemaVersion:
    """``schema`` with only its key columns: what a segment's key range is decoded into."""
    pk = schema.pk
    return SchemaVersion(schema.version, pk.columns, pk.ids, schema.next_column_id, pk.partition_columns)


def key_bytes(keys: np.ndarray) -> bytes:
    """One encoded key (``memtable.encode_keys``) as bytes whose order is the key order."""
    if keys.dtype == np.uint64:
        return int(keys).to_bytes(8, "big")
    return bytes(keys)


# -- writing ----------------------------------------------------------------------------


class RowBatch(Protocol):
    """Rows :func:`sealed_bytes` writes: a committed batch (``wal.CommittedBatch``), or rows of
    many commits (``relocate._Chunk``, which also has ``min_ts`` and ``max_ts``)."""

    @property
    def rows(self) -> np.ndarray: ...  # uint8, the rows back to back

    @property
    def starts(self) -> np.ndarray: ...  # int64 offset of each row in ``rows``

    @property
    def commit_ts(self) -> int: ...


async def sealed_bytes(segid: int, batches: AsyncIterable[RowBatch], schemas: Callable[[int], SchemaVersion],
                       key_schema: SchemaVersion, stats: dict[str, Any] | None = None,
                       cluster: ClusterRange | None = None) -> AsyncIterator[bytes]:
    """Stream a sealed segment: rows of the committed ``batches`` in localid order, then the tree.

    A batch has ``rows`` (bytes), ``starts`` and ``commit_ts`` — or, for rows of many commits
    (a garbage collector's copy), ``min_ts`` and ``max_ts``; ``cluster`` goes to the footer."""
    offsets, pos, min_ts, max_ts = [], 0, None, None
    deletions, deletions_max_ts = 0, 0
    versions: set[int] = set()
    kmin = kmax = None
    keys_only = key_columns_schema(key_schema)
    async for b in batches:
        if len(b.starts) == 0:
            continue
        offsets.append(pos + b.starts)
        dec = decode_rows(b.rows, b.starts, schemas, keys_only)
        pk = keys_only.pk
        enc = encode_columns(pk, key_arrays(pk, dec.batch))  # vectorized, order-preserving
        srt = np.sort(enc)  # numpy has no min/max for bytes; a sort is vectorized either way
        lo, hi = key_bytes(srt[0]), key_bytes(srt[-1])
        kmin = lo if kmin is None else min(kmin, lo)
        kmax = hi if kmax is None else max(kmax, hi)
        versions.update(int(v) for v in np.unique(dec.schema_ver))
        if dec.deleted.any():  # deletion rows: the garbage collector counts them live above the horizon
            deletions += int(dec.deleted.sum())
            deletions_max_ts = max(deletions_max_ts, int(dec.commit_ts[dec.deleted].max()))
        lo_ts, hi_ts = getattr(b, "min_ts", b.commit_ts), getattr(b, "max_ts", b.commit_ts)
        min_ts = lo_ts if min_ts is None else min(min_ts, lo_ts)
        max_ts = hi_ts if max_ts is None else max(max_ts, hi_ts)
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
                 kmin or b"", kmax or b"", len(kmin or b""), len(kmax or b""), crc32c(pages), cluster).pack()
    if stats is not None:
        stats.update(rows=len(offs), rows_len=pos, min_ts=min_ts, max_ts=max_ts, deletions=deletions,
                     deletions_max_ts=deletions_max_ts)


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
def walk_rows(buf: npt.NDArray[np.uint8], end: int) -> tuple[npt.NDArray[np.int64], int]:
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

    async def page(self, off: int, leaf: bool) -> list[int]:
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

    def located(self, localid: int) -> tuple[int, int] | None:
        """``locate`` from the pages parsed already and the blocks cached; None when something
        must be read (a point read's fast path: no coroutine)."""
        self._check(localid)
        off = self.footer.root_off
        for _ in range(self.footer.height - 1):
            firsts = self._firsts.get(off)
            if firsts is None:
                return None
            off = self._pages[off][2 * bisect_right(firsts, localid)]
        leaf = self._pages.get(off)
        if leaf is None:
            return None
        i = self._slot(off, leaf, localid)
        start = leaf[2 + i]
        if i + 1 < leaf[1]:
            return self._span(off, localid, start, leaf[3 + i])
        head = self.sf.read_cached(start, 4)
        return None if head is None else self._span(off, localid, start, start + _U32.unpack(head)[0])

    async def locate(self, localid: int) -> tuple[int, int]:
        """(offset, length) of a row, walking root -> leaf."""
        self._check(localid)
        off = self.footer.root_off
        for _ in range(self.footer.height - 1):
            node = await self.page(off, leaf=False)
            off = node[2 * bisect_right(self._firsts[off], localid)]
        leaf = await self.page(off, leaf=True)
        i = self._slot(off, leaf, localid)
        start = leaf[2 + i]
        if i + 1 < leaf[1]:
            end = leaf[3 + i]
        else:
            end = start + _U32.unpack(await self.sf.read(start, 4))[0]
        return self._span(off, localid, start, end)

    def _check(self, localid: int) -> None:
        f = self.footer
        if not 0 <= localid < f.rows:
            raise RowCorruptionError(self.where, None, f"no row {localid} in segment {f.segid} ({f.rows} rows)")

    def _slot(self, off: int, leaf: list[int], localid: int) -> int:
        i = localid - leaf[0]
        if not 0 <= i < leaf[1]:
            raise RowCorruptionError(self.where, off, f"leaf does not hold localid {localid}")
        return i

    def _span(self, off: int, localid: int, start: int, end: int) -> tuple[int, int]:
        if not start < end <= self.footer.rows_len:
            raise RowCorruptionError(self.where, off, f"row {localid} has a bad offset")
        return start, end - start

    def get_raw_cached(self, localid: int) -> bytes | None:
        """``get_raw`` without I/O, or None."""
        span = self.located(localid)
        return None if span is None else self.sf.read_cached(*span)

    async def get_raw(self, localid: int) -> bytes:
        start, ln = await self.locate(localid)
        return await self.sf.read(start, ln)

    async def get(self, localids: np.ndarray, schemas: Callable[[int], SchemaVersion],
                  target: SchemaVersion) -> Decoded:
        raws = [await self.get_raw(int(i)) for i in np.atleast_1d(localids)]
        return decode_row_list(raws, schemas, target, self.where)

    async def row_offsets(self) -> np.ndarray:
        """Every row's offset, from the leaf level of the tree (one ranged read of the index
        section, checked against the footer's ``index_crc``; leaves dense and in order)."""
        f = self.footer
        at = f.rows_len
        index = np.frombuffer(await self.sf.read_sequential(at, self.sf.size - FOOTER_LEN - at), np.uint8)
        if index.shape[0] != self.sf.size - FOOTER_LEN - at or crc32c(index.data) != f.index_crc:
            raise RowCorruptionError(self.where, at, "index pages do not match the footer's index_crc")
        return _leaf_level(index, f.rows, f.rows_len, self.where, at)

    async def scan(self, schemas: Callable[[int], SchemaVersion], target: SchemaVersion) -> AsyncIterator[Decoded]:
        """Every row in localid order, as decoded batches.

        The leaf level gives every row's offset, so the row section splits into
        runs of whole rows (~``_SCAN_RUN`` bytes) that are independent: up to
        ``_SCAN_AHEAD`` runs are fetched, decompressed and decoded at once in
        worker threads (zstd and the decode kernels release the GIL), and
        yielded in order. Each run's rows must chain exactly through it.
        """
        offsets = await self.row_offsets()
        rows_len = self.footer.rows_len
        if offsets.shape[0] == 0:
            return
        cuts = np.unique(np.searchsorted(offsets, np.arange(0, rows_len, _SCAN_RUN)))
        runs = iter(zip(cuts.tolist(), cuts[1:].tolist() + [offsets.shape[0]]))

        async def run(a: int, b: int) -> Decoded:
            lo = int(offsets[a])
            hi = int(offsets[b]) if b < offsets.shape[0] else rows_len
            data = await self.sf.read_sequential(lo, hi - lo)
            if len(data) != hi - lo:
                raise RowCorruptionError(self.where, lo, "row section shorter than the footer says")
            return await asyncio.to_thread(decode_run, np.frombuffer(data, np.uint8), offsets[a:b] - lo,
                                           schemas, target, self.where, lo)

        ahead: deque[asyncio.Future[Decoded]] = deque()
        try:
            for a, b in itertools.islice(runs, _SCAN_AHEAD):
                ahead.append(asyncio.ensure_future(run(a, b)))
            while ahead:
                done = await ahead.popleft()
                nxt = next(runs, None)
                if nxt is not None:
                    ahead.append(asyncio.ensure_future(run(*nxt)))
                yield done
        finally:
            for fut in ahead:  # the consumer stopped early, or a run failed
                fut.cancel()
                fut.add_done_callback(_consume)


def _consume(fut: asyncio.Future[Decoded]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved, so a failure after an early stop is not logged as unhandled


def _leaf_level(index: np.ndarray, rows: int, rows_len: int, where: str, at: int) -> np.ndarray:
    """Row offsets from leaf pages packed back to back at the start of the index section."""
    words = index[: index.shape[0] // 4 * 4].view("<u4")
    parts: list[np.ndarray] = []
    pos, expect = 0, 0
    while expect < rows or not parts:
        if pos + 2 > words.shape[0]:
            raise RowCorruptionError(where, at + 4 * pos, "leaf level ends before the footer's row count")
        first, count = int(words[pos]), int(words[pos + 1])
        if first != expect or count > LEAF_CAP or pos + 2 + count > words.shape[0] or (count == 0 and rows):
            raise RowCorruptionError(where, at + 4 * pos, f"leaf page at localid {first} (expected {expect}) "
                                                          f"holding {count} rows is inconsistent")
        parts.append(words[pos + 2 : pos + 2 + count])
        pos, expect = pos + 2 + count, expect + count
    offs = np.concatenate(parts).astype(np.int64)
    if expect != rows or (rows and (offs[0] != 0 or np.any(np.diff(offs) <= 0) or offs[-1] >= rows_len)):
        raise RowCorruptionError(where, at, "leaf offsets are not increasing inside the row section")
    return offs
