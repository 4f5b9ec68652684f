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
from typing import Sequence, cast

import numba
import numpy as np
import numpy.typing as npt

from rowstore.rowids import TOMBSTONE

_U64 = npt.NDArray[np.uint64]
MAX_RUNS = 24  # mini-runs a memtable holds before inserts merge them on the caller's thread


@dataclass(frozen=True)
class Run:
    """Entries sorted by (key asc, ts desc)."""

    keys: np.ndarray
    ts: npt.NDArray[np.uint64]
    rowids: npt.NDArray[np.uint64]  # TOMBSTONE for deletions

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ts.nbytes + self.rowids.nbytes

    def __len__(self) -> int:
        return len(self.ts)


def sort_run(keys: np.ndarray, ts: np.ndarray, rowids: np.ndarray) -> Run:
    if len(ts) and ts[0] == ts[-1] and (ts == ts[0]).all():  # one batch: one timestamp, keys suffice
        if (keys[1:] >= keys[:-1]).all():  # already in key order (tables sort their batches)
            return Run(keys, ts, rowids)
        order = np.argsort(keys, kind="stable")
    else:
        order = np.lexsort((np.iinfo(np.uint64).max - ts, keys))  # last key is primary: key asc, ts desc
    return Run(keys[order], ts[order], rowids[order])


INLINE_MERGE = 1024  # entries a memtable merge may have to run on the event loop


def small(runs: Sequence[Run]) -> bool:
    """Whether merging ``runs`` is cheaper inline than a worker thread's hop."""
    return sum(len(r) for r in runs) <= INLINE_MERGE


def merge_runs(runs: list[Run]) -> Run:
    if len(runs) == 1:
        return runs[0]
    if all(r.keys.dtype == np.uint64 for r in runs):  # linear passes: the runs are sorted already
        while len(runs) > 1:
            pairs = [Run(*_merge2(a.keys, a.ts, a.rowids, b.keys, b.ts, b.rowids))
                     for a, b in zip(runs[0::2], runs[1::2])]
            runs = pairs + runs[len(pairs) * 2 :]
        return runs[0]
    if all(r.keys.dtype.kind == "S" for r in runs):  # the same passes, each by searches and copies
        while len(runs) > 1:
            pairs = [_merge2_bytes(a, b) for a, b in zip(runs[0::2], runs[1::2])]
            runs = pairs + runs[len(pairs) * 2 :]
        return runs[0]
    width = max((r.keys.dtype.itemsize for r in runs), default=1)
    keys = np.concatenate([r.keys.astype(f"S{width}") if r.keys.dtype.kind == "S" else r.keys for r in runs])
    return sort_run(keys, np.concatenate([r.ts for r in runs]), np.concatenate([r.rowids for r in runs]))


def _merge2_bytes(a: Run, b: Run) -> Run:
    """Two (key asc, ts desc) runs of byte keys merged in that order (a's entry first on a
    tie), as :func:`_merge2` does for integer keys: the smaller run's entries are placed in the
    larger by binary search (among a key's versions, after those at least as new), then both
    copied once — a checkpoint's small run over a large one costs a copy, not a sort."""
    if len(b) > len(a):
        return _merge2_bytes_into(b, a, a_first=False)
    return _merge2_bytes_into(a, b, a_first=True)


