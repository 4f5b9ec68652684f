"""The byte layout of a columnar sealed segment (version 2, docs/format/segment.md §7): its
constants, type codes and system columns, the trailer, and the metadata parsed and checked
against the trailer and the page section — what a writer (``columnar_write``) and a reader
(``columnar``) of the format agree on."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from catalog.checksum import crc32c
from rowstore.errors import ColumnCorruptionError, RowCorruptionError
from rowstore.schema import Column, SchemaVersion
from rowstore.segments.sealed import (
    ClusterRange,
    unpack_cluster,
)
from rowstore.types import ColumnType, Kind

COL_MAGIC = b"TRSEGCL2"  # part of the format: the last 8 bytes of a version-2 segment
COL_VERSION = 2
GROUP_ROWS = 1 << 16  # rows per group (the last group may hold fewer); part of the format
PAGE_BYTES = 64 << 10  # target plain bytes of a page (the writer's choice, not the format's)
BLOCK_SIZE = 1 << 20  # TerrascaleFS block size of a columnar object: a page is one block
TRAILER = struct.Struct("<IIQQIIQQIIII48sHHI8s")
TRAILER_LEN = TRAILER.size  # 128
META_HEAD = struct.Struct("<IIIIIIII")  # columns, groups, pages, versions, group rows, min key, max key, 0
COLUMN = np.dtype([("id", "<u4"), ("type", "u1"), ("elem", "u1"), ("zero", "<u2")])
CHUNK = np.dtype([("first", "<u4"), ("pages", "<u4"), ("nulls", "<u4"), ("distinct", "<u4"),
                  ("flags", "u1"), ("min_len", "u1"), ("max_len", "u1"), ("zero", "u1"),
                  ("min", "u1", (32,)), ("max", "u1", (32,))])
PAGE = np.dtype([("off", "<u8"), ("len", "<u4"), ("first", "<u4"), ("rows", "<u4"), ("zero", "<u4")])
VERSION_HEAD = struct.Struct("<IHHHH")  # version, columns, key columns, partition key, 0
HAS_MINMAX = 0x01  # chunk flag: min and max hold bounds of its non-null values
STAT_BYTES = 32
NO_DISTINCT = 0xFFFFFFFF
assert TRAILER_LEN == 128 and COLUMN.itemsize == 8 and CHUNK.itemsize == 84 and PAGE.itemsize == 24

# the system columns, first in every column table (ids above any a schema gives)
TS_ID, FLAGS_ID, VERSION_ID = 0xFFFFFFF0, 0xFFFFFFF1, 0xFFFFFFF2
SYSTEM = ((TS_ID, ColumnType(Kind.UINT64)), (FLAGS_ID, ColumnType(Kind.UINT8)), (VERSION_ID, ColumnType(Kind.UINT32)))
# column type codes (part of the format)
KIND_CODES = {k: i + 1 for i, k in enumerate(Kind)}
KINDS = {v: k for k, v in KIND_CODES.items()}
assert KIND_CODES[Kind.INT8] == 1 and KIND_CODES[Kind.RANGE] == 20 and KIND_CODES[Kind.JSON] == 17


def type_code(t: ColumnType) -> tuple[int, int]:
    return KIND_CODES[t.kind], KIND_CODES[t.elem] if t.elem is not None else 0



@dataclass(frozen=True)
class Meta:
    ids: np.ndarray  # column id per column index
    types: tuple[ColumnType, ...]
    versions: dict[int, SchemaVersion]  # the rows' schema versions, columns named c<id>
    chunks: np.ndarray  # (groups, columns) of CHUNK
    pages: np.ndarray  # PAGE
    group_rows: int


def is_columnar(tail: bytes) -> bool:
    """Whether an object's last bytes are a version-2 trailer's."""
    return tail[-8:] == COL_MAGIC



def column_name(cid: int) -> str:
    return {TS_ID: "commit_ts", FLAGS_ID: "flags", VERSION_ID: "schema_version"}.get(cid, f"id {cid}")



def unpack_trailer(raw: bytes, where: str, at: int) -> dict[str, int]:
    if len(raw) != TRAILER_LEN or raw[-8:] != COL_MAGIC:
        raise RowCorruptionError(where, at, "no columnar segment trailer")
    f = TRAILER.unpack(raw)
    if crc32c(raw[:116]) != f[15]:
        raise RowCorruptionError(where, at, "segment trailer checksum mismatch")
    if f[13] != COL_VERSION or f[14] != TRAILER_LEN:
        raise RowCorruptionError(where, at, f"unsupported segment version {f[13]}")
    return dict(segid=f[0], groups=f[1], rows=f[2], meta_off=f[3], meta_len=f[4], meta_crc=f[5], min_ts=f[6],
                max_ts=f[7], columns=f[8], pages=f[9], versions=f[10], group_rows=f[11])


def parse_meta(raw: bytes, t: dict[str, int], where: str) -> tuple[Meta, bytes, bytes, ClusterRange | None]:
    """The metadata section, every count checked against the trailer and every page against
    the page section."""
    try:
        return _parse_meta(raw, t, where)
    except (ValueError, KeyError, struct.error, IndexError) as e:
        raise ColumnCorruptionError(where, t["meta_off"], f"metadata does not parse: {e}") from None


def _parse_meta(raw: bytes, t: dict[str, int], where: str) -> tuple[Meta, bytes, bytes, ClusterRange | None]:
    ncol, ngrp, npage, nver, group_rows, kmin_len, kmax_len, _ = META_HEAD.unpack_from(raw, 0)
    if (ncol, ngrp, npage, nver, group_rows) != (t["columns"], t["groups"], t["pages"], t["versions"],
                                                 t["group_rows"]) or group_rows == 0:
        raise ColumnCorruptionError(where, t["meta_off"], "metadata counts disagree with the trailer")
    if ngrp != -(-t["rows"] // group_rows):
        raise ColumnCorruptionError(where, t["meta_off"], f"{ngrp} groups for {t['rows']} rows")
    at = META_HEAD.size
    cols = np.frombuffer(raw, COLUMN, ncol, at)
    at += COLUMN.itemsize * ncol
    types = tuple(_type(int(c["type"]), int(c["elem"])) for c in cols)
    if [(int(i), str(ty)) for i, ty in zip(cols["id"][:3], types[:3])] != [(i, str(ty)) for i, ty in SYSTEM]:
        raise ColumnCorruptionError(where, t["meta_off"], "the column table does not start with the system columns")
    versions: dict[int, SchemaVersion] = {}
    for _ in range(nver):
        v, nc, nk, pkey, _z = VERSION_HEAD.unpack_from(raw, at)
        at += VERSION_HEAD.size
        body = np.frombuffer(raw, "<u2", 2 * nc, at).reshape(-1, 2)
        at += 4 * nc
        key = np.frombuffer(raw, "<u2", nk, at)
        at += 2 * nk
        columns = tuple(Column(int(cols["id"][i]), f"c{int(cols['id'][i])}", types[i], bool(nl)) for i, nl in body)
        versions[v] = SchemaVersion(v, columns, tuple(int(cols["id"][i]) for i in key),
                                    max([c.id for c in columns] + [0]) + 1, pkey)
    chunks = np.frombuffer(raw, CHUNK, ngrp * ncol, at).reshape(ngrp, ncol)
    at += CHUNK.itemsize * ngrp * ncol
    pages = np.frombuffer(raw, PAGE, npage, at)
    at += PAGE.itemsize * npage
    kmin, kmax = raw[at : at + kmin_len], raw[at + kmin_len : at + kmin_len + kmax_len]
    at += kmin_len + kmax_len
    cluster = unpack_cluster(raw[at : at + 24], where, at)
    if at + 24 != len(raw):
        raise ColumnCorruptionError(where, t["meta_off"], "metadata length disagrees with its contents")
    _check_pages(chunks, pages, t, where, group_rows)
    return Meta(cols["id"].copy(), types, versions, chunks, pages, group_rows), kmin, kmax, cluster


def _check_pages(chunks: np.ndarray, pages: np.ndarray, t: dict[str, int], where: str, group_rows: int) -> None:
    """Pages packed from 0 in directory order, ending at the metadata; each chunk's pages
    consecutive and covering its group's rows exactly."""
    off = pages["off"].astype(np.int64)
    ln = pages["len"].astype(np.int64)
    if len(pages) and (off[0] != 0 or np.any(off[1:] != (off + ln)[:-1]) or int(off[-1] + ln[-1]) != t["meta_off"]):
        raise ColumnCorruptionError(where, t["meta_off"], "pages are not packed back to back up to the metadata")
    if not len(pages) and t["meta_off"] != 0:
        raise ColumnCorruptionError(where, t["meta_off"], "page section without pages")
    first, count = chunks["first"].astype(np.int64), chunks["pages"].astype(np.int64)
    if np.any(first + count > len(pages)):
        raise ColumnCorruptionError(where, t["meta_off"], "a chunk names pages past the directory")
    rows = pages["rows"].astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(rows)])
    for g in range(chunks.shape[0]):
        n = min(group_rows, t["rows"] - g * group_rows)
        has = count[g] > 0
        got = cum[first[g] + count[g]] - cum[first[g]]
        if np.any(has & (got != n)):
            raise ColumnCorruptionError(where, t["meta_off"], f"group {g}'s pages do not hold its {n} rows")
        starts = pages["first"][first[g][has]].astype(np.int64)
        if np.any(starts != g * group_rows):
            raise ColumnCorruptionError(where, t["meta_off"], f"group {g}'s first page does not start at its row")
        if np.any(~has & (chunks["nulls"][g] != n)):
            raise ColumnCorruptionError(where, t["meta_off"], f"a chunk of group {g} without pages is not all null")


