"""Block records: the unit TerrascaleFS checksums, compresses and encrypts.

Byte layout, flags and invariants: docs/format/terrafs.md §1. Every constant
here is part of the file format; never change one, add a version.
"""
from __future__ import annotations

import asyncio
import enum
import struct
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.typing as npt
import zstandard
from cryptography.exceptions import InvalidTag

from catalog.checksum import crc32c
from terrafs.abc import Buffer, DeviceFile
from terrafs.crypto import NONCE_LEN, TAG_LEN, DataCipher
from terrafs.errors import FileCorruptionError, EncryptionKeyError

BLOCK_MAGIC = 0x4B4C4254  # b"TBLK" little-endian; part of the format
BLOCK_VERSION = 1
HEADER = struct.Struct("<IBBHQIIIII")  # see docs/format/terrafs.md §1
HEADER_LEN = HEADER.size  # 36
_AAD_LEN = 28  # header bytes covered as AES-GCM associated data
MAX_BLOCK_SIZE = 1 << 20
ZSTD_LEVEL = 1


class Codec(enum.IntEnum):
    NONE = 0
    ZSTD = 1


class Flags(enum.IntFlag):
    ZSTD = 0x01
    AESGCM = 0x02
    END = 0x04
    PAD = 0x08


_PAD, _AESGCM, _ZSTD = int(Flags.PAD), int(Flags.AESGCM), int(Flags.ZSTD)  # plain ints: a block's read tests them


@dataclass(frozen=True, slots=True)
class BlockHeader:
    flags: int
    logical_off: int
    group: int
    stored_len: int
    raw_len: int
    payload_crc: int

    @property
    def record_len(self) -> int:
        return HEADER_LEN + self.stored_len


_tls = threading.local()


def _zc() -> zstandard.ZstdCompressor:
    c = getattr(_tls, "zc", None)
    if c is None:
        c = _tls.zc = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    return c


def _zd() -> zstandard.ZstdDecompressor:
    d = getattr(_tls, "zd", None)
    if d is None:
        d = _tls.zd = zstandard.ZstdDecompressor()
    return d


def _pack_header(flags: int, logical_off: int, group: int, stored_len: int, raw_len: int,
                 payload_crc: int) -> bytes:
    head = HEADER.pack(BLOCK_MAGIC, BLOCK_VERSION, flags, 0, logical_off, group,
                       stored_len, raw_len, payload_crc, 0)
    return head[:32] + struct.pack("<I", crc32c(head[:32]))


def encode_block(out: bytearray, data: Buffer, *, logical_off: int, group: int, end: bool,
                 codec: Codec = Codec.NONE, cipher: DataCipher | None = None,
                 inode: int = 0) -> None:
    """Append one block record holding ``data`` (logical bytes) to ``out``."""
    flags = Flags.END if end else 0
    payload = data
    if codec == Codec.ZSTD and len(data) > 0:
        packed = _zc().compress(data)
        if len(packed) < len(data):  # keep compression only when it shrinks the block
            payload, flags = packed, flags | Flags.ZSTD
    if cipher is not None:
        flags |= Flags.AESGCM
        stored_len = len(payload) + NONCE_LEN + TAG_LEN
        aad = HEADER.pack(BLOCK_MAGIC, BLOCK_VERSION, flags, 0, logical_off, group,
                          stored_len, len(data), 0, 0)[:_AAD_LEN] + struct.pack("<I", inode)
        payload = cipher.encrypt(bytes(payload), aad)
    out += _pack_header(int(flags), logical_off, group, len(payload), len(data), crc32c(payload))
    out += payload


def encode_block_parts(parts: list[Buffer], pieces: Sequence[Buffer], raw_len: int, *, logical_off: int, group: int,
                       end: bool, codec: Codec = Codec.NONE, cipher: DataCipher | None = None,
                       inode: int = 0) -> int:
    """Like :func:`encode_block` for data given as several buffers; appends the
    record's buffers to ``parts`` (zero-copy when there is nothing to transform)
    and returns the record length."""
    if codec == Codec.NONE and cipher is None:
        crc = 0
        for piece in pieces:
            crc = crc32c(piece, crc)
        parts.append(_pack_header(int(Flags.END) if end else 0, logical_off, group, raw_len, raw_len, crc))
        parts.extend(pieces)
        return HEADER_LEN + raw_len
    out = bytearray()
    encode_block(out, b"".join(pieces), logical_off=logical_off, group=group, end=end, codec=codec,
                 cipher=cipher, inode=inode)
    parts.append(out)
    return len(out)


def encode_pad(out: bytearray, *, logical_off: int, group: int, pad_len: int) -> None:
    """Append a PAD+END block whose whole record is ``pad_len`` bytes (>= HEADER_LEN)."""
    stored = pad_len - HEADER_LEN
    zeros = bytes(stored)
    out += _pack_header(int(Flags.PAD | Flags.END), logical_off, group, stored, 0, crc32c(zeros))
    out += zeros