def _merge2_bytes_into(big: Run, small: Run, a_first: bool) -> Run:
    """``small`` merged into ``big``; on a (key, ts) tie ``big``'s entry first when ``a_first``."""
    width = max(big.keys.dtype.itemsize, small.keys.dtype.itemsize, 1)
    bk, sk = big.keys.astype(f"S{width}", copy=False), small.keys.astype(f"S{width}", copy=False)
    pos = np.searchsorted(bk, sk, "left")
    hi = np.searchsorted(bk, sk, "right")
    while True:  # past the big run's versions of the key that go first (newer, or as new and first)
        at = np.minimum(pos, max(len(bk) - 1, 0))
        ahead = big.ts[at] >= small.ts if a_first else big.ts[at] > small.ts
        step = (pos < hi) & ahead
        if not step.any():
            break
        pos = pos + step
    n = len(big) + len(small)
    into = pos + np.arange(len(small))
    rest = np.ones(n, bool)
    rest[into] = False
    keys, ts, rowids = np.empty(n, f"S{width}"), np.empty(n, np.uint64), np.empty(n, np.uint64)
    keys[rest], ts[rest], rowids[rest] = bk, big.ts, big.rowids
    keys[into], ts[into], rowids[into] = sk, small.ts, small.rowids
    return Run(keys, ts, rowids)


@numba.njit(cache=True, nogil=True)
def _merge2(ak: np.ndarray, ats: _U64, ar: _U64, bk: np.ndarray, bts: _U64,
            br: _U64) -> tuple[np.ndarray, _U64, _U64]:
    """Two (key asc, ts desc) runs merged in that order (a's entry first on a tie)."""
    na, nb = ak.shape[0], bk.shape[0]
    k, t, r = np.empty(na + nb, ak.dtype), np.empty(na + nb, ats.dtype), np.empty(na + nb, ar.dtype)
    i = j = 0
    for o in range(na + nb):
        if j == nb or (i < na and (ak[i] < bk[j] or (ak[i] == bk[j] and ats[i] >= bts[j]))):
            k[o], t[o], r[o] = ak[i], ats[i], ar[i]
            i += 1
        else:
            k[o], t[o], r[o] = bk[j], bts[j], br[j]
            j += 1
    return k, t, r


def newest_versions(run: Run, as_of: int) -> Run:
    """For each key, its newest entry with ts <= as_of, deletions included."""
    if len(run) and int(run.ts.max()) <= as_of:  # nothing newer than as_of: no copy
        keys, ts, rowids = run.keys, run.ts, run.rowids
    else:
        m = run.ts <= np.uint64(as_of)
        keys, ts, rowids = run.keys[m], run.ts[m], run.rowids[m]
    first = np.ones(len(keys), bool)
    first[1:] = keys[1:] != keys[:-1]  # sorted ts desc: the first of a key is its newest
    return Run(keys[first], ts[first], rowids[first])


def visible(run: Run, as_of: int) -> Run:
    """For each key, its newest entry with ts <= as_of, tombstones removed (reconstruction)."""
    r = newest_versions(run, as_of)
    live = r.rowids != TOMBSTONE
    return Run(r.keys[live], r.ts[live], r.rowids[live])