def _type(code: int, elem: int) -> ColumnType:
    if code not in KINDS or (elem and elem not in KINDS):
        raise ValueError(f"unknown type code {code}/{elem}")
    return ColumnType(KINDS[code], KINDS[elem] if elem else None)


def union_schema(meta: Meta) -> SchemaVersion:
    """Every column of the segment by id (``c<id>``), for decoding rows whatever their version."""
    cols: dict[int, Column] = {}
    pk: tuple[int, ...] = ()
    pkey = 1
    for v in sorted(meta.versions):
        s = meta.versions[v]
        pk, pkey = s.primary_key, s.partition_key
        for c in s.columns:
            cols.setdefault(c.id, Column(c.id, c.name, c.type, c.id not in s.primary_key))
    if not cols:  # no rows: a schema of the segment's columns alone
        return SchemaVersion(0, (Column(1, "c1", ColumnType(Kind.INT64), False),), (1,), 2)
    return SchemaVersion(0, tuple(cols.values()), pk, max(cols) + 1, pkey)


@dataclass(frozen=True)
class ColumnarFooter:
    """What a version-2 segment's trailer and metadata say of it as a whole (the names are
    those of the row-wise ``Footer`` where they mean the same)."""

    segid: int
    rows: int
    rows_len: int  # bytes of the page section
    min_ts: int
    max_ts: int
    versions: tuple[int, ...]
    min_key: bytes
    max_key: bytes
    cluster: ClusterRange | None

    @property
    def min_key_len(self) -> int:
        return len(self.min_key)

    @property
    def max_key_len(self) -> int:
        return len(self.max_key)
