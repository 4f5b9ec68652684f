"""Histories of the batch workload the seeded simulation (tests/sim) and the nemesis suite
(tests/node/cluster/test_nemesis.py) run, and what they must satisfy (docs/rfcs/0010-replication.md,
"Histories").

The workload: batch ``b`` is the rows ``b * rows + i`` (``i < rows``), each holding ``b``; its
rows hash to several partitions, so every batch is an atomic write across partitions (and
often across nodes). Clients write batches (a retry writes the same rows again) and read:
whole partitions, key ranges, keys — at the present (a *present* read: it chose its own T) or
``as_of`` a T. :class:`History` records every operation as the clients see it: when it was
called and when it returned (the simulation's virtual time, the nemesis suite's monotonic
clock), what it asked, and its outcome — ok, failed (it certainly did nothing), or unknown
(an error or no answer: it may have taken effect, at any moment after its call, or never).

What :func:`check` holds a history to, once every fault healed, against the change feed at
the end (every version of every row, with its ``commit_ts``):

* **atomicity**: every version of a batch in the feed is whole (all its rows at one
  ``commit_ts``); every read saw each batch it covers whole or not at all;
* **nothing invented, nothing lost, nothing left as maybe**: every batch in the feed was
  written by a call that did not fail — a batch whose cross-node decision (``txn/X``) was
  aborted or never made counts as failed, so it must be absent; one decided committed, or
  acknowledged, must be present, with the ``commit_ts`` it was acknowledged at;
* **linearizability** of the present reads (partition scans, key ranges, point gets, the
  read at the end) with the writes: per share of a batch — its rows in one partition, a
  write-once register (absent, then present) — Wing & Gong's search
  (``tests/history/linearizable.py``);
* **snapshots**: a read at T saw exactly the batches it covers whose first version has
  ``commit_ts <= T`` (``as_of`` reads and present reads alike);
* **real time**: a present read's T is at or above the ``commit_ts`` of every write
  acknowledged before it was called, and below that of every write called after it returned
  (a write's ``commit_ts`` lies between its call and its return in the order of reads);
* **not vacuous**: at least ``min_acked`` batches acknowledged and ``min_reads`` present
  reads answered.
"""
from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
import numpy as np

from tests.history.linearizable import Model, Operation, check as linearizable

OK, FAILED, UNKNOWN, PENDING = "ok", "failed", "unknown", "pending"
INF = float("inf")
Share = tuple[int, int]  # (batch, partition): a batch's rows in one partition


class HistoryViolation(AssertionError):
    """A history breaks what the store promises (each problem named, with its operations)."""


@dataclass(frozen=True)
class Region:
    """What a read covers: the rows of partitions ``pids`` — only keys in ``[lo, hi)`` when
    given, only ``keys`` when given."""

    pids: frozenset[int]
    lo: int | None = None
    hi: int | None = None
    keys: frozenset[int] | None = None

    def __str__(self) -> str:
        out = f"partitions {sorted(self.pids)}"
        if self.lo is not None:
            out += f" keys [{self.lo}, {self.hi})"
        if self.keys is not None:
            out += f" keys {sorted(self.keys)[:8]}"
        return out


@dataclass(eq=False)
class Write:
    client: str
    batch: int
    call: float
    ret: float | None = None
    status: str = PENDING
    commit_ts: int | None = None
    txn: int | None = None  # a cross-node batch's decision row (``txn/X``), when the client knows X
    decided: str | None = None  # what that row said once the faults healed: "committed" or "aborted"
    note: str = ""  # what a report says of it instead (a write standing for several: ``reduce_batch``)
    _h: "History | None" = field(default=None, repr=False)

    def ok(self, commit_ts: int) -> None:
        assert self._h is not None
        self.ret, self.status, self.commit_ts = self._h.clock(), OK, int(commit_ts)

    def unknown(self) -> None:
        assert self._h is not None
        self.ret, self.status = self._h.clock(), UNKNOWN

    def failed(self) -> None:
        assert self._h is not None
        self.ret, self.status = self._h.clock(), FAILED

    @property
    def effective(self) -> bool:
        """Whether it may have taken effect: not failed, not decided aborted."""
        return self.status != FAILED and self.decided != "aborted"

    def __str__(self) -> str:
        if self.note:
            return self.note
        end = "never" if self.ret is None or self.status in (UNKNOWN, PENDING) else f"{self.ret:.3f}"
        ts = f" commit_ts {self.commit_ts}" if self.commit_ts is not None else ""
        dec = f" decided {self.decided}" if self.decided else ""
        return f"write of batch {self.batch} by {self.client} [{self.call:.3f}, {end}] {self.status}{ts}{dec}"


