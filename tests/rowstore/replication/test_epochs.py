"""Where a replica's log is cut (rowstore.replication.epochs.cut_point), checked against
logs built the way elections build them: each epoch's leader continues its base epoch's log
up to its start, then writes its own bytes. Whatever the tree of epochs and whatever prefix
a replica holds, the kept part is a prefix of the current leader's log, and it keeps every
byte the two logs share (nothing a majority may have acknowledged is dropped)."""
import hypothesis.strategies as st
from hypothesis import given, settings

from catalog.abc import Put
from catalog.memory import MemoryCatalog
from rowstore.replication.epochs import Epoch, History, cut_point, replica_lasts
from rowstore.segments.position import Position
from rowstore.segments.records import SegmentRecord, SegState


@st.composite
def worlds(draw):
    """Epochs 1..n; epoch e continues a random earlier epoch b from a point of b's log; each
    writes its own bytes (tagged, so logs of different epochs differ)."""
    n = draw(st.integers(1, 8))
    logs = {0: b""}
    recs = []
    for e in range(1, n + 1):
        b = draw(st.sampled_from(sorted(logs)))
        cut = draw(st.integers(0, len(logs[b])))
        own = bytes([e]) * draw(st.integers(0, 6))
        logs[e] = logs[b][:cut] + own
        recs.append(Epoch(e, b, Position(1, cut)))
    last = draw(st.integers(0, n - 1)) if n > 1 else 0
    held = draw(st.integers(0, len(logs[last])))
    return logs, recs, last, held


def common(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=2000, deadline=None)
@given(worlds())
def test_the_kept_prefix_is_the_leaders_and_everything_shared_is_kept(w):
    logs, recs, last, held = w
    cur = recs[-1]
    replica = logs[last][:held]
    got = cut_point(last, Position(1, held), cur.epoch, cur.base, cur.start, recs[:-1])
    assert got is not None
    kept = replica[:got.offset]
    assert logs[cur.epoch].startswith(kept)  # a prefix of the leader's log
    # every byte provably shared through the epochs' lineage is kept: at least the bytes both
    # logs share that are below the first epoch boundary where they part (random bytes can
    # coincide beyond it; the cut never trusts a coincidence)
    assert got.offset <= held and got.offset <= common(replica, logs[cur.epoch])


def test_a_replica_of_the_base_epoch_is_cut_at_the_start():
    recs = [Epoch(1, 0, Position(0, 0)), Epoch(2, 1, Position(1, 100))]
    assert cut_point(1, Position(1, 150), 3, 2, Position(1, 120), recs) == Position(1, 100)
    assert cut_point(2, Position(1, 150), 3, 2, Position(1, 120), recs) == Position(1, 120)
    assert cut_point(2, Position(1, 110), 3, 2, Position(1, 120), recs) == Position(1, 110)  # a prefix: kept
    assert cut_point(1, Position(1, 150), 3, 2, Position(1, 120), recs[1:]) == Position(1, 100)
    assert cut_point(1, Position(1, 150), 9, 8, Position(1, 120), recs) is None  # the history does not reach


def test_the_history_keeps_the_newest_epochs():
    h = History([])
    for e in range(1, 100):
        h = h.with_epoch(Epoch(e, e - 1, Position(e, 0)))
    assert [x.epoch for x in h.epochs] == list(range(36, 100))
    assert History.from_bytes(h.to_bytes(), "k") == h


def test_an_epochs_clock_floor_round_trips_and_older_records_have_none():
    h = History([Epoch(1, 0, Position(0, 0)), Epoch(2, 1, Position(3, 40), floor=123 << 16)])
    assert History.from_bytes(h.to_bytes(), "k") == h
    old = History.from_bytes(b'{"epochs":[[1,0,0,0],[2,1,3,40]]}', "k")  # written before floors
    assert [e.floor for e in old.epochs] == [0, 0]


@settings(max_examples=1000, deadline=None)
@given(worlds(), st.integers(1, 4))
def test_pruning_keeps_every_record_a_known_replica_needs(w, keep):
    """However many epochs pass, a replica whose last epoch the pruning is told of gets the same
    cut from the pruned history as from the whole one (KEEP made tiny to prune hard)."""
    import rowstore.replication.epochs as epochs

    logs, recs, last, held = w
    full = History(list(recs))
    old, epochs.KEEP = epochs.KEEP, keep
    try:
        pruned = History([])
        # each election writes its epoch, told the replicas' last epochs: the replica's, and
        # those of every replica a later election chooses (a later epoch's base was one)
        for r in recs:
            pruned = pruned.with_epoch(r, needed=[last, *(x.base for x in recs if x.base <= r.epoch)])
    finally:
        epochs.KEEP = old
    cur = recs[-1]
    want = cut_point(last, Position(1, held), cur.epoch, cur.base, cur.start, full.epochs)
    assert cut_point(last, Position(1, held), cur.epoch, cur.base, cur.start, pruned.epochs) == want


async def test_a_former_leaders_own_log_keeps_its_epoch_in_the_history_however_many_elections_pass():
    """A node that led epoch 2, then was away while 70 elections passed, holds its log as its own
    (segment rows naming it, no replica row): the history kept by those elections still reaches
    its epoch, so the node's log is cut where it parts from the leader's, not copied whole
    again (the open hole RFC 0010 named: only replica rows' epochs were kept)."""
    cat = MemoryCatalog()
    own = SegmentRecord(9, "T", 0, SegState.SEALED, "n3", 1, seq=2, epoch=2)
    other = SegmentRecord(10, "T", 1, SegState.ACTIVE, "n3", 2, seq=1, epoch=5)  # another partition
    await cat.txn([], [Put(own.key, own.to_bytes()), Put(other.key, other.to_bytes())])
    assert await replica_lasts(cat, "T", 0) == [2]
    recs = [Epoch(e, e - 1, Position(e, 0)) for e in range(1, 71)]
    h = History([])
    for r in recs:
        h = h.with_epoch(r, await replica_lasts(cat, "T", 0))
    assert len(h.epochs) < len(recs)  # pruned all the same
    want = cut_point(2, Position(3, 50), 71, 70, Position(71, 0), recs)
    assert want == Position(3, 0)
    assert cut_point(2, Position(3, 50), 71, 70, Position(71, 0), h.epochs) == want