class MemTable:
    def __init__(self, kind: str):
        self.kind = kind
        self._runs: list[Run] = []
        self.nbytes = 0
        self.entries = 0
        self.read_many = False  # a read searched more than two runs: consolidation is due

    def insert(self, keys: np.ndarray, ts: int | np.ndarray, rowids: np.ndarray) -> None:
        """One atomic batch: every key at commit ``ts`` (rowid TOMBSTONE = deleted).

        The batch becomes one sorted mini-run. Mini-runs merge like a binary counter (a run
        merges into the one before it while that one is at most twice its size), so n
        entries cost O(n log² n) in all and a lookup searches O(log n) runs. The merges are
        the owner's to run off the event loop (:meth:`merge_due`, :meth:`replace`) — reads
        never merge; past ``MAX_RUNS`` runs insert merges itself, so lookups stay bounded
        if merging falls behind."""
        n = len(keys)
        if n == 0:
            return
        tsa = np.full(n, ts, np.uint64) if np.isscalar(ts) else np.asarray(ts, np.uint64)
        run = sort_run(keys, tsa, np.asarray(rowids, np.uint64))
        self._runs = [*self._runs, run]
        self.nbytes += run.nbytes
        self.entries += n
        while len(self._runs) > MAX_RUNS:
            due = self.merge_due() or tuple(self._runs[-2:])
            self.replace(due, merge_runs(list(due)))

    def merge_due(self) -> tuple[Run, ...] | None:
        """The runs to merge next, adjacent and oldest first: the newest pair the binary
        counter merges, else — once a read searched more than two runs — all of them, so
        reads after a burst of writes search one run again."""
        runs = self._runs
        for i in range(len(runs) - 2, -1, -1):
            if len(runs[i]) <= 2 * len(runs[i + 1]):
                return runs[i], runs[i + 1]
        if self.read_many and len(runs) > 2:
            return tuple(runs)
        return None

    def merge_small(self) -> bool:
        """Run the due merges now while each is small (:func:`small`: cheaper on the event loop
        than a worker thread's hop — point writes make about one merge per group, nearly all
        of a few entries); whether a bigger one is still due."""
        while (due := self.merge_due()) is not None:
            if not small(due):
                return True
            self.replace(due, merge_runs(list(due)))
        return False

    def replace(self, old: tuple[Run, ...], merged: Run) -> bool:
        """Put ``merged`` in place of the adjacent runs ``old`` if they are all still there.
        The list is replaced, never changed in place: a reader holding it keeps its view."""
        runs, n = self._runs, len(old)
        for i in range(len(runs) - n + 1):
            if all(runs[i + j] is old[j] for j in range(n)):
                self._runs = [*runs[:i], merged, *runs[i + n :]]
                self.read_many = len(self._runs) > 2 and self.read_many
                return True
        return False

    def consolidated(self) -> Run:
        """All entries as one sorted run (scans, and what a checkpoint writes)."""
        if not self._runs:
            empty = np.zeros(0, np.uint64 if self.kind == "int64" else "S1")
            return Run(empty, np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        if len(self._runs) > 1:
            self._runs = [merge_runs(self._runs)]
        return self._runs[0]

    def get(self, keys: np.ndarray, as_of: int) -> np.ndarray:
        return self.lookup(keys, as_of)[0]

    def lookup(self, keys: np.ndarray, as_of: int) -> tuple[np.ndarray, np.ndarray]:
        """Per key: (rowid, ts) visible at ``as_of`` (TOMBSTONE if deleted; (0, 0) if never written).

        (rowid 0 is in segment 0, which is never allocated: segids start at 1.) Every
        mini-run is searched and the newest version at or below ``as_of`` wins."""
        runs = self._runs
        if len(runs) > 2:
            self.read_many = True  # the owner consolidates them in a worker thread
        best_r, best_t = np.zeros(len(keys), np.uint64), np.zeros(len(keys), np.uint64)
        for run in runs:
            r, t = _lookup(run, keys, as_of)
            newer = (r != 0) & (t >= best_t)
            best_r[newer], best_t[newer] = r[newer], t[newer]
        return best_r, best_t

    def get_one(self, key: int | bytes, as_of: int) -> int:
        """``get`` for one encoded key (a Python int or bytes): no arrays built."""
        runs = self._runs
        if len(runs) > 2:
            self.read_many = True  # the owner consolidates them in a worker thread
        best_r, best_t = 0, -1
        for run in runs:
            r, t = find_one(run, key, as_of)
            if r and t > best_t:
                best_r, best_t = r, t
        return best_r

    def scan(self, lo: np.generic | None, hi: np.generic | None, as_of: int) -> Run:
        """Visible entries with ``lo <= key < hi`` (None: unbounded), in key order."""
        run = self.consolidated()
        a = 0 if lo is None else int(np.searchsorted(run.keys, lo, "left"))
        b = len(run) if hi is None else int(np.searchsorted(run.keys, hi, "left"))
        return visible(Run(run.keys[a:b], run.ts[a:b], run.rowids[a:b]), as_of)


def find_one(run: Run, key: int | bytes, as_of: int) -> tuple[int, int]:
    """(rowid, ts) of the first entry of one encoded key (int or bytes) in ``run`` with
    ts <= as_of; (0, 0) if none. int64 keys take one compiled call (two ``searchsorted``
    plus a walk cost ~4x more from Python)."""
    # The casts: the run's key dtype says which the key is (int64 keys are ints, the others bytes).
    if run.keys.dtype == np.uint64:
        k = cast(int, key)
        return _find_u64(run.keys, run.ts, run.rowids, k - _2_64 if k >= _2_63 else k, as_of)
    key = cast(bytes, key)
    if len(key) > run.keys.dtype.itemsize:
        return 0, 0  # longer than every key of the run
    lo, hi = int(run.keys.searchsorted(key, "left")), int(run.keys.searchsorted(key, "right"))
    for j in range(lo, hi):  # ts descending: the first at or below as_of
        t = int(run.ts[j])
        if t <= as_of:
            return int(run.rowids[j]), t
    return 0, 0


_2_63, _2_64 = 1 << 63, 1 << 64


@numba.njit(cache=True, nogil=True)
def _find_u64(keys: _U64, ts: _U64, rowids: _U64, key_bits: int | np.int64, as_of: int | np.uint64) -> tuple[int, int]:
    """``find_one`` over uint64 keys. The key comes as the int64 with its bits (a Python int
    above 2**63 would make numba compare as float64), ``as_of`` as a non-negative int64."""
    key, t = np.uint64(key_bits), np.uint64(as_of)
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    while lo < keys.shape[0] and keys[lo] == key:
        if ts[lo] <= t:
            return rowids[lo], ts[lo]
        lo += 1
    return np.uint64(0), np.uint64(0)  # type: ignore[return-value]  # numba returns uint64 scalars as ints


def _lookup(run: Run, keys: np.ndarray, as_of: int) -> tuple[np.ndarray, np.ndarray]:
    """Per key: (rowid, ts) of its first entry in ``run`` with ts <= as_of ((0, 0) if none);
    O(keys · log run + versions skipped), never a pass over the whole run."""
    out, ts_out = np.zeros(len(keys), np.uint64), np.zeros(len(keys), np.uint64)
    if len(run) == 0 or len(keys) == 0:
        return out, ts_out
    if run.keys.dtype.kind == "S" and keys.dtype.kind == "S" and keys.dtype.itemsize > run.keys.dtype.itemsize:
        fits = np.char.str_len(keys) <= run.keys.dtype.itemsize  # longer keys are in no entry
        r, rt = _lookup(run, keys[fits].astype(run.keys.dtype), as_of)
        out[fits], ts_out[fits] = r, rt
        return out, ts_out
    if run.keys.dtype == np.uint64 and keys.dtype == np.uint64:
        _lookup_u64(run.keys, run.ts, run.rowids, keys, as_of, out, ts_out)
        return out, ts_out
    lo = np.searchsorted(run.keys, keys, "left")
    hi = np.searchsorted(run.keys, keys, "right")
    j, t = lo.copy(), np.uint64(as_of)
    todo = np.flatnonzero(hi > lo)
    while len(todo):  # usually one round: the newest version is visible
        ok = run.ts[j[todo]] <= t
        hit = todo[ok]
        out[hit], ts_out[hit] = run.rowids[j[hit]], run.ts[j[hit]]
        todo = todo[~ok]
        j[todo] += 1
        todo = todo[j[todo] < hi[todo]]
    return out, ts_out


@numba.njit(cache=True, nogil=True)
def _lookup_u64(run_keys: _U64, run_ts: _U64, run_rowids: _U64, keys: _U64, as_of: int, out: _U64,
                ts_out: _U64) -> None:
    """``_lookup`` over uint64 keys in one compiled pass (numpy needs ~20 calls, whose fixed
    costs dominate the small per-partition lookups of a multi-key get)."""
    t = np.uint64(as_of)
    for i in range(keys.shape[0]):
        r, ts = _find_u64(run_keys, run_ts, run_rowids, np.int64(keys[i]), t)
        out[i], ts_out[i] = r, ts
