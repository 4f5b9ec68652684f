"""Exceptions raised by the row store."""
from catalog.errors import CorruptionError


class RowstoreError(Exception):
    """Raised for any row-store failure; the base of this package's errors."""


class SchemaError(RowstoreError):
    """Raised when a schema, type name or schema change is invalid."""


class RowValidationError(RowstoreError):
    """Raised when rows do not fit their schema (missing key, wrong type, unknown column)."""


class InvalidKeyError(RowValidationError):
    """Raised when a primary key does not fit its column's type (out of range, wrong type,
    over the key size limit, not canonical); the message names the key."""


class RowCorruptionError(RowstoreError, CorruptionError):
    """Raised when encoded rows or index runs fail an invariant (``where``, ``offset``)."""


class DanglingRowidError(RowCorruptionError):
    """Raised when an index entry names a row that cannot exist: a segment id with no segment,
    or a localid past its segment's end (``where`` names the table and partition when known)."""

    def __init__(self, where: str, rowid: int, reason: str):
        super().__init__(where, None, f"an index entry names rowid {rowid} (segment {rowid >> 32}, localid "
                                      f"{rowid & 0xFFFFFFFF}): {reason}")
        self.rowid = rowid


class SegmentNotFoundError(RowstoreError):
    """Raised when no segment row has the segment id asked for."""


class TableNotFoundError(RowstoreError):
    """Raised when a table does not exist (at the time asked about)."""


class TableExistsError(RowstoreError):
    """Raised when creating a table whose name is taken."""


class ConflictError(RowstoreError):
    """Raised when a concurrent change won a race (retry the operation)."""


class ReadLeaseExpiredError(ConflictError):
    """Raised when a read lease expired or was released: the collector may have taken its
    segments, so the snapshot cannot be read on; take a new one (not a retry)."""


class QueryError(RowValidationError):
    """Raised when a query's predicates, columns or limits are invalid."""


class FutureTimestampError(RowstoreError):
    """Raised when a read asks for a timestamp the cluster has not closed yet."""


class HistoryPurgedError(RowstoreError):
    """Raised when a read asks for a timestamp before the retention horizon."""


class UnavailableError(RowstoreError):
    """Raised when the data asked for cannot be served now (not recovered, closed)."""


class FencedError(UnavailableError):
    """Raised when a replication message carries an epoch older than one the replica promised
    (``promised``): its sender is no longer the partition's leader."""

    def __init__(self, message: str, promised: int):
        super().__init__(message)
        self.promised = promised


class LeaderAliveError(UnavailableError):
    """Raised when a replica refuses a fence because it heard from the current leader within
    the leader's lease (the leader may still be serving)."""


class ColumnCorruptionError(RowCorruptionError):
    """Raised when a columnar segment's page, statistics or metadata fail an invariant
    (docs/format/segment.md §7); ``where`` names the object, the segment and the column."""


class SubscriptionEndedError(RowstoreError):
    """Raised by a subscription's ``next`` once it ended: ``code`` says why (slow_subscriber,
    schema_changed, table_dropped, stopping, closed, unavailable); its subscriber resumes from
    the last closed timestamp it saw (docs/rfcs/0015-subscriptions.md)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
