"""The Catalog interface: a small, strongly consistent, versioned key-value store.

Every backend (in-memory, ``trkv://`` local log, ``raft://``) implements
:class:`Catalog` and passes ``tests/catalog/conformance.py``.

Model (etcd-like):

* Keys are UTF-8 strings ordered by their UTF-8 bytes; values are bytes.
* The catalog has a global ``revision`` that grows by one with every committed
  transaction. An entry's ``version`` is the revision that last wrote it, so
  ``Check(key, version)`` is a compare-and-set; ``Check(key, 0)`` asserts the
  key is absent.
* ``txn(checks, ops, request_id=...)`` is all or nothing. A transaction that
  carries a ``request_id`` is applied at most once: a retry with the same id
  returns the first outcome instead of running again, and ``outcome(id)``
  tells what happened to a call that timed out (Raft: another leader may
  have committed it).
"""
from __future__ import annotations

import abc
import uuid
from dataclasses import dataclass
from typing import Sequence, Union

# Limits keep every transaction well under one Raft entry (pysyncobj breaks at
# 64 KiB, RFC 0005). Part of the interface: every backend enforces them.
MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 16 * 1024
MAX_TXN_BYTES = 48 * 1024
MAX_TXN_OPS = 256
MAX_REQUEST_ID = 64


@dataclass(frozen=True, slots=True)
class Entry:
    """One key as stored: ``version`` is the revision that last wrote it."""

    key: str
    value: bytes
    version: int


@dataclass(frozen=True, slots=True)
class Check:
    """Require ``key`` to be at ``version`` (0 = absent) for the txn to commit."""

    key: str
    version: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key``; deleting an absent key is a no-op."""

    key: str


Op = Union[Put, Delete]


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Outcome of a transaction.

    ``committed`` is False when a check failed; ``conflicts`` then lists the
    keys whose check failed and nothing was written. ``revision`` is the
    revision the txn created (committed) or the one it was evaluated at.
    """

    committed: bool
    revision: int
    conflicts: tuple[str, ...] = ()
    request_id: str | None = None


class Catalog(abc.ABC):
    """Async, strongly consistent key-value store with multi-key transactions."""

    uri: str

    async def open(self) -> None:
        """Recover state and become ready. Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release resources; later calls raise CatalogUnavailableError."""

    @abc.abstractmethod
    async def get(self, key: str) -> Entry | None:
        """Current entry for ``key`` or None (linearizable)."""

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """Entries for the keys that exist, read at one revision."""
        out = {}
        for k in keys:
            e = await self.get(k)
            if e is not None:
                out[k] = e
        return out

    @abc.abstractmethod
    async def scan(
        self,
        prefix: str = "",
        *,
        start: str | None = None,
        end: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[Entry]:
        """Entries whose key starts with ``prefix`` and lies in ``[start, end)``,
        in key order (descending when ``reverse``), at most ``limit`` of them,
        all read at one revision."""

    @abc.abstractmethod
    async def txn(
        self,
        checks: Sequence[Check] = (),
        ops: Sequence[Op] = (),
        *,
        request_id: str | None = None,
    ) -> TxnResult:
        """Apply ``ops`` atomically if every check holds. Durable on return."""

    def request_id(self) -> str:
        """A fresh id for a transaction whose outcome its caller may have to ask for
        (``outcome``); a catalog built for a seeded replay gives seeded ones."""
        return uuid.uuid4().hex

    @abc.abstractmethod
    async def outcome(self, request_id: str) -> TxnResult | None:
        """The remembered outcome of a transaction with this id, or None."""

    @abc.abstractmethod
    async def revision(self) -> int:
        """The current revision (0 for an empty, new catalog)."""

    async def __aenter__(self) -> "Catalog":
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
