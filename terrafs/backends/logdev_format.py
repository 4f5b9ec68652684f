"""The log device's on-disk structures (docs/format/logdev.md): the superblock, extent headers,
and the file chains a device's headers describe. Pure functions of bytes; the device that
reads and writes them is :mod:`terrafs.backends.logdev_core`. Every constant marked "format" is
part of the format; never change one, add a version."""
from __future__ import annotations

import struct
import threading
import uuid
from dataclasses import dataclass, field

from catalog.checksum import crc32c
from terrafs.errors import FileCorruptionError

SUPER_MAGIC, HEAD_MAGIC = b"TRFSLOGD", b"TRLDEXT1"  # format
VERSION = 1  # format
ZERO_ENDED = 0x1  # format: superblock flag — files are whole extents after a reopen
PAGE = 4096  # format: the superblock, and each extent's header area
SUPER = struct.Struct("<8sHHI16s")  # format: 32 bytes, then crc
HEAD = struct.Struct("<8sHHIQQII")  # format: 40 bytes, then the name, then crc
MAX_NAME = 400
_CRC = struct.Struct("<I")
Piece = tuple[int, int, int, str]  # one extent of a file: (extent, seq, used, name)


@dataclass
class Chain:
    """One file: its extents in index order."""

    name: str
    file_id: int
    extents: list[int] = field(default_factory=list)  # extent numbers
    used: int = 0  # payload bytes in the last extent
    seq: int = 0  # of its index-0 header (a rename conflict: the greater wins)
    reserved: int = 0  # end of the appends handed an offset (they may still be writing)
    last_write: int = 0  # the device's write counter after this file's last write (its flush waits for it)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)  # extents, used, headers

    def size(self, payload: int) -> int:
        return max(len(self.extents) - 1, 0) * payload + self.used


def encode_superblock(flags: int, extent_size: int) -> bytes:
    """The first PAGE bytes of a new device."""
    head = SUPER.pack(SUPER_MAGIC, VERSION, flags, extent_size, uuid.uuid4().bytes)
    return head + _CRC.pack(crc32c(head)) + bytes(PAGE - len(head) - _CRC.size)


def decode_superblock(sb: bytes, where: str) -> tuple[int, int]:
    """(flags, extent_size) of a superblock; FileCorruptionError when it does not verify."""
    if len(sb) < SUPER.size + _CRC.size:
        raise FileCorruptionError(where, 0, "truncated log-device superblock")
    magic, ver, flags, esize, _dev = SUPER.unpack_from(sb, 0)
    (crc,) = _CRC.unpack_from(sb, SUPER.size)
    if magic != SUPER_MAGIC or crc32c(sb[: SUPER.size]) != crc:
        raise FileCorruptionError(where, 0, "bad log-device superblock (magic or checksum)")
    if ver != VERSION:
        raise FileCorruptionError(where, 0, f"unsupported log-device version {ver}")
    if flags & ~ZERO_ENDED:
        raise FileCorruptionError(where, 10, f"unknown log-device flags {flags:#x}")
    return flags, esize


def encode_header(chain: Chain, k: int, seq: int, used: int) -> bytes:
    """Extent ``k``'s header of ``chain`` (the name in extent 0's only)."""
    name = chain.name.encode("ascii") if k == 0 else b""
    head = HEAD.pack(HEAD_MAGIC, VERSION, len(name), k, chain.file_id, seq, used, 0) + name
    return head + _CRC.pack(crc32c(head))


def parse_header(raw: bytes, at: int, payload: int, where: str) -> tuple[int, int, int, int, str] | None:
    """(index, file_id, seq, used, name) of an extent header, None when free (zero)."""
    if not any(raw):
        return None
    magic, ver, nlen, index, file_id, seq, used, _r = HEAD.unpack_from(raw, 0)
    end = HEAD.size + nlen
    if magic != HEAD_MAGIC or nlen > MAX_NAME or crc32c(raw[:end]) != _CRC.unpack_from(raw, end)[0]:
        raise FileCorruptionError(where, at, "extent header does not verify (magic or checksum)")
    if ver != VERSION:
        raise FileCorruptionError(where, at, f"unsupported extent-header version {ver}")
    if used > payload:
        raise FileCorruptionError(where, at, f"extent claims {used} bytes of a {payload}-byte payload")
    return index, file_id, seq, used, raw[HEAD.size:end].decode("ascii")


def chains_from(pieces: dict[int, dict[int, Piece]], payload: int, extent_size: int,
                where: str) -> tuple[dict[str, Chain], list[int]]:
    """The files that ``pieces`` (file_id -> index -> (extent, seq, used, name)) describe, and
    the stray extents to free: past a missing index (L3), of a chain without index 0, or of
    the older of two chains naming one file (a rename that replaced it, cut by a crash)."""
    chains: dict[str, Chain] = {}
    stray: list[int] = []
    for file_id, by_index in pieces.items():
        chain = _chain_of(file_id, by_index, stray, payload, extent_size, where)
        if chain is None:
            continue
        other = chains.get(chain.name)
        loser = None if other is None else other if other.seq < chain.seq else chain
        if loser is not chain:
            chains[chain.name] = chain
        if loser is not None:
            stray.extend(loser.extents)
    return chains, stray


def _chain_of(file_id: int, by_index: dict[int, Piece], stray: list[int], payload: int, extent_size: int,
              where: str) -> Chain | None:
    """The chain of indexes 0, 1, ... up to the first missing one (L3); the rest is stray."""
    if 0 not in by_index:
        stray.extend(e for e, *_ in by_index.values())
        return None
    e0, seq, used, name = by_index[0]
    chain = Chain(name, file_id, [e0], used, seq)
    k = 1
    while k in by_index:
        if chain.used != payload:
            raise FileCorruptionError(where, PAGE + chain.extents[-1] * extent_size,
                                  "an extent before the last of its file is not full")
        e, _s, used, _n = by_index[k]
        chain.extents.append(e)
        chain.used = used
        k += 1
    stray.extend(e for i, (e, *_) in by_index.items() if i >= k)
    return chain
