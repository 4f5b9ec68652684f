"""URI scheme -> backend table (pyiceberg's SCHEMA_TO_FILE_IO pattern).

One table says which scheme opens which kind of store. Schemes from the
design that this build does not implement answer with a clear error.
Options travel as query parameters (``?endpoint_url=...&region=...``).
"""
from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Unpack
from urllib.parse import urlsplit

from terrafs.abc import BlockDevice, ObjectStore
from terrafs.errors import ConfigurationError, UnsupportedSchemeError

if TYPE_CHECKING:
    from catalog.abc import Catalog
    from catalog.raft.catalog import RaftOptions


class StoreKind(str, enum.Enum):
    BLOCK = "block device"
    OBJECT = "object store"
    CATALOG = "catalog"


# scheme -> kinds it can open in this build
SCHEMES: dict[str, frozenset[StoreKind]] = {
    "trfs": frozenset({StoreKind.BLOCK, StoreKind.OBJECT}),
    "trkv": frozenset({StoreKind.CATALOG}),
    "trs3": frozenset({StoreKind.OBJECT}),
    "memory": frozenset({StoreKind.BLOCK, StoreKind.OBJECT, StoreKind.CATALOG}),
    "raft": frozenset({StoreKind.CATALOG}),
}
# schemes of the design that need a cloud this build does not talk to
UNSUPPORTED = {
    "trec2": "Amazon EC2 block storage", "trmd": "Azure Managed Disk",
    "trpgblob": "Azure page blobs", "trblob": "Azure Blob Storage",
    "trdyn": "Amazon DynamoDB", "trtab": "Azure Table Storage",
}


def local_path(uri: str) -> str:
    """Filesystem path of a ``trfs://``/``trkv://`` URI.

    ``scheme:///abs/dir`` is absolute; ``scheme://./rel/dir`` (or any other
    netloc) is relative to the working directory.
    """
    parts = urlsplit(uri)
    if parts.query:
        raise ConfigurationError(f"{uri}: {parts.scheme}:// takes no options ({parts.query})")
    if parts.netloc:
        path = parts.netloc + parts.path
    else:
        path = parts.path
    if not path:
        raise ConfigurationError(f"{uri}: no path")
    return path


def _scheme(uri: str, kind: StoreKind) -> str:
    scheme = urlsplit(uri).scheme
    if scheme in UNSUPPORTED:
        raise UnsupportedSchemeError(
            f"{uri}: {scheme}:// ({UNSUPPORTED[scheme]}) is not supported in this build")
    if scheme not in SCHEMES:
        raise ConfigurationError(f"{uri}: unknown scheme {scheme!r}; expected one of "
                                 f"{', '.join(s for s, k in SCHEMES.items() if kind in k)}")
    if kind not in SCHEMES[scheme]:
        raise ConfigurationError(f"{uri}: {scheme}:// is not a {kind.value}")
    return scheme


def open_block_device(uri: str, durable: bool = True, read_only: bool = False) -> BlockDevice:
    """The device at ``uri``; ``read_only``: for a checker beside a running node (the log
    device is opened without creating, freeing or writing anything)."""
    scheme = _scheme(uri, StoreKind.BLOCK)
    if scheme == "memory":
        from terrafs.backends.memory import MemoryBlockDevice

        return MemoryBlockDevice(uri, durable)
    from terrafs.backends.local import LocalBlockDevice

    plain = LocalBlockDevice(local_path(uri), durable, uri=uri)
    if not durable:
        return plain
    from terrafs.backends.logged import LoggedBlockDevice

    return LoggedBlockDevice(plain, read_only=read_only)  # active files on the log device (RFC 0011)


def open_object_store(uri: str) -> ObjectStore:
    scheme = _scheme(uri, StoreKind.OBJECT)
    if scheme == "memory":
        from terrafs.backends.memory import MemoryObjectStore

        return MemoryObjectStore(uri)
    if scheme == "trs3":
        from terrafs.backends.s3 import S3ObjectStore

        return S3ObjectStore.from_uri(uri)
    from terrafs.backends.local import LocalObjectStore

    return LocalObjectStore(local_path(uri), uri=uri)


def open_catalog(uri: str, *, secret_file: str | None = None, dir: str | None = None,
                 **raft_options: Unpack[RaftOptions]) -> Catalog:
    """A catalog backend for ``uri`` (not yet opened: call ``await c.open()``).

    ``raft://`` also needs the cluster secret file and its directory (``[catalog]``
    ``secret_file`` and ``dir``); other schemes ignore them (and ``raft_options``,
    passed to ``RaftCatalog``).
    """
    scheme = _scheme(uri, StoreKind.CATALOG)
    if scheme == "memory":
        from catalog.memory import MemoryCatalog

        return MemoryCatalog()
    if scheme == "raft":
        from catalog.errors import CatalogConfigError
        from catalog.raft import RaftCatalog

        try:
            return RaftCatalog.from_uri(uri, secret_file=secret_file, dir=dir, **raft_options)
        except CatalogConfigError as e:
            raise ConfigurationError(str(e)) from e
    from catalog.local import LocalCatalog

    return LocalCatalog(os.path.abspath(local_path(uri)))
