"""Durability helpers shared by every package that writes local files (catalog is the lowest
layer, so the others import from here)."""
from __future__ import annotations

import os


def fsync_dir(path: str) -> None:
    """fsync a directory so a create/rename/delete in it survives power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
