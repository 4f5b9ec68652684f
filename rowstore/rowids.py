"""Rowids: ``segid << 32 | localid`` (docs/format/segment.md), and the rowid that marks a
deletion in the key index. Both are part of the on-disk formats."""
from __future__ import annotations

import numpy as np

TOMBSTONE = np.uint64(2**64 - 1)  # the rowid of a deletion (part of the run format)


def rowids(segid: int, localids: np.ndarray) -> np.ndarray:
    return (np.uint64(segid) << np.uint64(32)) | localids.astype(np.uint64)


def split_rowids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, np.uint64)
    return (ids >> np.uint64(32)).astype(np.uint32), (ids & np.uint64(0xFFFFFFFF)).astype(np.uint32)
