"""Fault-injecting wrappers around real stores (Pebble's errorfs pattern).

They wrap a working backend and fail chosen calls: the Nth call of an
operation, or every call with a seeded probability, so a failing case
replays. Used by the fault tests; nothing in production constructs them.
"""
from __future__ import annotations

import random
from typing import AsyncIterable, TypedDict, Unpack

from terrafs.abc import BlockDevice, Buffer, DeviceFile, ObjectInfo, ObjectStore
from terrafs.errors import StorageIOError, TransientStorageError


class InjectedFault(StorageIOError):
    """Raised by a wrapper instead of calling the real store."""


class Plan(TypedDict, total=False):
    """Which calls a wrapper fails (the arguments of ``_Plan``)."""

    nth: dict[str, int] | None
    probability: float
    seed: int
    ops: tuple[str, ...]
    transient: bool


class _Plan:
    """Decides which calls fail: ``nth[op] = n`` fails the n-th call (1-based) of ``op``."""

    def __init__(self, nth: dict[str, int] | None = None, probability: float = 0.0,
                 seed: int = 0, ops: tuple[str, ...] = (), transient: bool = False):
        self.nth = dict(nth or {})
        self.counts: dict[str, int] = {}
        self.p, self.rng, self.ops, self.transient = probability, random.Random(seed), ops, transient

    def check(self, op: str, what: str) -> None:
        n = self.counts[op] = self.counts.get(op, 0) + 1
        hit = self.nth.get(op) == n or (self.p and op in self.ops and self.rng.random() < self.p)
        if hit:
            cls = TransientStorageError if self.transient else InjectedFault
            raise cls(f"injected fault: {op} #{n} of {what}")


class FaultyObjectStore(ObjectStore):
    def __init__(self, inner: ObjectStore, **plan: Unpack[Plan]):
        self.inner, self.plan, self.uri = inner, _Plan(**plan), inner.uri

    async def put(self, key: str, data: Buffer) -> ObjectInfo:
        self.plan.check("put", key)
        return await self.inner.put(key, data)

    async def put_stream(self, key: str, chunks: AsyncIterable[bytes]) -> ObjectInfo:
        self.plan.check("put", key)
        return await self.inner.put_stream(key, chunks)

    async def get(self, key: str) -> bytes:
        self.plan.check("get", key)
        return await self.inner.get(key)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.plan.check("get", key)
        return await self.inner.get_range(key, offset, length)

    async def head(self, key: str) -> ObjectInfo:
        self.plan.check("head", key)
        return await self.inner.head(key)

    async def list(self, prefix: str = "") -> list[ObjectInfo]:
        self.plan.check("list", prefix)
        return await self.inner.list(prefix)

    async def delete(self, key: str) -> None:
        self.plan.check("delete", key)
        await self.inner.delete(key)


class _FaultyFile(DeviceFile):
    def __init__(self, inner: DeviceFile, plan: _Plan):
        self.inner, self.plan, self.name = inner, plan, inner.name

    async def append(self, data: Buffer) -> int:
        self.plan.check("append", self.name)
        return await self.inner.append(data)

    async def pread(self, offset: int, length: int) -> bytes:
        self.plan.check("pread", self.name)
        return await self.inner.pread(offset, length)

    async def truncate(self, size: int) -> None:
        await self.inner.truncate(size)

    async def sync(self) -> None:
        self.plan.check("sync", self.name)
        await self.inner.sync()

    def size(self) -> int:
        return self.inner.size()

    async def close(self) -> None:
        await self.inner.close()


class FaultyBlockDevice(BlockDevice):
    def __init__(self, inner: BlockDevice, **plan: Unpack[Plan]):
        self.inner, self.plan = inner, _Plan(**plan)
        self.uri, self.durable = inner.uri, inner.durable

    async def create(self, name: str) -> DeviceFile:
        self.plan.check("create", name)
        return _FaultyFile(await self.inner.create(name), self.plan)

    async def open(self, name: str) -> DeviceFile:
        return _FaultyFile(await self.inner.open(name), self.plan)

    async def delete(self, name: str) -> None:
        await self.inner.delete(name)

    async def rename(self, src: str, dst: str) -> None:
        await self.inner.rename(src, dst)

    async def list(self, prefix: str = "") -> list[str]:
        return await self.inner.list(prefix)

    async def exists(self, name: str) -> bool:
        return await self.inner.exists(name)

    def free_bytes(self) -> int | None:
        return self.inner.free_bytes()
