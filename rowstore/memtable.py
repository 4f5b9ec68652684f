"""The primary-key index's memory table: key -> versions of (commit_ts, rowid | tombstone).

docs/rfcs/0001-row-index.md. Vectorized throughout: a batch is sorted once
(``np.lexsort``) into an immutable mini-run; mini-runs are consolidated (one
concatenate + lexsort) when there are too many or a read needs one sorted
view. Entries order by key ascending, then commit_ts descending, so the
version visible at T is the first entry of its key with ``ts <= T``.

Keys are numpy arrays whose order is the key order: int64 keys as uint64 with
the sign bit flipped; string and uuid keys as fixed-width bytes (``S``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

TOMBSTONE = np.uint64(2**64 - 1)  # the rowid of a deletion (part of the run format)
_MAX_RUNS = 8


def encode_keys(arr: pa.Array, kind: str) -> np.ndarray:
    """Primary keys as an order-preserving numpy array."""
    if kind == "int64":
        return arr.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64) ^ np.uint64(1 << 63)
    if kind == "uuid":
        return np.frombuffer(arr.buffers()[1], "S16")[arr.offset : arr.offset + len(arr)].copy()
    from rowstore.partitioning import string_keys  # noqa: PLC0415 (partitioning imports numba kernels)

    return string_keys(arr)


def decode_keys(keys: np.ndarray, kind: str) -> list:
    if kind == "int64":
        return (keys ^ np.uint64(1 << 63)).view(np.int64).tolist()
    if kind == "uuid":
        return [bytes(k).ljust(16, b"\0") for k in keys]
    return [k.decode() for k in keys]


@dataclass(frozen=True)
class Run:
    """Entries sorted by (key asc, ts desc)."""

    keys: np.ndarray
    ts: np.ndarray  # uint64
    rowids: np.ndarray  # uint64, TOMBSTONE for deletions

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ts.nbytes + self.rowids.nbytes

    def __len__(self) -> int:
        return len(self.ts)


def sort_run(keys: np.ndarray, ts: np.ndarray, rowids: np.ndarray) -> Run:
    order = np.lexsort((np.iinfo(np.uint64).max - ts, keys))  # last key is primary: key asc, ts desc
    return Run(keys[order], ts[order], rowids[order])


def merge_runs(runs: list[Run]) -> Run:
    if len(runs) == 1:
        return runs[0]
    width = max((r.keys.dtype.itemsize for r in runs), default=1)
    keys = np.concatenate([r.keys.astype(f"S{width}") if r.keys.dtype.kind == "S" else r.keys for r in runs])
    return sort_run(keys, np.concatenate([r.ts for r in runs]), np.concatenate([r.rowids for r in runs]))


def visible(run: Run, as_of: int) -> Run:
    """For each key, its newest entry with ts <= as_of, tombstones removed (reconstruction)."""
    m = run.ts <= np.uint64(as_of)
    keys, ts, rowids = run.keys[m], run.ts[m], run.rowids[m]
    if len(keys) == 0:
        return Run(keys, ts, rowids)
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]  # sorted ts desc: the first of a key is its newest
    live = first & (rowids != TOMBSTONE)
    return Run(keys[live], ts[live], rowids[live])


class MemTable:
    def __init__(self, kind: str):
        self.kind = kind
        self._runs: list[Run] = []
        self.nbytes = 0
        self.entries = 0

    def insert(self, keys: np.ndarray, ts: int | np.ndarray, rowids: np.ndarray) -> None:
        """One atomic batch: every key at commit ``ts`` (rowid TOMBSTONE = deleted)."""
        n = len(keys)
        if n == 0:
            return
        tsa = np.full(n, ts, np.uint64) if np.isscalar(ts) else np.asarray(ts, np.uint64)
        run = sort_run(keys, tsa, np.asarray(rowids, np.uint64))
        self._runs.append(run)
        self.nbytes += run.nbytes
        self.entries += n
        if len(self._runs) > _MAX_RUNS:
            self._runs = [merge_runs(self._runs)]

    def consolidated(self) -> Run:
        """All entries as one sorted run (also what a checkpoint writes)."""
        if not self._runs:
            empty = np.zeros(0, np.uint64 if self.kind == "int64" else "S1")
            return Run(empty, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        if len(self._runs) > 1:
            self._runs = [merge_runs(self._runs)]
        return self._runs[0]

    def get(self, keys: np.ndarray, as_of: int) -> np.ndarray:
        """Per key: the visible rowid at ``as_of``, TOMBSTONE if deleted, 0 if never written.

        (rowid 0 is in segment 0, which is never allocated: segids start at 1.)
        """
        run = self.consolidated()
        out = np.zeros(len(keys), np.uint64)
        if len(run) == 0 or len(keys) == 0:
            return out
        if run.keys.dtype.kind == "S" and keys.dtype.itemsize > run.keys.dtype.itemsize:
            return np.where(np.char.str_len(keys) > run.keys.dtype.itemsize, np.uint64(0),  # longer than any key
                            self.get(keys.astype(run.keys.dtype), as_of)).astype(np.uint64)
        k = keys.astype(run.keys.dtype) if run.keys.dtype.kind == "S" else keys
        return self._get_many(run, k, as_of)

    def get_one(self, key, as_of: int) -> int:
        """``get`` for one encoded key (a Python int or bytes): no arrays built."""
        run = self.consolidated()
        if len(run) == 0:
            return 0
        if run.keys.dtype.kind == "S":
            if len(key) > run.keys.dtype.itemsize:
                return 0
        else:
            key = np.uint64(key)  # a Python int above 2**63 would be compared as a float
        lo = int(run.keys.searchsorted(key, "left"))
        hi = int(run.keys.searchsorted(key, "right"))
        for j in range(lo, hi):  # ts descending: the first at or below as_of
            if run.ts[j] <= as_of:
                return int(run.rowids[j])
        return 0

    @staticmethod
    def _get_many(run: Run, keys: np.ndarray, as_of: int) -> np.ndarray:
        """Per key: the first entry with ts <= as_of (entries of a key are ts-descending);
        O(keys · log run + versions skipped), never a pass over the whole run."""
        out = np.zeros(len(keys), np.uint64)
        if len(run) == 0 or len(keys) == 0:
            return out
        lo = np.searchsorted(run.keys, keys, "left")
        hi = np.searchsorted(run.keys, keys, "right")
        j, t = lo.copy(), np.uint64(as_of)
        todo = np.flatnonzero(hi > lo)
        while len(todo):  # usually one round: the newest version is visible
            ok = run.ts[j[todo]] <= t
            out[todo[ok]] = run.rowids[j[todo[ok]]]
            todo = todo[~ok]
            j[todo] += 1
            todo = todo[j[todo] < hi[todo]]
        return out

    def scan(self, lo: np.ndarray | None, hi: np.ndarray | None, as_of: int) -> Run:
        """Visible entries with ``lo <= key < hi`` (None: unbounded), in key order."""
        run = self.consolidated()
        a = 0 if lo is None else int(np.searchsorted(run.keys, lo, "left"))
        b = len(run) if hi is None else int(np.searchsorted(run.keys, hi, "left"))
        return visible(Run(run.keys[a:b], run.ts[a:b], run.rowids[a:b]), as_of)
