"""A node's durable block device on a local disk: active files (``files/*.act``) on the log
device (one ``fdatasync`` for all of them, RFC 0011), every other file an ordinary file of the
folder. Active files written before the log device existed (an older data folder) stay where
they are: opened, recovered, sealed and deleted there; new ones go to the log device."""
from __future__ import annotations

from terrafs.abc import BlockDevice, DeviceFile
from terrafs.backends.local import LocalBlockDevice
from terrafs.backends.logdev import LogDevice
from terrafs.errors import AlreadyExistsError, FileNotFoundInDeviceError, StorageIOError

LOG_NAME = "logdev"  # the log device's file in the folder (never listed as a file of the device)
_HIDDEN = {LOG_NAME, LOG_NAME + ".new"}


def on_log(name: str) -> bool:
    return name.startswith("files/") and name.endswith(".act")


class LoggedBlockDevice(BlockDevice):
    durable = True

    def __init__(self, plain: LocalBlockDevice, log: LogDevice | None = None, read_only: bool = False):
        self.plain = plain
        # active files find their own end (zeros past their last group): no size kept per group
        self.log = log or LogDevice(f"{plain.root}/{LOG_NAME}", read_only=read_only, exact_sizes=False)
        self.uri = plain.uri

    async def create(self, name: str) -> DeviceFile:
        if on_log(name):
            if await self.plain.exists(name):  # one name, one file: an older one is still here
                raise AlreadyExistsError(f"{self.uri}/{name} exists")
            return await self.log.create(name)
        return await self.plain.create(name)

    async def _which(self, name: str) -> BlockDevice:
        if on_log(name) and await self.log.exists(name):
            return self.log
        return self.plain

    async def open(self, name: str) -> DeviceFile:
        if name in _HIDDEN:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        return await (await self._which(name)).open(name)

    async def delete(self, name: str) -> None:
        if name in _HIDDEN:
            raise FileNotFoundInDeviceError(f"{self.uri}/{name} not found")
        await (await self._which(name)).delete(name)

    async def rename(self, src: str, dst: str) -> None:
        if on_log(src) or on_log(dst) or src in _HIDDEN or dst in _HIDDEN:
            raise StorageIOError(f"{self.uri}: active files are not renamed ({src} -> {dst})")
        await self.plain.rename(src, dst)

    async def list(self, prefix: str = "") -> list[str]:
        plain = [n for n in await self.plain.list(prefix) if n not in _HIDDEN]
        return sorted(set(plain) | set(await self.log.list(prefix)))

    async def exists(self, name: str) -> bool:
        if name in _HIDDEN:
            return False
        return (on_log(name) and await self.log.exists(name)) or await self.plain.exists(name)

    def free_bytes(self) -> int | None:
        return self.log.free_bytes()  # the folder's room plus the log device's free extents

    def fdatasyncs(self) -> int | None:
        return self.log.flushes

    def rounds(self) -> tuple[int, int] | None:
        return self.log.rounds()

    def space(self) -> tuple[int, int] | None:
        return self.log.space()
