"""One node's view of the shared catalog and object store, with faults of its own: in a cluster
the catalog is a Raft group and the object store a service, each reached over a node's own
network path, so one node may be cut off from them while the others are not.

``NodeCatalog`` stalls (the node reaches no catalog member), fails its calls at once
(``CatalogUnavailableError``: no leader known to it), or applies a transaction and loses the
answer (``CatalogTimeoutError``: the caller learns the outcome by request id,
``terrafs.catalog_ops.commit``). ``NodeObjects`` fails every object-store call of one node
(``TransientStorageError``, as a throttled or unreachable S3 answers). Each window is on the
loop's virtual clock; the world's nemesis opens them (``Faults.node_catalog``,
``Faults.node_objects``) and the heal closes them."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from catalog.abc import Catalog, Check, Entry, Op, TxnResult
from catalog.errors import CatalogTimeoutError, CatalogUnavailableError
from terrafs.abc import ObjectStore
from terrafs.entropy import Entropy
from terrafs.errors import TransientStorageError
from terrafs.faults import FaultyObjectStore


class NodeCatalog(Catalog):
    """``shared`` as node ``name`` sees it."""

    def __init__(self, shared: Catalog, loop: asyncio.AbstractEventLoop, name: str, entropy: Entropy):
        """``entropy``: the node's, which its request ids are drawn from."""
        self.shared, self._loop, self.name, self.entropy = shared, loop, name, entropy
        self.stalled_until = self.failing_until = self.losing_until = 0.0

    def heal(self) -> None:
        self.stalled_until = self.failing_until = self.losing_until = 0.0

    async def _through(self) -> None:
        while self._loop.time() < self.stalled_until:
            await asyncio.sleep(self.stalled_until - self._loop.time())
        if self._loop.time() < self.failing_until:
            raise CatalogUnavailableError(f"{self.name}: no catalog leader reachable (injected)")

    async def open(self) -> None:
        """The shared catalog is opened by the world."""

    async def close(self) -> None:
        """The shared catalog outlives every node."""

    async def get(self, key: str) -> Entry | None:
        await self._through()
        return await self.shared.get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        await self._through()
        return await self.shared.get_many(keys)

    async def scan(self, prefix: str = "", *, start: str | None = None, end: str | None = None,
                   limit: int | None = None, reverse: bool = False) -> list[Entry]:
        await self._through()
        return await self.shared.scan(prefix, start=start, end=end, limit=limit, reverse=reverse)

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        await self._through()
        res = await self.shared.txn(checks, ops, request_id=request_id)
        if self._loop.time() < self.losing_until:
            raise CatalogTimeoutError(f"{self.name}: the catalog's answer was lost (injected; applied)")
        return res

    def request_id(self) -> str:
        return self.entropy.uuid_hex()

    async def outcome(self, request_id: str) -> TxnResult | None:
        await self._through()
        return await self.shared.outcome(request_id)

    async def revision(self) -> int:
        await self._through()
        return await self.shared.revision()


class _Window:
    """The ``_Plan`` of a ``FaultyObjectStore``: every call fails while the window is open."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str):
        self._loop, self.name, self.failing_until = loop, name, 0.0

    def check(self, op: str, what: str) -> None:
        if self._loop.time() < self.failing_until:
            raise TransientStorageError(f"{self.name}: object store unreachable (injected): {op} {what}")


class NodeObjects(FaultyObjectStore):
    """``shared`` as node ``name`` sees it."""

    def __init__(self, shared: ObjectStore, loop: asyncio.AbstractEventLoop, name: str):
        super().__init__(shared)
        self.window = _Window(loop, name)
        self.plan = self.window  # type: ignore[assignment]  # the same check() the wrapper calls
