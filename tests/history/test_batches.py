"""The batch workload's history checks (tests/history/batches.py) on small histories: one
clean, and one for each way a store can break its promises."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.history.batches import (FAILED, OK, REGISTER, History, HistoryViolation, Layout, Read, Region, Write,
                                   as_operation, check, reduce_batch)
from tests.history.linearizable import check as linearizable

LAYOUT = Layout(4, lambda keys: keys % 2)  # batch b: keys 4b..4b+3; even keys in partition 0, odd in 1
P0, P1, BOTH = Region(frozenset({0})), Region(frozenset({1})), Region(frozenset({0, 1}))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def rows(b: int, pids=(0, 1)) -> list[tuple[int, int]]:
    return [(k, b) for k in range(4 * b, 4 * b + 4) if k % 2 in pids]


def feed(*versions: tuple[int, int]) -> list[tuple[int, int]]:
    """(batch, commit_ts) -> the feed's (key, commit_ts) pairs of that whole version."""
    return [(k, ts) for b, ts in versions for k in range(4 * b, 4 * b + 4)]


def write(h: History, c: Clock, b: int, call: float, ret: float | None, ts: int | None = None, **kw) -> Write:
    c.t = call
    w = h.write("w", b, **kw)
    c.t = ret if ret is not None else call
    if ts is not None:
        w.ok(ts)
    elif ret is not None:
        w.unknown()
    return w


def read(h: History, c: Clock, region: Region, call: float, ret: float, T: int | None, seen, as_of=None) -> Read:
    c.t = call
    r = h.read("r", region, as_of)
    c.t = ret
    r.ok(T, seen)
    return r


@pytest.fixture
def hc():
    c = Clock()
    return History(c), c


def test_a_clean_history_passes_and_is_counted(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    write(h, c, 1, 0, 5)  # unknown, and it landed
    read(h, c, P0, 2, 3, 150, rows(0, (0,)))
    read(h, c, P0, 4, 6, 160, rows(0, (0,)) + rows(1, (0,)))  # overlaps batch 1's write: either is fine
    read(h, c, BOTH, 7, 8, 90, [], as_of=90)
    read(h, c, Region(frozenset({0, 1}), keys=frozenset({4})), 9, 10, None, [(4, 1)])  # a point get
    s = check(h, LAYOUT, feed((0, 100), (1, 155)), min_acked=1, min_reads=3)
    assert (s.acked, s.unknown, s.present_reads, s.as_of_reads) == (1, 1, 3, 1)
    assert s.batches == 4  # two batches, two partitions each


def test_a_read_that_misses_a_write_acknowledged_before_it_began(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, P0, 2, 3, 150, [])
    with pytest.raises(HistoryViolation, match="not linearizable") as e:
        check(h, LAYOUT, feed((0, 100)))
    assert "not the snapshot at its T" in str(e.value)


def test_a_batch_may_reach_one_partition_before_another_but_never_leave_one(hc):
    """A batch spanning nodes, decided and committing: partition 0's node applied it, partition
    1's not yet (its closed timestamp, and so its reads' T, still below the batch). Each
    partition on its own must never go back."""
    h, c = hc
    write(h, c, 0, 0, 10)  # the client learns nothing (its coordinator vanished)
    read(h, c, P0, 1, 2, 150, rows(0, (0,)))
    read(h, c, P1, 3, 4, 120, [])
    read(h, c, P1, 5, 6, 160, rows(0, (1,)))
    check(h, LAYOUT, feed((0, 140)))
    read(h, c, P0, 7, 8, 139, [])  # partition 0 again, at a T that excludes it: a stale read
    with pytest.raises(HistoryViolation, match="not linearizable") as e:
        check(h, LAYOUT, feed((0, 140)))
    assert "saw batch 0 in partition 0: False" in str(e.value)


def test_a_stale_snapshot_that_is_consistent_in_itself_is_caught_by_real_time(hc):
    """A read served from a replica that lags: T below an acknowledged commit, its rows exactly
    T's — the snapshot check alone would pass it."""
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, P0, 2, 3, 90, [])
    with pytest.raises(HistoryViolation) as e:
        check(h, LAYOUT, feed((0, 100)))
    assert "returned before it was called, yet its commit_ts is above the read's T" in str(e.value)
    assert "not the snapshot" not in str(e.value)


def test_a_commit_below_a_served_read(hc):
    """A read at T saw nothing; a write called after it returned commits at or below T: an
    as_of read at T now differs from the first."""
    h, c = hc
    read(h, c, P0, 0, 1, 150, [])
    write(h, c, 0, 2, 3, ts=140)
    read(h, c, P0, 4, 5, 150, rows(0, (0,)), as_of=150)
    with pytest.raises(HistoryViolation) as e:
        check(h, LAYOUT, feed((0, 140)))
    msg = str(e.value)
    assert "was called after it returned, yet its commit_ts is at or below the read's T" in msg
    assert "not the snapshot at its T: missed [(0, 140)]" in msg


def test_an_as_of_read_that_is_not_the_snapshot(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, BOTH, 2, 3, 99, rows(0), as_of=99)
    with pytest.raises(HistoryViolation, match=r"not the snapshot at its T: missed \[\], saw \[\(0, 100\)\]"):
        check(h, LAYOUT, feed((0, 100)))


