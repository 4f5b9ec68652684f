"""The Raft journal and dump files (docs/format/raft-journal.md): torn tails cut, damage refused."""
import os

import pytest
from hypothesis import given, settings, strategies as st

from catalog.errors import CatalogCorruptionError
from catalog.raft.journal import DurableJournal, decode_dump, encode_dump
from catalog.state import CatalogState
from catalog.abc import Put


def fill(path, n=10):
    j = DurableJournal(str(path))
    for i in range(1, n + 1):
        j.add(b"\x00cmd-%d" % i, i, 1 + i // 4)
    j.sync()
    j._destroy()
    (name,) = [f for f in os.listdir(path) if f.startswith("journal-")]
    return os.path.join(path, name)


def record_starts(raw: bytes) -> list[int]:
    out, i = [], raw.find(b"TRJR")
    while i >= 0:
        out.append(i)
        i = raw.find(b"TRJR", i + 1)
    return out


def test_reopen_gives_the_same_entries(tmp_path):
    fill(tmp_path)
    j = DurableJournal(str(tmp_path))
    assert len(j) == 10 and j[0] == (b"\x00cmd-1", 1, 1) and j[-1] == (b"\x00cmd-10", 10, 3)


def test_torn_tail_at_every_offset(tmp_path):
    f = fill(tmp_path)
    raw = open(f, "rb").read()
    last = record_starts(raw)[-1]
    for cut in range(last, len(raw)):
        open(f, "wb").write(raw[:cut])
        j = DurableJournal(str(tmp_path))
        assert len(j) == 9 and (j.torn_tail is not None) == (cut > last), cut
        j.add(b"\x00again", 10, 3)
        j.sync()
        j._destroy()
        assert DurableJournal(str(tmp_path))[-1] == (b"\x00again", 10, 3)


def test_damage_before_a_valid_record_is_corruption_and_nothing_is_cut(tmp_path):
    f = fill(tmp_path)
    raw = bytearray(open(f, "rb").read())
    at = record_starts(bytes(raw))[3] + 20
    raw[at] ^= 1
    open(f, "wb").write(raw)
    with pytest.raises(CatalogCorruptionError) as ei:
        DurableJournal(str(tmp_path))
    assert ei.value.where == f and ei.value.offset == at - 20
    assert os.path.getsize(f) == len(raw)


def test_suffix_cut_and_compaction_survive_reopen(tmp_path):
    fill(tmp_path)
    j = DurableJournal(str(tmp_path))
    j.deleteEntriesFrom(7)  # Raft: a new leader overwrote indexes 8..10
    j.add(b"\x00new-8", 8, 5)
    j.sync()
    j.deleteEntriesTo(3)  # compaction: the dump covers 1..3
    j._destroy()
    j = DurableJournal(str(tmp_path))
    assert [e[1] for e in j[:]] == [4, 5, 6, 7, 8] and j[-1] == (b"\x00new-8", 8, 5)
    assert len([f for f in os.listdir(tmp_path) if f.startswith("journal-")]) == 1


def test_meta_roundtrip_and_damage(tmp_path):
    j = DurableJournal(str(tmp_path))
    j.setCurrentTerm(3, "127.0.0.1:9")
    j.setRaftCommitIndex(42)
    j.onOneSecondTimer()
    j2 = DurableJournal(str(tmp_path))
    assert (j2.getCurrentTerm(), j2.getVotedForNodeId(), j2.getRaftCommitIndex()) == (3, "127.0.0.1:9", 42)
    p = tmp_path / "meta.trm"
    raw = bytearray(p.read_bytes())
    raw[12] ^= 1
    p.write_bytes(raw)
    with pytest.raises(CatalogCorruptionError, match="meta"):
        DurableJournal(str(tmp_path))


@settings(max_examples=50, deadline=None)
@given(keys=st.dictionaries(st.text(min_size=1, max_size=20).filter(lambda k: "\x00" not in k),
                            st.binary(max_size=50), max_size=20),
       members=st.lists(st.from_regex(r"127\.0\.0\.1:[1-9][0-9]{3}", fullmatch=True), max_size=5))
def test_dump_roundtrip(keys, members):
    s = CatalogState()
    if keys:
        s.apply([], [Put(k, v) for k, v in keys.items()], "rid")
    raw = encode_dump((b"\x00a", 9, 2), (b"\x01", 8, 2), members, s.snapshot())
    last, prev, m, state = decode_dump(raw, "dump")
    assert (last, prev, m) == ((b"\x00a", 9, 2), (b"\x01", 8, 2), members)
    assert CatalogState.restore(state, "dump").scan() == s.scan()
    bad = bytearray(raw)
    bad[len(raw) // 2] ^= 1
    with pytest.raises(CatalogCorruptionError):
        decode_dump(bytes(bad), "dump")


async def test_a_damaged_dump_stops_open(tmp_path):
    from catalog.raft import RaftCatalog

    (tmp_path / "dump.trd").write_bytes(b"TRRAFTD1" + b"\x00" * 40)
    c = RaftCatalog(["127.0.0.1:1"], "127.0.0.1:1", str(tmp_path), "0123456789abcdef")
    with pytest.raises(CatalogCorruptionError, match="dump"):
        await c.open()


class _Failing:
    """Wraps a real function: its first ``n`` calls fail with ``err`` (a seeded fault, no mock)."""

    def __init__(self, fn, n, err):
        self.fn, self.n, self.err, self.calls = fn, n, err, 0

    def __call__(self, *a, **kw):
        self.calls += 1
        if self.calls <= self.n:
            raise OSError(self.err, os.strerror(self.err))
        return self.fn(*a, **kw)


def test_term_and_vote_write_retries_transient_errors_and_never_gives_up(tmp_path, monkeypatch):
    import errno

    import catalog.raft.journal as jmod
    from catalog.raft.journal import JournalError

    j = DurableJournal(str(tmp_path))
    shed = []
    j.on_retry = lambda: shed.append(1)
    flaky = _Failing(jmod.atomic_write, 4, errno.EMFILE)
    monkeypatch.setattr(jmod, "atomic_write", flaky)
    j.setCurrentTerm(7, "127.0.0.1:1")  # too many open files, four times: waited out
    assert flaky.calls == 5 and j.retries == 4 and len(shed) == 4
    j._destroy()
    again = DurableJournal(str(tmp_path))
    assert again.getCurrentTerm() == 7 and again.getVotedForNodeId() == "127.0.0.1:1"
    monkeypatch.setattr(jmod, "atomic_write", _Failing(flaky.fn, 1, errno.EIO))
    with pytest.raises(JournalError):  # a real I/O error still stops the replica
        again.setCurrentTerm(8, None)
    monkeypatch.setattr(jmod, "atomic_write", _Failing(flaky.fn, 10**9, errno.ENFILE))
    again.stopping = lambda: True  # a stopping replica does not wait
    with pytest.raises(JournalError):
        again.setCurrentTerm(9, None)
    again._fd = -1


def test_compaction_retries_transient_errors(tmp_path, monkeypatch):
    import errno

    import catalog.raft.journal as jmod

    j = DurableJournal(str(tmp_path))
    for i in range(1, 6):
        j.add(b"\x01", i, 1)
    j.sync()
    monkeypatch.setattr(jmod.os, "open", _Failing(os.open, 2, errno.EMFILE))
    j.deleteEntriesTo(3)
    monkeypatch.undo()
    assert [e[1] for e in j] == [4, 5] and j.retries == 2
    j._destroy()
    assert [e[1] for e in DurableJournal(str(tmp_path))] == [4, 5]
