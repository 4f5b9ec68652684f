"""Log records of the local catalog. Layout: docs/format/catalog-log.md."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

from catalog.abc import Delete, Op, Put
from catalog.checksum import crc32c
from catalog.errors import CatalogCorruptionError, CatalogError

LOG_MAGIC = b"TRKVLOG1"  # part of the format
LOG_VERSION = 1
LOG_HEADER = struct.Struct("<8sHQI")  # 22 bytes
REC_MAGIC = 0x52564B54  # b"TKVR"
REC_HEADER = struct.Struct("<IIII")  # magic, length, payload crc, header crc
MAX_RECORD = 1 << 20
_PUT, _DEL = 1, 2


@dataclass(frozen=True, slots=True)
class LogRecord:
    revision: int
    request_id: str | None
    ops: tuple[Op, ...]


def encode_log_header(base: int) -> bytes:
    head = LOG_MAGIC + struct.pack("<HQ", LOG_VERSION, base)
    return head + struct.pack("<I", crc32c(head))


def decode_log_header(buf: bytes, where: str) -> int:
    if len(buf) < LOG_HEADER.size:
        raise CatalogCorruptionError(where, 0, "truncated log header")
    base: int  # the "Q" field: the log's base revision
    magic, ver, base, crc = LOG_HEADER.unpack_from(buf, 0)
    if magic != LOG_MAGIC or crc32c(buf[:18]) != crc:
        raise CatalogCorruptionError(where, 0, "bad log header")
    if ver != LOG_VERSION:
        raise CatalogCorruptionError(where, 0, f"unsupported log version {ver}")
    return base


def encode_ops(ops: Sequence[Op]) -> bytes:
    """u16 count, then per op: u8 kind, u16 key length, key, (Put) u32 value length, value.
    Shared by the log records and the Raft entries (docs/format/catalog-log.md)."""
    p = bytearray(struct.pack("<H", len(ops)))
    for op in ops:
        kb = op.key.encode()
        if isinstance(op, Put):
            p += struct.pack("<BH", _PUT, len(kb)) + kb + struct.pack("<I", len(op.value)) + bytes(op.value)
        else:
            p += struct.pack("<BH", _DEL, len(kb)) + kb
    return bytes(p)


def decode_ops(p: bytes, pos: int) -> tuple[list[Op], int]:
    """The ops encoded at ``pos`` and the position after them; ValueError/struct.error if bad."""
    (n,) = struct.unpack_from("<H", p, pos)
    pos += 2
    ops: list[Op] = []
    for _ in range(n):
        kind, kl = struct.unpack_from("<BH", p, pos)
        key = p[pos + 3 : pos + 3 + kl].decode()
        pos += 3 + kl
        if kind == _PUT:
            (vl,) = struct.unpack_from("<I", p, pos)
            ops.append(Put(key, p[pos + 4 : pos + 4 + vl]))
            pos += 4 + vl
        elif kind == _DEL:
            ops.append(Delete(key))
        else:
            raise ValueError(f"unknown op kind {kind}")
    return ops, pos


def encode_record(rec: LogRecord) -> bytes:
    rid = (rec.request_id or "").encode()
    p = struct.pack("<QH", rec.revision, len(rid)) + rid + encode_ops(rec.ops)
    head = struct.pack("<III", REC_MAGIC, len(p), crc32c(p))
    return head + struct.pack("<I", crc32c(head)) + p


class BadRecord(CatalogError):
    """A record that does not verify at ``offset`` (torn or corrupt: the caller decides)."""

    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset, self.reason = offset, reason


def decode_record(buf: bytes, pos: int) -> tuple[LogRecord, int]:
    """Parse the record at ``pos``; return it and the next position. Raises BadRecord."""
    if len(buf) - pos < REC_HEADER.size:
        raise BadRecord(pos, "truncated record header")
    magic, length, pcrc, hcrc = REC_HEADER.unpack_from(buf, pos)
    if magic != REC_MAGIC or crc32c(buf[pos : pos + 12]) != hcrc or length > MAX_RECORD:
        raise BadRecord(pos, "bad record header")
    start = pos + REC_HEADER.size
    payload = buf[start : start + length]
    if len(payload) != length:
        raise BadRecord(pos, "truncated record payload")
    if crc32c(payload) != pcrc:
        raise BadRecord(pos, "record checksum mismatch")
    try:
        return _parse_payload(payload), start + length
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise BadRecord(pos, f"malformed record: {e}") from e


def _parse_payload(p: bytes) -> LogRecord:
    rev, rl = struct.unpack_from("<QH", p, 0)
    rid = p[10 : 10 + rl].decode() or None
    ops, pos = decode_ops(p, 10 + rl)
    if pos != len(p):
        raise ValueError("trailing bytes in record")
    return LogRecord(rev, rid, tuple(ops))


def find_valid_record_after(buf: bytes, pos: int) -> int | None:
    """Offset of the first verifiable record after ``pos`` (torn vs corrupt)."""
    magic = struct.pack("<I", REC_MAGIC)
    i = buf.find(magic, pos + 1)
    while i >= 0:
        try:
            decode_record(buf, i)
            return i
        except BadRecord:
            i = buf.find(magic, i + 1)
    return None
