"""Recovery of an active file after a restart (docs/format/terrafs.md §2): every group
verified from the header on, a torn tail cut, a damaged group followed by a later one
refused as corruption; and the cut of a file whose group failed at the device back to its
last durable group. Mixed into :class:`terrafs.active.ActiveFile`."""
from __future__ import annotations

import logging
import struct

import numpy as np

from catalog.checksum import crc32c
from terrafs.abc import DeviceFile
from terrafs.active_layout import SCAN_WINDOW, BlockIndex, ScanWindow
from terrafs.blocks import BLOCK_MAGIC, HEADER_LEN, BlockHeader, Flags, parse_header
from terrafs.errors import FileCorruptionError, StorageIOError, no_space

log = logging.getLogger("terrafs.active")


class GroupRecovery:
    """The recovery scan of an active file (state: ``_f``, ``_physical_end``, ``index``, ...)."""

    # the active file's state the scan reads and sets (terrafs.active.ActiveFile)
    _f: DeviceFile
    where: str
    index: BlockIndex
    durable_size: int
    torn_tail: tuple[int, int] | None
    _physical_end: int
    _alloc_end: int
    _end: int
    _group: int
    _read_only: bool
    _sealed: bool

    async def cut_back(self, through: DeviceFile | None = None) -> None:
        """Cut a file whose group failed at the device back to its last durable group (a
        reopen then recovers exactly that); StorageIOError or NoSpaceError while the device
        still fails. ``through``: another handle of the same file, when this one is closed."""
        f = through or self._f
        try:
            await f.truncate(self._physical_end)  # 0: the header never became durable
            await f.sync()
        except OSError as e:
            raise no_space(e) or StorageIOError(f"{self.where}: cannot cut back a failed file: {e}") from e

    async def _recover_groups(self) -> None:
        """Scan every group from the header on (see docs/format/terrafs.md §2)."""
        size = self._f.size()
        reader = ScanWindow(self._f, size)
        pos, logical, group = self._physical_end, 0, 0
        while pos < size:
            entries, nxt, nlogical, err = await self._read_group(reader, pos, logical, group + 1)
            if err is not None:
                if not await self._zeros_to_end(reader, pos, size):  # else: preallocated space
                    await self._handle_bad_tail(reader, pos, group + 1, err)
                break
            assert entries is not None  # the group verified
            for e in entries:
                self.index.add(*e)
            pos, logical, group = nxt, nlogical, group + 1
        self._physical_end, self.durable_size, self._end, self._group = pos, logical, logical, group
        self._alloc_end = self._f.size()

    async def _zeros_to_end(self, reader: "ScanWindow", pos: int, size: int) -> bool:
        """Whether every byte from ``pos`` to the end of the file is zero."""
        while pos < size:
            chunk = await reader.get(pos, min(SCAN_WINDOW, size - pos))
            if not chunk or np.frombuffer(chunk, np.uint8).any():
                return False
            pos += len(chunk)
        return True

    async def _read_group(self, reader: "ScanWindow", pos: int, logical: int, group: int,
                          ) -> tuple[list[tuple[int, int, int]] | None, int, int, FileCorruptionError | None]:
        """Verify one group at ``pos``; return (entries, next pos, next logical, error)."""
        entries: list[tuple[int, int, int]] = []
        while True:
            try:
                h, head_pos = await self._verified_block(reader, pos)
            except FileCorruptionError as e:
                return None, pos, logical, e
            if h.group != group or (h.logical_off != logical):
                return None, pos, logical, FileCorruptionError(
                    self.where, head_pos, f"block out of sequence (group {h.group}, expected {group})")
            if not h.flags & Flags.PAD:
                entries.append((logical, head_pos, h.raw_len))
                logical += h.raw_len
            pos += h.record_len
            if h.flags & Flags.END:
                return entries, pos, logical, None

    async def _verified_block(self, reader: "ScanWindow", pos: int) -> tuple[BlockHeader, int]:
        head = await reader.get(pos, HEADER_LEN)
        h = parse_header(head, 0, self.where) if len(head) == HEADER_LEN else None
        if h is None:
            raise FileCorruptionError(self.where, pos, "truncated block header")
        payload = await reader.get(pos + HEADER_LEN, h.stored_len)
        if len(payload) != h.stored_len:
            raise FileCorruptionError(self.where, pos, "block runs past end of file")
        if crc32c(payload) != h.payload_crc:
            raise FileCorruptionError(self.where, pos, "block payload checksum mismatch")
        return h, pos

    async def _handle_bad_tail(self, reader: "ScanWindow", pos: int, group: int,
                               err: FileCorruptionError) -> None:
        later = await self._find_later_group(reader, pos, group)
        if later is not None:
            raise FileCorruptionError(self.where, err.offset,
                                  f"{err.reason}; group {later[1]} at offset {later[0]} follows it")
        size = self._f.size()
        self.torn_tail = (pos, size - pos)
        if self._read_only:
            self._sealed = True  # a read-only open never writes
            return
        log.warning("event=torn_tail file=%s offset=%d dropped_bytes=%d reason=%r",
                    self.where, pos, size - pos, err.reason)
        await self._f.truncate(pos)
        await self._f.sync()

    async def _find_later_group(self, reader: "ScanWindow", pos: int, group: int) -> tuple[int, int] | None:
        """First verifiable block after ``pos`` whose group is later than ``group``."""
        magic = struct.pack("<I", BLOCK_MAGIC)
        size = self._f.size()
        start = pos + 1
        while start < size:
            chunk = await reader.get(start, SCAN_WINDOW + HEADER_LEN)
            i = chunk.find(magic)
            if i < 0:
                start += SCAN_WINDOW
                continue
            try:
                h, at = await self._verified_block(reader, start + i)
                if h.group > group:
                    return at, h.group
            except FileCorruptionError:
                pass
            start += i + 1
        return None
