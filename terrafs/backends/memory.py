"""In-memory block device and object store.

For unit tests and as the reference model. The block device remembers which
bytes were synced, so ``crash()`` can drop (or tear) everything written after
the last ``sync()`` — a real crash, not a mock of one — and can fail every write
and sync with EIO (``broken``) or ENOSPC (``capacity``), as a failing or full disk
does.
"""
from __future__ import annotations

import errno
import random

from terrafs.abc import BlockDevice, Buffer, DeviceFile, ObjectInfo, ObjectStore, check_name
from terrafs.errors import (
    AlreadyExistsError,
    ClosedError,
    FileNotFoundInDeviceError,
    ObjectNotFoundError,
)


class _MemData:
    __slots__ = ("buf", "synced")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.synced = 0  # bytes known durable


class MemoryDeviceFile(DeviceFile):
    def __init__(self, name: str, data: _MemData, dev: "MemoryBlockDevice | None" = None):
        self.name = name
        self._d = data
        self._closed = False
        self._dev, self._gen = dev, dev.generation if dev is not None else 0

    def _check(self) -> _MemData:
        if self._closed:
            raise ClosedError(f"file {self.name} is closed")
        if self._dev is not None and self._dev.generation != self._gen:
            raise ClosedError(f"file {self.name} was opened before a crash (its process is gone)")
        return self._d

    async def append(self, data: Buffer) -> int:
        d = self._check()
        self._fail_if_broken()
        off = len(d.buf)
        room = self._dev.free_bytes() if self._dev is not None else None
        if room is not None and len(data) > room:
            d.buf += bytes(memoryview(data)[:room])  # a short write, as a full disk gives
            raise OSError(errno.ENOSPC, "No space left on device")
        d.buf += data
        return off

    async def pread(self, offset: int, length: int) -> bytes:
        return bytes(self._check().buf[offset : offset + length])

    async def truncate(self, size: int) -> None:
        d = self._check()
        self._fail_if_broken()
        del d.buf[size:]
        d.synced = min(d.synced, size)

    async def sync(self) -> None:
        d = self._check()
        self._fail_if_broken()
        d.synced = len(d.buf)

    def _fail_if_broken(self) -> None:
        if self._dev is not None and self._dev.broken:
            raise OSError(errno.EIO, "Input/output error")

    def size(self) -> int:
        return len(self._d.buf)

    async def close(self) -> None:
        self._closed = True


class MemoryBlockDevice(BlockDevice):
    def __init__(self, uri: str = "memory://block", durable: bool = True, capacity: int | None = None):
        self.uri = uri
        self.durable = durable
        self.capacity = capacity  # bytes; a write past it stores what fits and fails with ENOSPC
        self.broken = False  # while set, every write and sync fails with EIO (a failing disk)
        self._files: dict[str, _MemData] = {}
        self.generation = 0  # bumped by crash(): handles from before it are dead

    async def create(self, name: str) -> DeviceFile:
        check_name(name)
        if self.broken:
            raise OSError(errno.EIO, "Input/output error")
        if name in self._files:
            raise AlreadyExistsError(f"{self.uri}/{name} exists")
        self._files[name] = _MemData()
        return MemoryDeviceFile(name, self._files[name], self)

    async def open(self, name: str) -> DeviceFile:
        try:
            return MemoryDeviceFile(name, self._files[check_name(name)], self)
        except KeyError:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found") from None

    async def delete(self, name: str) -> None:
        if self._files.pop(name, None) is None:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")

    async def rename(self, src: str, dst: str) -> None:
        check_name(dst)
        try:
            self._files[dst] = self._files.pop(src)
        except KeyError:
            raise FileNotFoundInDeviceError(f"{self.uri}/{src} not found") from None

    async def list(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._files if n.startswith(prefix))

    async def exists(self, name: str) -> bool:
        return name in self._files

    def used(self) -> int:
        return sum(len(d.buf) for d in self._files.values())

    def free_bytes(self) -> int | None:
        if self.capacity is None:
            return None
        return max(self.capacity - self.used(), 0)

    def crash(self, tear_seed: int | None = None) -> None:
        """Lose every unsynced byte, as power loss would.

        With ``tear_seed``, keep a random prefix of the unsynced tail and
        garble a random byte of what was kept (a torn write).
        """
        rng = random.Random(tear_seed)
        self.generation += 1
        for d in self._files.values():
            keep = d.synced
            if tear_seed is not None and len(d.buf) > d.synced:
                keep = rng.randint(d.synced, len(d.buf))
                if keep > d.synced and rng.random() < 0.5:
                    i = rng.randrange(d.synced, keep)
                    d.buf[i] ^= 0xFF
            del d.buf[keep:]
            d.synced = len(d.buf)


class MemoryObjectStore(ObjectStore):
    def __init__(self, uri: str = "memory://objects"):
        self.uri = uri
        self._objs: dict[str, bytes] = {}

    async def put(self, key: str, data: Buffer) -> ObjectInfo:
        self._objs[check_name(key)] = bytes(data)
        return ObjectInfo(key, len(data))

    async def get(self, key: str) -> bytes:
        try:
            return self._objs[key]
        except KeyError:
            raise ObjectNotFoundError(f"{self.uri}/{key} not found") from None

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return (await self.get(key))[offset : offset + length]

    async def head(self, key: str) -> ObjectInfo:
        return ObjectInfo(key, len(await self.get(key)))

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        return [ObjectInfo(k, len(v)) for k, v in sorted(self._objs.items()) if k.startswith(prefix)]

    async def delete(self, key: str) -> None:
        self._objs.pop(key, None)