def test_a_read_that_sees_a_batch_in_part(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, BOTH, 2, 3, 150, rows(0)[:3])
    with pytest.raises(HistoryViolation, match="saw batch 0 in part: 3 of the 4 rows"):
        check(h, LAYOUT, feed((0, 100)))


def test_a_version_committed_in_part(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    with pytest.raises(HistoryViolation, match="committed at 100 with 3 of its 4 rows"):
        check(h, LAYOUT, feed((0, 100))[:3])


def test_an_acknowledged_batch_lost(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, BOTH, 2, 3, 150, rows(0))
    read(h, c, BOTH, 4, 5, 160, [])  # the read at the end
    with pytest.raises(HistoryViolation) as e:
        check(h, LAYOUT, [])
    assert "(lost)" in str(e.value) and "not linearizable" in str(e.value)


def test_an_unknown_batch_decided_committed_must_be_there(hc):
    h, c = hc
    w = write(h, c, 0, 0, 1, txn=7)
    w.decided = "committed"
    with pytest.raises(HistoryViolation, match="its decision row says committed, and no partition holds it"):
        check(h, LAYOUT, [])
    assert check(h, LAYOUT, feed((0, 100))).decided_committed == 1


def test_an_unknown_batch_decided_aborted_must_be_absent(hc):
    h, c = hc
    w = write(h, c, 0, 0, 1, txn=7)
    w.decided = "aborted"
    assert check(h, LAYOUT, []).decided_aborted == 1
    with pytest.raises(HistoryViolation, match="though no write of it may have taken effect"):
        check(h, LAYOUT, feed((0, 100)))
    read(h, c, P0, 2, 3, 150, rows(0, (0,)))
    with pytest.raises(HistoryViolation, match="saw batches no write of which may have taken effect: \\[0\\]"):
        check(h, LAYOUT, [])


def test_a_batch_never_written(hc):
    h, c = hc
    with pytest.raises(HistoryViolation, match="batch 3 is present .* and was never written"):
        check(h, LAYOUT, feed((3, 100)))
    read(h, c, P0, 2, 3, 150, [(8, 1)])
    with pytest.raises(HistoryViolation, match="saw row 8 holding batch 1: never written"):
        check(h, LAYOUT, [])


def test_a_run_that_acknowledged_too_little_fails(hc):
    h, c = hc
    write(h, c, 0, 0, 1, ts=100)
    read(h, c, P0, 2, 3, 150, rows(0, (0,)))
    check(h, LAYOUT, feed((0, 100)), min_acked=1, min_reads=1)
    with pytest.raises(HistoryViolation, match="only 1 batches acknowledged"):
        check(h, LAYOUT, feed((0, 100)), min_acked=2)
    with pytest.raises(HistoryViolation, match="only 1 present reads answered"):
        check(h, LAYOUT, feed((0, 100)), min_reads=2)


@st.composite
def batch_histories(draw):
    """One batch's writes (ok, unknown or failed) and present reads (each saw it or not)."""
    c = Clock()
    h = History(c)
    for _ in range(draw(st.integers(0, 4))):
        call = draw(st.integers(0, 20))
        c.t = call
        w = h.write("w", 0)
        c.t = call + draw(st.integers(0, 6))
        status = draw(st.sampled_from([OK, OK, "unknown", FAILED]))
        w.ok(100) if status == OK else w.unknown() if status == "unknown" else w.failed()
    reads = []
    for _ in range(draw(st.integers(0, 5))):
        call = draw(st.integers(0, 24))
        c.t = call
        r = h.read("r", P0)
        c.t = call + draw(st.integers(0, 6))
        r.ok(None, rows(0, (0,)) if draw(st.booleans()) else [])
        reads.append(r)
    return h.writes, reads


@settings(max_examples=500, deadline=None)
@given(batch_histories())
def test_the_reduced_sub_history_decides_as_the_whole_one(hist):
    """``reduce_batch`` keeps one write and two reads of a share's sub-history: whether it is
    linearizable does not change (Wing & Gong's search on both)."""
    writes, reads = hist
    absent = [r for r in reads if not r.rows]
    present = [r for r in reads if r.rows]
    whole = [as_operation((0, 0), w) for w in writes if w.status != FAILED] + [as_operation((0, 0), r, bool(r.rows))
                                                                          for r in reads]
    ws, rs = reduce_batch(writes, absent, present)
    reduced = [as_operation((0, 0), w) for w in ws] + [as_operation((0, 0), r, bool(r.rows)) for r in rs]
    assert len(ws) <= 1 and len(rs) <= 2
    assert bool(linearizable(REGISTER, whole).ok) == bool(linearizable(REGISTER, reduced).ok)


def test_layout_names_each_batch_s_keys_by_partition():
    assert LAYOUT.keys(2) == {0: frozenset({8, 10}), 1: frozenset({9, 11})}
    assert LAYOUT.covered(2, Region(frozenset({1}), lo=10, hi=20)) == frozenset({11})
    assert LAYOUT.covered(2, Region(frozenset({0, 1}), keys=frozenset({8, 12}))) == frozenset({8})
    assert np.array_equal(LAYOUT.pids_of(np.arange(3)), [0, 1, 0])
