"""The change feed's windows (rowstore/db/read/feed.py): consecutive, covering the interval,
each holding about the asked number of changes by the segments' estimates."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rowstore.db.read.feed import windows
from rowstore.segments.records import SegmentRecord, SegState


def _rec(lo: int, hi: int, rows: int) -> SegmentRecord:
    return SegmentRecord(1, "t", 0, SegState.SEALED, "n1", 1, rows=rows, min_ts=lo, max_ts=hi)


def _estimate(recs, a: int, b: int) -> float:
    return sum(r.rows * max(0, min(r.max_ts, b) - max(r.min_ts - 1, a)) / (r.max_ts - r.min_ts + 1) for r in recs)


segs = st.lists(st.tuples(st.integers(1, 10_000), st.integers(0, 5_000), st.integers(0, 3_000)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(segs, st.integers(1, 2_000))
def test_windows_cover_the_interval_each_with_about_the_rows_asked(spans, rows):
    recs = [_rec(lo, lo + w, n) for lo, w, n in spans]
    after, T = 0, 16_000
    out = windows(recs, after, T, rows)
    assert out[0][0] == after and out[-1][1] == T
    assert all(a < b for a, b in out) and all(x[1] == y[0] for x, y in zip(out, out[1:]))
    if sum(r.rows for r in recs) <= rows:
        assert out == [(after, T)]
    for a, b in out:  # a piece of one interval, cut evenly, may be one timestamp over
        assert _estimate(recs, a, b) <= rows * 1.01 + max((r.rows / (r.max_ts - r.min_ts + 1) for r in recs),
                                                          default=0) * len(recs), (a, b)
