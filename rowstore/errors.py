"""Exceptions raised by the row store."""


class RowstoreError(Exception):
    """Raised for any row-store failure; the base of this package's errors."""


class SchemaError(RowstoreError):
    """Raised when a schema, type name or schema change is invalid."""


class RowValidationError(RowstoreError):
    """Raised when rows do not fit their schema (missing key, wrong type, unknown column)."""


class InvalidKeyError(RowValidationError):
    """Raised when a primary key does not fit its column's type (out of range, wrong type,
    over the key size limit, not canonical); the message names the key."""


class RowCorruptionError(RowstoreError):
    """Raised when encoded rows fail an invariant; names where and at which offset."""

    def __init__(self, where: str, offset: int | None, reason: str):
        self.where, self.offset, self.reason = where, offset, reason
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"corruption in {where}{at}: {reason}")


class TableNotFoundError(RowstoreError):
    """Raised when a table does not exist (at the time asked about)."""


class TableExistsError(RowstoreError):
    """Raised when creating a table whose name is taken."""


class ConflictError(RowstoreError):
    """Raised when a concurrent change won a race (retry the operation)."""


class QueryError(RowValidationError):
    """Raised when a query's predicates, columns or limits are invalid."""


class FutureTimestampError(RowstoreError):
    """Raised when a read asks for a timestamp the cluster has not closed yet."""


class HistoryPurgedError(RowstoreError):
    """Raised when a read asks for a timestamp before the retention horizon."""


class UnavailableError(RowstoreError):
    """Raised when the data asked for cannot be served now (not recovered, closed)."""
