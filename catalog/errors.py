"""Exceptions raised by catalog backends (local log, Raft)."""
from __future__ import annotations


class CatalogError(Exception):
    """Raised for any catalog failure; the base of this package's errors."""


class CatalogConfigError(CatalogError):
    """Raised when a catalog URI or option is malformed."""


class CatalogUnavailableError(CatalogError):
    """Raised when the catalog cannot answer now (no quorum, closed, no leader)."""


class CatalogTimeoutError(CatalogUnavailableError):
    """Raised when a call timed out; a transaction's outcome is then unknown
    until ``outcome(request_id)`` is asked (it may still commit)."""


class CorruptionError(Exception):
    """Stored bytes failed a checksum, magic or invariant check — the one corruption class.

    Every layer's corruption error derives from it (the catalog's below, terrafs' and the row
    store's in their packages), so fsck and the HTTP edge read ``where`` (the file, object or
    segment), ``offset`` (the byte position, or None) and ``reason`` from any of them. It
    lives here because the catalog is the layer every other one imports.
    """

    def __init__(self, where: str, offset: int | None, reason: str):
        self.where, self.offset, self.reason = where, offset, reason
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"corruption in {where}{at}: {reason}")


class CatalogCorruptionError(CatalogError, CorruptionError):
    """Raised when a catalog log or snapshot fails a checksum before its tail."""


class InvalidTransactionError(CatalogError):
    """Raised when a transaction is malformed (bad key, oversized value, duplicate key)."""
