"""The History RFC's purge rule over sorted key runs (RFC 0003), used by the key index's level
merges (:mod:`rowstore.index.key_merges`) and GC views (:mod:`rowstore.index.key_index`)."""
from __future__ import annotations

import numpy as np

from rowstore.index.key_memtable import Run
from rowstore.rowids import TOMBSTONE


def purge(run: Run, horizon: int, bottom: bool) -> Run:
    """The History RFC's purge rule, vectorized over a sorted run.

    Keep every version newer than ``horizon`` and, per key, the newest version
    at or below it (what a read at the horizon sees). That one is dropped too
    when it is a deletion — but only at the bottom level, where nothing older
    could resurface from a lower level.
    """
    return purged(run, horizon, bottom)[0]


def purged(run: Run, horizon: int, bottom: bool) -> tuple[Run, np.ndarray]:
    """``purge``, and the rowids of the rows it dropped (tombstones aside): what a merge's
    sources named and its run no longer does, found without comparing the two."""
    if len(run) == 0:
        return run, run.rowids
    old = run.ts <= np.uint64(horizon)
    new_key = np.ones(len(run), bool)
    new_key[1:] = run.keys[1:] != run.keys[:-1]
    prev_new = np.zeros(len(run), bool)
    prev_new[1:] = ~old[:-1]
    first_old = old & (new_key | prev_new)
    keep = ~old | first_old
    if bottom:
        keep &= ~(first_old & (run.rowids == TOMBSTONE))
    gone = run.rowids[~keep]
    return Run(run.keys[keep], run.ts[keep], run.rowids[keep]), gone[gone != TOMBSTONE]


def dropped_rowids(dropped: np.ndarray, merged: Run) -> np.ndarray:
    """Of the rowids a merge's purge ``dropped``, those its ``merged`` run no longer names
    (all of them, unless a source named a row twice)."""
    return np.setdiff1d(dropped, merged.rowids[merged.rowids != TOMBSTONE])
