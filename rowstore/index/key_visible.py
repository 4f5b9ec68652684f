"""The rowids visible at T in one partition, kept across writes (aggregates, RFC 0012).

Reconstruction (RFC 0003) picks, per key, the newest entry at or below T over the memtables
and the runs. The runs change only when a checkpoint, merge or GC publishes; the memtables
change with every write. So the runs' part is computed once — a :class:`RunsView`: each key's
newest run entry at or below T, *tombstones kept* — and every read lays the memtables' newest
entries over it (:func:`overlay`): where a memtable entry is as new or newer, the run's rowid
leaves the set and the memtable's enters it. The newest entry per key over both is the newest
of each side's newest, so the answer is the full merge's, at a cost that grows with the
memtables instead of the table.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowstore.index.key_memtable import Run, merge_runs, newest_versions
from rowstore.index.key_run import IndexRun
from rowstore.rowids import TOMBSTONE
from rowstore.index.rowid_kernels import match_sorted


@dataclass(frozen=True)
class RunsView:
    """The runs' newest entries at ``as_of`` and their live rowids, sorted."""

    runs: tuple[IndexRun, ...]  # the IndexRun objects it was made from (immutable; a publish makes new ones)
    as_of: int
    newest: int  # the largest commit timestamp in those runs
    latest: Run  # per key, the newest run entry at or below as_of (tombstones kept)
    live: np.ndarray  # the non-tombstone rowids of ``latest``, sorted
    memo: dict[object, Any] = field(default_factory=dict, compare=False)  # what readers derived from it

    @classmethod
    def of(cls, runs: tuple[IndexRun, ...], entries: list[Run], as_of: int, newest: int) -> RunsView:
        """From every entry of ``runs`` (in run order: newest first); CPU work, run it in a thread."""
        parts = [e for e in entries if len(e)]
        if parts:
            latest = newest_versions(merge_runs(parts), as_of)
        else:
            latest = Run(np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint64))
        live = np.sort(latest.rowids[latest.rowids != TOMBSTONE])
        return cls(runs, as_of, newest, latest, live)

    def added(self, runs: tuple[IndexRun, ...], as_of: int) -> tuple[IndexRun, ...] | None:
        """The runs in front of this view's own in ``runs`` when the rest are this view's runs
        and its answer holds at ``as_of`` (a checkpoint added runs and nothing else changed):
        :meth:`with_runs` then lays only their entries over it. None otherwise."""
        k = len(runs) - len(self.runs)
        if k <= 0 or not all(a is b for a, b in zip(runs[k:], self.runs)):
            return None
        if not (as_of == self.as_of or self.newest <= min(as_of, self.as_of)):
            return None
        return runs[:k]

    def with_runs(self, runs: tuple[IndexRun, ...], entries: list[Run], as_of: int, newest: int) -> RunsView:
        """This view with the entries of :meth:`added`'s runs (newest first) laid over it:
        what :meth:`of` would answer for ``runs`` (the newest entry per key; on a tie of key and
        timestamp the newer run's, as the full merge orders them). CPU work, in a thread."""
        parts = [e for e in entries if len(e)] + ([self.latest] if len(self.latest) else [])
        if not parts:
            return RunsView.of(runs, [], as_of, newest)
        latest = newest_versions(merge_runs(parts), as_of)
        live = overlay(self, [e for e in entries if len(e)], as_of)  # its live rowids, kept sorted: no sort
        return RunsView(runs, as_of, newest, latest, live)

    def serves(self, runs: tuple[IndexRun, ...], as_of: int) -> bool:
        """Whether this view is the runs' answer at ``as_of`` too: the same runs, and no run
        entry between the two timestamps."""
        return len(runs) == len(self.runs) and all(a is b for a, b in zip(runs, self.runs)) \
            and (as_of == self.as_of or self.newest <= min(as_of, self.as_of))


def overlay(view: RunsView, mem: list[Run], as_of: int) -> np.ndarray:
    """The sorted rowids visible at ``as_of``: ``view`` with the memtables' entries (``mem``,
    newest memtable first; a tie goes to the memtable, as the full merge orders it) laid over."""
    parts = [r for r in mem if len(r)]
    if not parts:
        return view.live
    m = newest_versions(merge_runs(parts), as_of)
    if not len(m):
        return view.live
    base = view.latest
    pos = np.searchsorted(base.keys, m.keys)
    at = np.minimum(pos, max(len(base) - 1, 0))
    hit = (pos < len(base)) & (base.keys[at] == m.keys) if len(base) else np.zeros(len(m), bool)
    wins = ~hit | (m.ts >= base.ts[at]) if len(base) else np.ones(len(m), bool)
    gone = base.rowids[at[hit & wins]]
    gone = np.sort(gone[gone != TOMBSTONE])
    added = np.sort(m.rowids[wins & (m.rowids != TOMBSTONE)])
    live = view.live
    if len(gone):
        idx = match_sorted(live, gone)
        live = np.delete(live, idx[idx >= 0])
    if len(added):
        live = np.insert(live, np.searchsorted(live, added), added)
    return live
