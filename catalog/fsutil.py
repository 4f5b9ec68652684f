"""Durability helpers shared by every package that writes local files (catalog is the lowest
layer, so the others import from here)."""
from __future__ import annotations

import fcntl
import os

from catalog.errors import CatalogUnavailableError


def fsync_dir(path: str) -> None:
    """fsync a directory so a create/rename/delete in it survives power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def lock_dir(path: str, busy: str) -> int:
    """Create ``path`` if needed and take its ``LOCK`` file exclusively (one process per store);
    returns the fd that holds the lock. ``busy`` is the message when another process holds it."""
    os.makedirs(path, exist_ok=True)
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CatalogUnavailableError(busy) from None
    return fd
