"""In-memory catalog over the shared state machine (tests; the reference model)."""
from __future__ import annotations

import abc
from typing import Callable, Sequence

from catalog.abc import Catalog, Check, Entry, Op, TxnResult
from catalog.errors import CatalogUnavailableError
from catalog.state import CatalogState, validate_txn


class StateReads(Catalog):
    """Reads served from a local :class:`CatalogState` (memory, trkv://; Raft's stale reads)."""

    @abc.abstractmethod
    def _st(self) -> CatalogState:
        """The state, once the backend says it may be read (open, not failed)."""

    async def get(self, key: str) -> Entry | None:
        return self._st().get(key)

    async def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        st = self._st()
        return {k: e for k in keys if (e := st.get(k)) is not None}

    async def scan(self, prefix: str = "", *, start: str | None = None, end: str | None = None,
                   limit: int | None = None, reverse: bool = False) -> list[Entry]:
        return self._st().scan(prefix, start, end, limit, reverse)

    async def outcome(self, request_id: str) -> TxnResult | None:
        return self._st().outcome(request_id)

    async def revision(self) -> int:
        return self._st().revision


class MemoryCatalog(StateReads):
    def __init__(self, uri: str = "memory://catalog", request_ids: Callable[[], str] | None = None):
        """``request_ids``: where ``request_id`` draws (default: random UUIDs)."""
        self.uri, self._request_ids = uri, request_ids
        self.state = CatalogState()
        self._closed = False

    def request_id(self) -> str:
        return self._request_ids() if self._request_ids is not None else super().request_id()

    def _st(self) -> CatalogState:
        if self._closed:
            raise CatalogUnavailableError(f"{self.uri} is closed")
        return self.state

    async def open(self) -> None:
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    async def txn(self, checks: Sequence[Check] = (), ops: Sequence[Op] = (), *,
                  request_id: str | None = None) -> TxnResult:
        st = self._st()
        validate_txn(checks, ops, request_id)
        return st.apply(checks, ops, request_id)