@dataclass(eq=False)
class Read:
    client: str
    region: Region
    call: float
    as_of: int | None = None  # None: a read of the present
    ret: float | None = None
    T: int | None = None  # the snapshot it answered at (None: the answer does not say, as a point get's)
    rows: frozenset[tuple[int, int]] | None = None  # (key, batch column) seen; None: failed, no answer
    note: str = ""
    _h: "History | None" = field(default=None, repr=False)

    @property
    def present(self) -> bool:
        return self.as_of is None

    def ok(self, T: int | None, rows: Iterable[tuple[int, int]]) -> None:
        assert self._h is not None
        self.ret, self.T, self.rows = self._h.clock(), None if T is None else int(T), frozenset(rows)

    def failed(self) -> None:
        assert self._h is not None
        self.ret = self._h.clock()

    def __str__(self) -> str:
        what = "present" if self.present else f"as_of {self.as_of}"
        end = "?" if self.ret is None else f"{self.ret:.3f}"
        return (f"{what} read of {self.region} by {self.client}{' ' + self.note if self.note else ''} "
                f"[{self.call:.3f}, {end}] at T {self.T}")


class History:
    """Every operation, recorded as the clients call and see it. Thread-safe (the nemesis
    suite's writers are threads)."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.writes: list[Write] = []
        self.reads: list[Read] = []
        self._lock = threading.Lock()

    def write(self, client: str, batch: int, txn: int | None = None) -> Write:
        w = Write(client, int(batch), self.clock(), txn=txn, _h=self)
        with self._lock:
            self.writes.append(w)
        return w

    def read(self, client: str, region: Region, as_of: int | None = None, note: str = "") -> Read:
        r = Read(client, region, self.clock(), as_of, note=note, _h=self)
        with self._lock:
            self.reads.append(r)
        return r


class Layout:
    """Where batch ``b``'s rows are: keys ``b * rows + i``, in the partitions ``pids_of``
    (encoded like the table's) says."""

    def __init__(self, rows: int, pids_of: Callable[[np.ndarray], np.ndarray]):
        self.rows, self.pids_of = rows, pids_of
        self._keys: dict[int, dict[int, frozenset[int]]] = {}

    def keys(self, b: int) -> dict[int, frozenset[int]]:
        """Batch ``b``'s keys by partition."""
        got = self._keys.get(b)
        if got is None:
            ks = np.arange(b * self.rows, (b + 1) * self.rows, dtype=np.int64)
            pids = self.pids_of(ks)
            got = self._keys[b] = {int(p): frozenset(ks[pids == p].tolist()) for p in np.unique(pids)}
        return got

    def covered(self, b: int, region: Region, pid: int | None = None) -> frozenset[int]:
        """The keys of batch ``b`` a read of ``region`` covers (only in partition ``pid``, given)."""
        ks = self.keys(b)
        pids = region.pids if pid is None else region.pids & {pid}
        out: frozenset[int] = frozenset().union(*(ks.get(p, frozenset()) for p in pids))
        if region.keys is not None:
            out &= region.keys
        if region.lo is not None or region.hi is not None:
            lo, hi = region.lo if region.lo is not None else -(1 << 63), region.hi if region.hi is not None else 1 << 63
            out = frozenset(k for k in out if lo <= k < hi)
        return out


@dataclass
class Summary:
    acked: int = 0
    unknown: int = 0
    failed: int = 0
    decided_committed: int = 0
    decided_aborted: int = 0
    present_reads: int = 0
    as_of_reads: int = 0
    batches: int = 0  # shares (batch, partition) whose sub-history went through the linearizability search

    def __str__(self) -> str:
        return (f"{self.acked} batches acknowledged, {self.unknown} writes unknown ({self.decided_committed} decided "
                f"committed, {self.decided_aborted} aborted), {self.failed} failed; {self.present_reads} present and "
                f"{self.as_of_reads} as_of reads; {self.batches} shares searched")


class _Register(Model[bool]):
    """One share of a batch (its rows in one partition): absent, then present once any write of
    the batch takes effect there (a retry writes the same rows). Reads answer whether they saw
    it. Partitioned per share: a batch spanning nodes becomes visible on each of its nodes at its
    own moment between its call and its return — a read of one partition may see it while a
    later read of another does not yet (its commit did not reach that node): what reads of the
    present promise across partitions is the snapshot at their T and every batch acknowledged
    before they began (the snapshot and real-time checks), not one instant for the whole batch."""

    def init(self) -> bool:
        return False

    def step(self, state: bool, op: Operation) -> tuple[bool, bool]:
        if op.input[0] == "write":
            return True, True
        return op.output == state, state

    def partition(self, ops: Sequence[Operation]) -> list[list[Operation]]:
        parts: dict[int, list[Operation]] = {}
        for op in ops:
            parts.setdefault(op.input[1], []).append(op)
        return list(parts.values())

    def describe(self, op: Operation) -> str:
        return op.note


REGISTER = _Register()


def reduce_batch(writes: list[Write], absent: list[Read], present: list[Read]) -> tuple[list[Write], list[Read]]:
    """The operations of one share's sub-history that decide whether it is linearizable: one
    write standing for the batch's writes that may have taken effect (called when the first of
    them was, returned when the first acknowledged one did: never, when none was), the read
    that did not see it called last, and the read that saw it returning first.

    Sound and complete for a write-once register: the history is linearizable iff some instant
    t (when the first write takes effect; never, when none was acknowledged) is at or after
    some write's call, at or before every acknowledged write's return, after the call of every
    read that missed it and before the return of every read that saw it. Only the extremes
    bound t: the first call among the writes, the first return among the acknowledged ones,
    the latest call among the reads that missed it and the earliest return among those that
    saw it — every other write is a no-op placed after t, every other read is implied. Without
    the writes merged the search tries every subset of a batch's unknown retries (a writer
    retrying through a partition sends dozens); ``tests/history/test_batches.py`` holds the
    reduction against the whole sub-history."""
    keep: list[Read] = []
    if absent:
        keep.append(max(absent, key=lambda r: r.call))
    if present:
        keep.append(min(present, key=_ret))
    live = [w for w in writes if w.effective]
    if not live:
        return [], keep
    first = min(live, key=lambda w: w.call)
    acked = [w for w in live if w.status == OK]
    one = Write(first.client, first.batch, first.call, note=f"{len(live)} writes, the first {first}")
    if acked:
        done = min(acked, key=_ret)
        one.ret, one.status, one.commit_ts = done.ret, OK, done.commit_ts
    else:
        one.status = UNKNOWN
    return [one], keep


def _ret(x: Write | Read) -> float:
    """When ``x`` returned; never (INF) when it did not — a return at 0.0 is a return."""
    return INF if x.ret is None else x.ret


def as_operation(share: Share, x: Write | Read, saw: bool | None = None) -> Operation:
    """A write or a read as an operation of ``share``'s register; a write that did not return
    ok never returned (it may take effect at any moment after its call)."""
    ret = x.ret if not isinstance(x, Write) or x.status == OK else None
    return Operation(x.call, ret, ("write" if isinstance(x, Write) else "read", share), saw, x.client,
                     note=str(x) + ("" if saw is None else f" saw batch {share[0]} in partition {share[1]}: {saw}"))


def check(h: History, layout: Layout, feed: Iterable[tuple[int, int]], *, min_acked: int = 0,
          min_reads: int = 0) -> Summary:
    """Hold history ``h`` to everything in the module's docstring; ``feed``: the change feed's
    (key, commit_ts) pairs once the faults healed. HistoryViolation names every problem found."""
    problems: list[str] = []
    versions = _versions(feed, layout, problems)
    first = {b: min(v) for b, v in versions.items()}
    writes: dict[int, list[Write]] = {}
    for w in h.writes:
        writes.setdefault(w.batch, []).append(w)
    s = _summary(h)
    _check_writes(writes, versions, problems)
    reads = [r for r in h.reads if r.rows is not None]
    seen = {id(r): _seen(r, layout, problems) for r in reads}
    effective = {b for b, ws in writes.items() if any(w.effective for w in ws)}
    for r in reads:
        ghosts = sorted(set(seen[id(r)]) - effective)
        if ghosts:
            problems.append(f"{r} saw batches no write of which may have taken effect: {ghosts[:10]}")
    universe = effective | set(versions) | {b for r in reads for b in seen[id(r)]}
    _check_snapshots([r for r in reads if r.T is not None], seen, first, universe, layout, problems)
    present = [r for r in reads if r.present]
    _check_real_time([r for r in present if r.T is not None], writes, layout, problems)
    s.batches = _check_linearizable(present, seen, writes, universe, layout, problems)
    if s.acked < min_acked:
        problems.append(f"only {s.acked} batches acknowledged (at least {min_acked} wanted): a run that writes "
                        "nothing proves nothing")
    if s.present_reads < min_reads:
        problems.append(f"only {s.present_reads} present reads answered (at least {min_reads} wanted)")
    if problems:
        raise HistoryViolation(f"{len(problems)} problems in the history ({s}):\n" + "\n".join(problems[:12]))
    return s


def _summary(h: History) -> Summary:
    s = Summary()
    s.acked = len({w.batch for w in h.writes if w.status == OK})
    s.unknown = sum(1 for w in h.writes if w.status in (UNKNOWN, PENDING))
    s.failed = sum(1 for w in h.writes if w.status == FAILED)
    s.decided_committed = sum(1 for w in h.writes if w.decided == "committed")
    s.decided_aborted = sum(1 for w in h.writes if w.decided == "aborted")
    s.present_reads = sum(1 for r in h.reads if r.rows is not None and r.present)
    s.as_of_reads = sum(1 for r in h.reads if r.rows is not None and not r.present)
    return s


def _versions(feed: Iterable[tuple[int, int]], layout: Layout, problems: list[str]) -> dict[int, dict[int, set[int]]]:
    """batch -> commit_ts -> its keys written then; every version must be the whole batch."""
    out: dict[int, dict[int, set[int]]] = {}
    for k, ts in feed:
        out.setdefault(int(k) // layout.rows, {}).setdefault(int(ts), set()).add(int(k))
    for b, v in sorted(out.items()):
        want = set().union(*layout.keys(b).values())
        for ts, ks in sorted(v.items()):
            if ks != want:
                problems.append(f"batch {b} was committed at {ts} with {len(ks)} of its {len(want)} rows "
                                f"(missing {sorted(want - ks)[:8]})")
    return out


def _check_writes(writes: dict[int, list[Write]], versions: dict[int, dict[int, set[int]]],
                  problems: list[str]) -> None:
    for b, ws in sorted(writes.items()):
        have = versions.get(b, {})
        for w in ws:
            if w.status == OK and w.commit_ts not in have:
                problems.append(f"{w}: the feed holds it at {sorted(have) or 'no commit_ts at all'} (lost)")
            if w.decided == "committed" and not have:
                problems.append(f"{w}: its decision row says committed, and no partition holds it")
        if have and not any(w.effective for w in ws):
            problems.append(f"batch {b} is present (at {sorted(have)}) though no write of it may have taken effect: "
                            + "; ".join(str(w) for w in ws))
    for b in sorted(set(versions) - set(writes))[:10]:
        problems.append(f"batch {b} is present (at {sorted(versions[b])}) and was never written")


def _seen(r: Read, layout: Layout, problems: list[str]) -> dict[int, frozenset[int]]:
    """The batches a read saw, each with the keys of it seen; a row of another batch's value,
    outside what the read covers, or a batch seen in part, is a problem."""
    assert r.rows is not None
    got: dict[int, set[int]] = {}
    for k, b in r.rows:
        if k // layout.rows != b:
            problems.append(f"{r} saw row {k} holding batch {b}: never written")
            continue
        got.setdefault(b, set()).add(k)
    out = {}
    for b, ks in got.items():
        want = layout.covered(b, r.region)
        if ks - want:
            problems.append(f"{r} returned rows it does not cover: {sorted(ks - want)[:8]}")
        elif ks != want:
            problems.append(f"{r} saw batch {b} in part: {len(ks)} of the {len(want)} rows it covers "
                            f"(missing {sorted(want - ks)[:8]})")
        out[b] = frozenset(ks)
    return out


def _candidates(r: Read, universe: set[int], by_pid: dict[int, set[int]], layout: Layout) -> set[int]:
    """The batches of ``universe`` a read covers some key of."""
    reg = r.region
    if reg.keys is not None:
        cand = {k // layout.rows for k in reg.keys} & universe
    elif reg.lo is not None and reg.hi is not None:
        cand = set(range(reg.lo // layout.rows, (reg.hi - 1) // layout.rows + 1)) & universe
    else:
        cand = set().union(*(by_pid.get(p, set()) for p in reg.pids))
        if reg.lo is None and reg.hi is None:
            return cand  # every batch with a key in those partitions
    return {b for b in cand if layout.covered(b, reg)}


def _by_pid(universe: set[int], layout: Layout) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for b in universe:
        for p in layout.keys(b):
            out.setdefault(p, set()).add(b)
    return out


def _check_snapshots(reads: list[Read], seen: dict[int, dict[int, frozenset[int]]], first: dict[int, int],
                     universe: set[int], layout: Layout, problems: list[str]) -> None:
    """A read at T saw exactly the batches it covers whose first version is at or below T."""
    order = sorted(first, key=first.__getitem__)
    tss = [first[b] for b in order]
    by_pid = _by_pid(universe, layout)
    for r in reads:
        assert r.T is not None
        want = set(order[:bisect.bisect_right(tss, r.T)]) & _candidates(r, universe, by_pid, layout)
        got = set(seen[id(r)])
        if got != want:
            missed, extra = sorted(want - got), sorted(got - want)
            problems.append(f"{r} is not the snapshot at its T: missed {[(b, first[b]) for b in missed[:6]]}, "
                            f"saw {[(b, first.get(b)) for b in extra[:6]]} (batch, first commit_ts)")


def _check_real_time(reads: list[Read], writes: dict[int, list[Write]], layout: Layout,
                     problems: list[str]) -> None:
    """A present read's T is >= the commit_ts of each write it covers acknowledged before its
    call, and < that of each called after its return."""
    acked = [w for ws in writes.values() for w in ws if w.status == OK]
    for r in reads:
        assert r.T is not None and r.ret is not None
        for w in acked:
            assert w.ret is not None and w.commit_ts is not None
            before, after = w.ret < r.call, w.call > r.ret
            if not (before or after) or (before and w.commit_ts <= r.T) or (after and w.commit_ts > r.T):
                continue
            if not layout.covered(w.batch, r.region):
                continue
            problems.append(f"{r}: {w} {'returned before it was called' if before else 'was called after it returned'}"
                            f", yet its commit_ts is {'above' if before else 'at or below'} the read's T")
            break


def _check_linearizable(present: list[Read], seen: dict[int, dict[int, frozenset[int]]],
                        writes: dict[int, list[Write]], universe: set[int], layout: Layout,
                        problems: list[str]) -> int:
    """Per share — a batch's rows in one partition — the present reads that cover it with the
    batch's writes (reduced: ``reduce_batch``), through Wing & Gong's search."""
    saw_first: dict[Share, Read] = {}  # share -> the read that saw it returning first
    for r in present:
        for sh in _shares(r, seen[id(r)], layout):
            cur = saw_first.get(sh)
            if cur is None or _ret(r) < _ret(cur):
                saw_first[sh] = r
    missed_last: dict[Share, Read] = {}  # share -> the read that did not see it called last
    by_pid = _by_pid(universe, layout)
    left = {(b, p) for b in universe for p in layout.keys(b)}
    shares = sorted(left)
    for r in sorted(present, key=lambda r: -r.call):
        if not left:
            break
        cand = _candidates(r, universe, by_pid, layout)
        newly = {(b, p) for b in cand for p in r.region.pids if (b, p) in left and layout.covered(b, r.region, p)}
        newly -= _shares(r, seen[id(r)], layout)
        for sh in newly:
            missed_last[sh] = r
        left -= newly
    ops: list[Operation] = []
    for sh in shares:
        ws, rs = reduce_batch(writes.get(sh[0], []), [missed_last[sh]] if sh in missed_last else [],
                              [saw_first[sh]] if sh in saw_first else [])
        ops += [as_operation(sh, w) for w in ws] + [as_operation(sh, r, r is saw_first.get(sh)) for r in rs]
    res = linearizable(REGISTER, ops, timeout_s=60)
    if not res.ok:
        problems.append(res.explain(REGISTER))
    return res.parts


def _shares(r: Read, seen: dict[int, frozenset[int]], layout: Layout) -> set[Share]:
    """The shares a read saw (rows of)."""
    return {(b, p) for b, ks in seen.items() for p, pks in layout.keys(b).items() if ks & pks}
