"""Exceptions raised by terrafs: storage interfaces and TerrascaleFS.

One hierarchy for the package; the HTTP and CLI edge translates it into the
documented error codes. Corruption errors name the file/object and offset.
"""
from __future__ import annotations

import catalog.errors


class TerrafsError(Exception):
    """Raised for any terrafs failure; the base of this package's errors."""


class ConfigurationError(TerrafsError):
    """Raised when a URI, option or key file is malformed or names an unsupported backend."""


class UnsupportedSchemeError(ConfigurationError):
    """Raised when a URI scheme is known to the design but not supported in this build."""


class NotFoundError(TerrafsError):
    """Raised when a block-device file, object or TerrascaleFS file does not exist."""


class ObjectNotFoundError(NotFoundError):
    """Raised when an object store key does not exist."""


class FileNotFoundInDeviceError(NotFoundError):
    """Raised when a block device has no file of that name."""


class InodeNotFoundError(NotFoundError):
    """Raised when the catalog has no TerrascaleFS file with that inode."""


class AlreadyExistsError(TerrafsError):
    """Raised when creating a block-device file that already exists."""


class TransientStorageError(TerrafsError):
    """Raised when a store failed in a way worth retrying (throttling, timeouts, 5xx)."""


class StorageIOError(TerrafsError):
    """Raised when a store failed permanently (permission, bad request, disk error)."""


class FileCorruptionError(TerrafsError, catalog.errors.CorruptionError):
    """Raised when a file's or object's bytes fail a checksum, magic or invariant check
    (``where``: the file or object; ``offset``: the byte position)."""


class EncryptionKeyError(TerrafsError):
    """Raised when data is encrypted and the key is missing, wrong, or cannot unwrap it."""


class FileStateError(TerrafsError):
    """Raised when an operation does not fit a file's state (append to sealed, etc.)."""


class DeviceError(FileStateError):
    """Raised when the block device failed a write or an fdatasync of a file (EIO): nothing in
    the group was acknowledged; the file takes no appends until it is cut back to its last
    durable group once the device works again (a replicated partition led there steps down at
    once). Not our bug, and not the data's: the edge answers 503."""


def failed_error(what: str, cause: BaseException) -> TerrafsError:
    """The error for an append or flush of a file whose group failed with ``cause``: of the
    same kind (a disk error, a leader no longer leading: both 503 at the edge), else a
    FileStateError."""
    if isinstance(cause, (OSError, DeviceError)):
        return DeviceError(f"{what}: the block device failed: {cause}")
    if isinstance(cause, MirrorError):
        return MirrorError(f"{what}: {cause}")
    return FileStateError(f"{what}: {cause}")


class ClosedError(TerrafsError):
    """Raised when using a file, device or store after close()."""


class CatalogConflictError(TerrafsError):
    """Raised when a catalog transaction kept losing its compare-version checks."""


class NoSpaceError(TerrafsError):
    """Raised when the block device is full (ENOSPC, EDQUOT). The write group that hit it is
    not durable and nothing in it was acknowledged; the file takes no appends until it is
    cut back to its durable end (``ActiveFile.close``, then reopened) once space returns."""


def no_space(e: BaseException) -> "NoSpaceError | None":
    """``e`` as a NoSpaceError when it is a full device's OSError, else None."""
    import errno

    if isinstance(e, NoSpaceError):
        return e
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(f"the block device is full: {e.strerror or e}")
    return None


class MirrorError(TerrafsError):
    """Raised when an active file's mirror (a partition's replication to its followers)
    refuses a write group for good: this node is no longer the partition's leader (fenced
    by a newer epoch). The file fails like after a failed fdatasync; nothing in the group
    was acknowledged."""
