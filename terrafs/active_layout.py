"""What an active file is made of, apart from the open file itself (docs/format/terrafs.md):
its group-commit policy, the header codec, the logical -> physical block index, cutting
appends into blocks, and the buffered window recovery scans read through."""
from __future__ import annotations

import struct
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from catalog.checksum import crc32c
from terrafs.abc import Buffer, DeviceFile
from terrafs.blocks import Codec
from terrafs.errors import FileCorruptionError, TerrafsError
from terrafs.params import FileParams

ACTIVE_MAGIC = b"TRFSACTV"  # part of the format
ACTIVE_VERSION = 1
_FIXED = struct.Struct("<8sHHIQBBHIIHH")  # header fields before key id; 40 bytes
SCAN_WINDOW = 8 << 20


@dataclass(frozen=True, slots=True)
class ActiveConfig:
    """Group-commit policy.

    A flush starts when the buffer holds ``flush_bytes``, or ``flush_ms`` after
    its first waiter. With ``eager`` (the default) it also starts at once when
    no flush is in flight: a lone writer then pays one fdatasync, not the
    timer, while concurrent writers still share flushes — they gather behind
    the one in flight. ``eager=False`` is the seed's pure timer policy (fuller
    pages, more latency).
    """

    flush_bytes: int = 64 * 1024
    flush_ms: float = 2.0
    eager: bool = True


def encode_active_header(p: FileParams) -> bytes:
    kid = p.key_id.encode("ascii")
    total = _FIXED.size + len(kid) + len(p.wrapped_key) + 4
    head = _FIXED.pack(ACTIVE_MAGIC, ACTIVE_VERSION, total, p.inode, p.gen, int(p.codec),
                       1 if p.encrypted else 0, len(kid), p.block_size, p.page_size,
                       len(p.wrapped_key), 0) + kid + p.wrapped_key
    return head + struct.pack("<I", crc32c(head))


def decode_active_header(buf: bytes, where: str) -> tuple[FileParams, int]:
    """Parse the file header; return the params and the header length."""
    if len(buf) < _FIXED.size:
        raise FileCorruptionError(where, 0, "truncated active-file header")
    (magic, ver, total, inode, gen, codec, enc, klen, bsize, psize, wlen,
     _r) = _FIXED.unpack_from(buf, 0)
    if magic != ACTIVE_MAGIC:
        raise FileCorruptionError(where, 0, f"bad active-file magic {magic!r}")
    if ver != ACTIVE_VERSION:
        raise FileCorruptionError(where, 0, f"unsupported active-file version {ver}")
    if total != _FIXED.size + klen + wlen + 4 or len(buf) < total:
        raise FileCorruptionError(where, 0, "truncated or inconsistent active-file header")
    (crc,) = struct.unpack_from("<I", buf, total - 4)
    if crc32c(buf[: total - 4]) != crc:
        raise FileCorruptionError(where, 0, "active-file header checksum mismatch")
    kid = buf[_FIXED.size : _FIXED.size + klen].decode("ascii")
    wrapped = bytes(buf[_FIXED.size + klen : _FIXED.size + klen + wlen])
    try:
        params = FileParams(inode, gen, Codec(codec), bsize, psize, kid, wrapped)
    except (ValueError, TerrafsError) as e:
        raise FileCorruptionError(where, 0, f"bad active-file header field: {e}") from e
    if bool(enc) != params.encrypted:
        raise FileCorruptionError(where, 0, "encryption flag disagrees with key fields")
    return params, total


class BlockIndex:
    """Logical -> physical map of a file's data blocks, in growing numpy arrays."""

    def __init__(self) -> None:
        self.n = 0
        self._cap = 256
        self.logical = np.zeros(self._cap, np.int64)
        self.physical = np.zeros(self._cap, np.int64)
        self.raw_len = np.zeros(self._cap, np.int32)
        self.starts: list[int] = []  # ``logical`` as a list: bisect beats numpy for one lookup

    def add(self, logical: int, physical: int, raw_len: int) -> None:
        if self.n == self._cap:
            self._cap *= 2
            for name in ("logical", "physical", "raw_len"):
                arr = getattr(self, name)
                grown = np.zeros(self._cap, arr.dtype)
                grown[: self.n] = arr[: self.n]
                setattr(self, name, grown)
        self.logical[self.n], self.physical[self.n], self.raw_len[self.n] = logical, physical, raw_len
        self.starts.append(logical)
        self.n += 1

    def find(self, offset: int) -> int:
        """Index of the block holding logical ``offset``."""
        return bisect_right(self.starts, offset) - 1


def cut_blocks(batch: Sequence[Buffer], size: int) -> Iterator[tuple[list[memoryview], int]]:
    """Split appends into blocks of at most ``size`` bytes: yields (pieces, length)."""
    pieces: list[memoryview] = []
    n = 0
    for data in batch:
        view = memoryview(data)
        while view:
            take = view[: size - n]
            pieces.append(take)
            n += len(take)
            view = view[len(take) :]
            if n == size:
                yield pieces, n
                pieces, n = [], 0
    if pieces:
        yield pieces, n


class ScanWindow:
    """Sequential reads over a device file through a large buffer (recovery scans)."""

    def __init__(self, f: DeviceFile, size: int):
        self._f, self._size = f, size
        self._base, self._buf = 0, b""

    async def get(self, pos: int, n: int) -> bytes:
        if pos < self._base or pos + n > self._base + len(self._buf):
            want = max(n, SCAN_WINDOW)
            self._buf = await self._f.pread(pos, min(want, max(self._size - pos, 0)))
            self._base = pos
        lo = pos - self._base
        return self._buf[lo : lo + n]
