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


class CatalogCorruptionError(CatalogError):
    """Raised when a catalog log or snapshot fails a checksum before its tail."""

    def __init__(self, where: str, offset: int | None, reason: str):
        self.where, self.offset, self.reason = where, offset, reason
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"catalog corruption in {where}{at}: {reason}")


class InvalidTransactionError(CatalogError):
    """Raised when a transaction is malformed (bad key, oversized value, duplicate key)."""
