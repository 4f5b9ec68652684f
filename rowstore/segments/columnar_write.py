"""Writing a columnar sealed segment (version 2, docs/format/segment.md §7):
:func:`columnar_bytes` streams the object's logical bytes from committed row batches (an
active segment's write-ahead, or a garbage collector's copy): rows are cut into groups of
``GROUP_ROWS``; each group's column chunks are pages (``rowstore.codec.columns``), each page
its own TerrascaleFS block (``Aligned``), so a read of some columns fetches, verifies,
decrypts and decompresses only their blocks. The metadata (column table, schema versions,
chunks with per-column statistics, page directory, key range) and a fixed trailer follow."""
from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from catalog.checksum import crc32c
from rowstore.codec.columns import encode_page
from rowstore.codec.rows import Decoded, decode_rows, row_versions
from rowstore.errors import RowCorruptionError
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.columnar_layout import (
    CHUNK,
    COL_MAGIC,
    COL_VERSION,
    COLUMN,
    GROUP_ROWS,
    META_HEAD,
    PAGE,
    PAGE_BYTES,
    SYSTEM,
    TRAILER,
    TRAILER_LEN,
    VERSION_HEAD,
    type_code,
)
from rowstore.segments.columnar_stats import chunk_stats
from rowstore.segments.sealed import (
    ClusterRange,
    RowBatch,
    key_bytes,
    key_columns_schema,
    pack_cluster,
)
from rowstore.tables.keys import encode_columns, key_arrays
from rowstore.types import ColumnType
from terrafs.sealed import Aligned

# -- writing ----------------------------------------------------------------------------------


@dataclass
class _Piece:
    buf: np.ndarray  # uint8: rows back to back from starts[0]
    starts: np.ndarray  # int64


class _Writer:
    """The state of one object being written: columns seen, chunks, pages, statistics."""

    def __init__(self, segid: int, schemas: Callable[[int], SchemaVersion], key_schema: SchemaVersion):
        self.segid, self.schemas = segid, schemas
        self.keys = key_columns_schema(key_schema)
        self.columns: dict[tuple[int, str], int] = {(cid, str(t)): i for i, (cid, t) in enumerate(SYSTEM)}
        self.types: list[ColumnType] = [t for _, t in SYSTEM]
        self.ids: list[int] = [cid for cid, _ in SYSTEM]
        self.versions: dict[int, SchemaVersion] = {}
        self.chunks: list[dict[int, np.ndarray]] = []  # per group: column index -> chunk entry
        self.group_rows: list[int] = []
        self.pages: list[tuple[int, int, int, int]] = []  # off, len, first row, rows
        self.pos = self.rows = 0
        self.min_ts: int | None = None
        self.max_ts = self.deletions = self.deletions_max_ts = 0
        self.kmin: bytes | None = None
        self.kmax: bytes | None = None

    def union(self, vers: list[int]) -> SchemaVersion:
        """Every column of these versions (and of the key), named ``c<id>``, key columns first."""
        cols: dict[int, Column] = {}
        pk = self.keys.primary_key
        for v in vers:
            s = self.versions.setdefault(v, self.schemas(v))
            for c in s.columns:
                key = (c.id, str(c.type))
                if key not in self.columns:
                    self.columns[key] = len(self.types)
                    self.types.append(c.type)
                    self.ids.append(c.id)
                if c.id not in cols:
                    cols[c.id] = Column(c.id, f"c{c.id}", c.type, c.id not in pk)
        for c in self.keys.columns:
            cols.setdefault(c.id, Column(c.id, f"c{c.id}", c.type, False))
        return SchemaVersion(0, tuple(cols.values()), pk, max(cols) + 1, self.keys.partition_key)

    def group(self, piece: _Piece) -> list[bytes]:
        """One group's pages (in a worker thread): rows decoded once, each column paged."""
        vers = np.unique(row_versions(piece.buf, piece.starts)).tolist()
        union = self.union(vers)
        dec = decode_rows(piece.buf, piece.starts, self.schemas, union, f"segment {self.segid}")
        n = dec.batch.num_rows
        arrays: list[tuple[int, pa.Array, ColumnType]] = [
            (0, pa.array(dec.commit_ts, pa.uint64()), SYSTEM[0][1]),
            (1, pa.array(dec.deleted.astype(np.uint8), pa.uint8()), SYSTEM[1][1]),
            (2, pa.array(dec.schema_ver, pa.uint32()), SYSTEM[2][1])]
        for c in union.columns:
            arrays.append((self.columns[(c.id, str(c.type))], dec.batch.column(c.name), c.type))
        chunks: dict[int, np.ndarray] = {}
        out: list[bytes] = []
        for ci, arr, t in arrays:
            entry = np.zeros((), CHUNK)
            entry["first"] = len(self.pages)
            step = _page_rows(arr, t)
            for a in range(0, n, step):
                page = encode_page(arr.slice(a, min(step, n - a)), t)
                self.pages.append((self.pos, len(page), self.rows + a, min(step, n - a)))
                self.pos += len(page)
                out.append(page)
            entry["pages"] = len(self.pages) - int(entry["first"])
            chunk_stats(entry, arr, t)
            chunks[ci] = entry
        self.chunks.append(chunks)
        self.group_rows.append(n)
        self._facts(dec, union)
        self.rows += n
        return out

    def _facts(self, dec: Decoded, union: SchemaVersion) -> None:
        """Commit timestamps, deletions and the key range of a group's rows."""
        ts = dec.commit_ts
        self.min_ts = int(ts.min()) if self.min_ts is None else min(self.min_ts, int(ts.min()))
        self.max_ts = max(self.max_ts, int(ts.max()))
        if dec.deleted.any():
            self.deletions += int(dec.deleted.sum())
            self.deletions_max_ts = max(self.deletions_max_ts, int(ts[dec.deleted].max()))
        enc = np.sort(encode_columns(union.pk, key_arrays(union.pk, dec.batch)))
        lo, hi = key_bytes(enc[0]), key_bytes(enc[-1])
        self.kmin = lo if self.kmin is None else min(self.kmin, lo)
        self.kmax = hi if self.kmax is None else max(self.kmax, hi)

    def meta(self, cluster: ClusterRange | None) -> bytes:
        cols = np.zeros(len(self.types), COLUMN)
        cols["id"] = self.ids
        codes = [type_code(t) for t in self.types]
        cols["type"] = [c[0] for c in codes]
        cols["elem"] = [c[1] for c in codes]
        chunks = np.zeros((len(self.chunks), len(self.types)), CHUNK)
        for g, got in enumerate(self.chunks):
            chunks[g]["first"] = len(self.pages)  # a column the group lacks: no pages, every row null
            chunks[g]["nulls"] = self.group_rows[g]
            chunks[g]["distinct"] = 0
            for ci, entry in got.items():
                chunks[g, ci] = entry
        pages = np.zeros(len(self.pages), PAGE)
        if self.pages:
            pages["off"], pages["len"], pages["first"], pages["rows"] = np.array(self.pages, np.int64).T
        vers = b"".join(self._version(s) for _, s in sorted(self.versions.items()))
        kmin, kmax = self.kmin or b"", self.kmax or b""
        head = META_HEAD.pack(len(self.types), len(self.chunks), len(self.pages), len(self.versions), GROUP_ROWS,
                              len(kmin), len(kmax), 0)
        return b"".join([head, cols.tobytes(), vers, chunks.tobytes(), pages.tobytes(), kmin, kmax,
                         pack_cluster(cluster)])

    def _version(self, s: SchemaVersion) -> bytes:
        idx = [self.columns[(c.id, str(c.type))] for c in s.columns]
        body = VERSION_HEAD.pack(s.version, len(s.columns), len(s.primary_key), s.partition_key, 0)
        body += np.array([(i, int(c.nullable)) for i, c in zip(idx, s.columns)], "<u2").tobytes()
        body += np.array([self.columns[(cid, str(s.by_id(cid).type))] for cid in s.primary_key],  # type: ignore[union-attr]
                         "<u2").tobytes()
        return body