def parse_header(buf: Buffer, pos: int, where: str) -> BlockHeader:
    """Verify and parse the header at ``buf[pos:]``; FileCorruptionError if it is bad."""
    if len(buf) - pos < HEADER_LEN:
        raise FileCorruptionError(where, pos, "truncated block header")
    magic, ver, flags, _r, loff, group, slen, rlen, pcrc, hcrc = HEADER.unpack_from(buf, pos)
    if magic != BLOCK_MAGIC:
        raise FileCorruptionError(where, pos, f"bad block magic {magic:#010x}")
    if crc32c(bytes(buf[pos : pos + 32])) != hcrc:
        raise FileCorruptionError(where, pos, "block header checksum mismatch")
    if ver != BLOCK_VERSION:
        raise FileCorruptionError(where, pos, f"unsupported block version {ver}")
    if flags & ~0x0F:
        raise FileCorruptionError(where, pos, f"unknown block flags {flags:#04x}")
    if rlen > MAX_BLOCK_SIZE or slen > MAX_BLOCK_SIZE + 1024:
        raise FileCorruptionError(where, pos, f"block length out of range ({slen}/{rlen})")
    return BlockHeader(flags, loff, group, slen, rlen, pcrc)


def decode_payload(h: BlockHeader, payload: Buffer, *, cipher: DataCipher | None, inode: int,
                   where: str, pos: int) -> bytes:
    """Checksum, decrypt and decompress one block's payload into its logical bytes."""
    if len(payload) != h.stored_len:
        raise FileCorruptionError(where, pos, "truncated block payload")
    if crc32c(payload) != h.payload_crc:
        raise FileCorruptionError(where, pos, "block payload checksum mismatch")
    if h.flags & _PAD:
        return b""
    data = payload
    if h.flags & _AESGCM:
        if cipher is None:
            raise EncryptionKeyError(f"{where}: block at offset {pos} is encrypted and no key is configured")
        aad = HEADER.pack(BLOCK_MAGIC, BLOCK_VERSION, h.flags, 0, h.logical_off, h.group,
                          h.stored_len, h.raw_len, 0, 0)[:_AAD_LEN] + struct.pack("<I", inode)
        try:
            data = cipher.decrypt(bytes(payload), aad)
        except InvalidTag:
            # The crc matched, so the bytes are as written: the key is wrong, or
            # the block was moved from another file/offset.
            raise EncryptionKeyError(f"{where}: block at offset {pos} does not decrypt "
                                     "(wrong key or block moved)") from None
    if h.flags & _ZSTD:
        try:
            data = _zd().decompress(data, max_output_size=h.raw_len)
        except zstandard.ZstdError as e:
            raise FileCorruptionError(where, pos, f"zstd: {e}") from e
    if len(data) != h.raw_len:
        raise FileCorruptionError(where, pos, f"block holds {len(data)} bytes, header says {h.raw_len}")
    return bytes(data)


def decode_block(buf: Buffer, pos: int, *, cipher: DataCipher | None = None, inode: int = 0,
                 where: str = "<buffer>") -> tuple[BlockHeader, bytes]:
    """Parse and decode the record at ``buf[pos:]``."""
    h = parse_header(buf, pos, where)
    start = pos + HEADER_LEN
    return h, decode_payload(h, buf[start : start + h.stored_len], cipher=cipher,
                             inode=inode, where=where, pos=pos)


async def read_run(f: DeviceFile, physical: npt.NDArray[np.int64], end: int | None, *,
                   cipher: DataCipher | None, inode: int, where: str) -> list[bytes]:
    """The blocks of ``f`` at ``physical`` (ascending, back to back but for records between
    them) by one read up to ``end`` (None: the last block's end, from its header), verified and
    decoded in one worker-thread hop."""
    base, last = int(physical[0]), int(physical[-1])
    if end is None:
        end = last + HEADER_LEN + parse_header(await f.pread(last, HEADER_LEN), 0, where).stored_len
    buf = await f.pread(base, end - base)
    return await asyncio.to_thread(decode_run, buf, base, physical.tolist(), cipher=cipher, inode=inode, where=where)


def decode_run(buf: Buffer, base: int, physical: Sequence[int], *, cipher: DataCipher | None, inode: int,
               where: str) -> list[bytes]:
    """The blocks at file offsets ``physical`` (ascending), all inside ``buf`` (the file's
    bytes from ``base``): verified and decoded in one call (a sequential scan's worker-thread
    hop), corruption named at its offset in the file."""
    view = memoryview(buf).cast("B")
    out = []
    for p in physical:
        pos = int(p) - base
        try:
            h = parse_header(view, pos, where)
        except FileCorruptionError as e:
            raise FileCorruptionError(where, int(p), e.reason) from None
        body = view[pos + HEADER_LEN : pos + HEADER_LEN + h.stored_len]
        out.append(decode_payload(h, body, cipher=cipher, inode=inode, where=where, pos=int(p)))
    return out
