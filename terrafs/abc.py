"""Storage interfaces: block devices and object stores (catalogs: ``catalog.abc``).

These give abstract semantics only; checksums, compression and encryption
live in TerrascaleFS above them (``terrafs.blocks``). Every backend runs
the conformance suites in ``tests/terrafs/conformance.py``.

Blocking I/O never runs on the event loop: local backends call
``asyncio.to_thread``; the S3 backend is natively async (aiobotocore).
"""
from __future__ import annotations

import abc
import asyncio
import builtins
from dataclasses import dataclass
from typing import AsyncIterable, Callable, Protocol, Sequence, Union

from terrafs.errors import NotFoundError

Buffer = Union[bytes, bytearray, memoryview]


class DeviceFile(abc.ABC):
    """An open file on a block device. One writer; reads may be concurrent."""

    name: str

    @abc.abstractmethod
    async def append(self, data: Buffer) -> int:
        """Write ``data`` at the end; return the offset it starts at. Not durable until sync()."""

    @abc.abstractmethod
    async def pread(self, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` (short at end of file)."""

    @abc.abstractmethod
    async def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (durable after sync())."""

    @abc.abstractmethod
    async def sync(self) -> None:
        """Make every earlier append/truncate durable (fdatasync on local disks)."""

    @abc.abstractmethod
    def size(self) -> int:
        """Current size in bytes, including unsynced appends."""

    async def append_durable(self, build: Callable[[int], Sequence[Buffer]]) -> tuple[int, int]:
        """Append the buffers ``build(offset)`` returns and make them durable, as one step.

        Returns (offset, length). Local disks run ``build``, the write and the
        fdatasync in one worker-thread hop (a group commit's whole flush);
        ``build`` must therefore be thread-safe with respect to its inputs.
        """
        off = self.size()
        data = b"".join(build(off))
        await self.append(data)
        await self.sync()
        return off, len(data)

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the handle; unsynced data may be lost on a crash after this."""


class InPlaceFile(Protocol):
    """A DeviceFile that also writes at an offset and flushes, blocking, from a worker thread
    (local disks, the log device): an active file writes its groups in place through it."""

    def writev_sync(self, parts: Sequence[Buffer], offset: int) -> int:
        """Write ``parts`` back to back at ``offset``; the bytes written."""

    def fdatasync_sync(self) -> None:
        """Make every write so far durable."""


class BlockDevice(abc.ABC):
    """A node-private file system: durable (write-ahead data) or volatile (cache, spill).

    Names are relative paths of ``[A-Za-z0-9._-]`` parts separated by ``/``.
    create/rename/delete are durable on return on a durable device (the
    directory is fsync'd).
    """

    uri: str
    durable: bool

    @abc.abstractmethod
    async def create(self, name: str) -> DeviceFile:
        """Create an empty file; AlreadyExistsError if it exists."""

    @abc.abstractmethod
    async def open(self, name: str) -> DeviceFile:
        """Open an existing file for reading and appending."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Remove a file; FileNotFoundInDeviceError if absent."""

    @abc.abstractmethod
    async def rename(self, src: str, dst: str) -> None:
        """Atomically rename, replacing ``dst`` if it exists."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> list[str]:
        """Names of files starting with ``prefix``, sorted."""

    @abc.abstractmethod
    async def exists(self, name: str) -> bool:
        """Whether a file of that name exists."""

    def free_bytes(self) -> int | None:
        """Bytes an unprivileged writer can still use on the device; None when unknown."""
        return None

    def fdatasyncs(self) -> int | None:
        """How many fdatasyncs made this device's files durable so far; None when it does not
        count them (one per flush of each file: the active files' flush counters say it)."""
        return None

    def rounds(self) -> tuple[int, int] | None:
        """(device rounds run, write groups they carried) when the device batches its files'
        groups into rounds (``terrafs/rounds.py``); None when each file flushes alone."""
        return None

    def space(self) -> tuple[int, int] | None:
        """(bytes the device holds on its host, bytes its files use) where it keeps space of its
        own beyond its files (the log device's extents); None otherwise."""
        return None

    async def write_file(self, name: str, data: bytes) -> None:
        """Atomically replace ``name`` with ``data``: temp file, sync, rename."""
        tmp = name + ".tmp"
        if await self.exists(tmp):
            await self.delete(tmp)
        f = await self.create(tmp)
        try:
            await f.append(data)
            if self.durable:
                await f.sync()
        finally:
            await f.close()
        await self.rename(tmp, name)

    async def write_files(self, items: builtins.list[tuple[str, bytes]]) -> None:
        """``write_file`` of each ``(name, data)`` in order; a device may do them all in one
        worker-thread hop (the block cache's disk tier writes blocks in batches)."""
        for name, data in items:
            await self.write_file(name, data)

    async def delete_files(self, names: builtins.list[str]) -> None:
        """``delete`` of each name, one not found skipped; a device may do them all in one
        worker-thread hop (the block cache empties its disk tier at start: thousands of files)."""
        for name in names:
            try:
                await self.delete(name)
            except NotFoundError:
                pass

    async def read_file(self, name: str) -> bytes:
        """Whole contents of ``name``."""
        f = await self.open(name)
        try:
            return await f.pread(0, f.size())
        finally:
            await f.close()

    async def read_files(self, names: builtins.list[str]) -> builtins.list[bytes | None]:
        """``read_file`` of each name, None for one not found; a device may do them all in one
        worker-thread hop (the block cache's disk tier: a row's pages in a columnar segment)."""
        out: builtins.list[bytes | None] = []
        for name in names:
            try:
                out.append(await self.read_file(name))
            except NotFoundError:
                out.append(None)
        return out

    async def close(self) -> None:
        """Release resources."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str = ""


class ObjectStore(abc.ABC):
    """Write-once objects, globally visible; only eventual consistency is promised.

    Keys are ``/``-separated relative paths. ``put`` is atomic: a reader sees
    the whole old object, the whole new one, or none — never a part.
    """

    uri: str

    async def open_store(self) -> None:
        """Connect and check the store answers. Idempotent."""

    @abc.abstractmethod
    async def put(self, key: str, data: Buffer) -> ObjectInfo:
        """Store ``data`` under ``key`` atomically, replacing any old object."""

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes]) -> ObjectInfo:
        """Store the concatenation of ``chunks`` atomically (large objects)."""
        parts = [bytes(c) async for c in chunks]
        return await self.put(key, b"".join(parts))

    @abc.abstractmethod
    async def get(self, key: str) -> bytes:
        """Whole object; ObjectNotFoundError if absent."""

    @abc.abstractmethod
    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (short at the end of the object)."""

    async def get_ranges(self, key: str, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """Several ``(offset, length)`` ranges of one object, requested at once (a backend
        that can serves them in one round trip or one thread hop)."""
        return list(await asyncio.gather(*(self.get_range(key, o, n) for o, n in ranges)))

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectInfo:
        """Size (and etag) of an object; ObjectNotFoundError if absent."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Remove an object; deleting an absent key is not an error."""

    async def close(self) -> None:
        """Release connections."""

    async def __aenter__(self) -> "ObjectStore":
        await self.open_store()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def check_name(name: str) -> str:
    """Validate a device-file name or object key; return it unchanged."""
    from terrafs.errors import ConfigurationError

    if not name or name.startswith("/") or len(name) > 1024:
        raise ConfigurationError(f"invalid name {name!r}")
    for part in name.split("/"):
        if part in ("", ".", "..") or not all(c.isalnum() or c in "._-" for c in part):
            raise ConfigurationError(f"invalid name {name!r}: parts are [A-Za-z0-9._-]+")
    return name