def _page_rows(arr: pa.Array, t: ColumnType) -> int:
    """Rows per page of a chunk: about ``PAGE_BYTES`` of plain values, a multiple of 8."""
    if t.variable:
        width = 4 + max(1, arr.nbytes // max(len(arr), 1))
    else:
        width = int(np.dtype(t.storage()).itemsize)
    return int(max(8, PAGE_BYTES // width // 8 * 8))


async def columnar_bytes(segid: int, batches: AsyncIterable[RowBatch], schemas: Callable[[int], SchemaVersion],
                         key_schema: SchemaVersion, stats: dict[str, Any] | None = None,
                         cluster: ClusterRange | None = None) -> AsyncIterator[bytes]:
    """Stream a columnar sealed segment from committed row batches, in localid order: groups
    of ``GROUP_ROWS`` rows, each page one block; then the metadata and the trailer."""
    w = _Writer(segid, schemas, key_schema)
    pending: list[_Piece] = []
    have = 0
    async for b in batches:
        starts = np.asarray(b.starts, np.int64)
        if len(starts) == 0:
            continue
        piece = _Piece(np.asarray(b.rows, np.uint8), starts)
        while have + len(piece.starts) >= GROUP_ROWS:
            cut = GROUP_ROWS - have
            head, piece = _split(piece, cut)
            for page in await asyncio.to_thread(w.group, _join([*pending, head])):
                yield Aligned(page)
            pending, have = [], 0
        if len(piece.starts):
            pending.append(piece)
            have += len(piece.starts)
    if pending:
        for page in await asyncio.to_thread(w.group, _join(pending)):
            yield Aligned(page)
    if len(w.versions) > 0xFFFF or len(w.types) > 0xFFFF:
        raise RowCorruptionError(f"segment {segid}", None, "too many schema versions or columns in one segment")
    meta = w.meta(cluster)
    yield meta
    yield pack_trailer(segid, w, len(meta), crc32c(meta))
    if stats is not None:
        stats.update(rows=w.rows, rows_len=w.pos, min_ts=w.min_ts, max_ts=w.max_ts, deletions=w.deletions,
                     deletions_max_ts=w.deletions_max_ts, format=COL_VERSION)


def pack_trailer(segid: int, w: _Writer, meta_len: int, meta_crc: int) -> bytes:
    body = TRAILER.pack(segid, len(w.chunks), w.rows, w.pos, meta_len, meta_crc, w.min_ts or 0, w.max_ts,
                        len(w.types), len(w.pages), len(w.versions), GROUP_ROWS, bytes(48), COL_VERSION,
                        TRAILER_LEN, 0, COL_MAGIC)
    return body[:116] + struct.pack("<I", crc32c(body[:116])) + COL_MAGIC


def _split(p: _Piece, k: int) -> tuple[_Piece, _Piece]:
    if k >= len(p.starts):
        return p, _Piece(p.buf[:0], p.starts[:0])
    cut = int(p.starts[k])
    return _Piece(p.buf[:cut], p.starts[:k]), _Piece(p.buf[cut:], p.starts[k:] - cut)


def _join(pieces: list[_Piece]) -> _Piece:
    if len(pieces) == 1:
        return pieces[0]
    base = np.cumsum([0] + [len(p.buf) for p in pieces[:-1]])
    return _Piece(np.concatenate([p.buf for p in pieces]), np.concatenate([p.starts + b for p, b in zip(pieces, base)]))


