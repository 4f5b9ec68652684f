"""The PK memtable against a dict-of-versions model, at random past timestamps."""
import numpy as np
import pyarrow as pa
import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from rowstore.index.key_memtable import MemTable, Run, _lookup, find_one, merge_runs
from rowstore.rowids import TOMBSTONE
from rowstore.tables.keys import decode_keys, encode_keys, encode_one

EXTREMES = [-2**63, -2**63 + 1, -1, 2**63 - 2, 2**63 - 1]  # around the sign bit the encoding flips


class MemtableVsModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kind = "int64"
        self.mt = MemTable(self.kind)
        self.model: dict[int, list[tuple[int, int]]] = {}  # key -> [(ts, rowid)]
        self.ts = 1 << 40
        self.rowid = 1 << 32
        self.pending = []  # (runs, the runs merged) not yet put back

    @rule(keys=st.lists(st.integers(-50, 50) | st.sampled_from(EXTREMES), min_size=1, max_size=30, unique=True),
          deletes=st.lists(st.booleans(), min_size=30, max_size=30), gap=st.integers(1, 1 << 20))
    def batch(self, keys, deletes, gap):
        self.ts += gap
        rowids = []
        for k, d in zip(keys, deletes):
            self.rowid += 1
            r = int(TOMBSTONE) if d else self.rowid
            rowids.append(r)
            self.model.setdefault(k, []).append((self.ts, r))
        self.mt.insert(encode_keys(pa.array(keys, pa.int64()), "int64"), self.ts, np.array(rowids, np.uint64))

    def expected(self, key, as_of):
        vs = [(t, r) for t, r in self.model.get(key, []) if t <= as_of]
        return max(vs)[1] if vs else 0

    @rule(keys=st.lists(st.integers(-60, 60), min_size=1, max_size=100), back=st.integers(0, 1 << 22))
    def get(self, keys, back):
        as_of = self.ts - back
        got = self.mt.get(encode_keys(pa.array(keys, pa.int64()), "int64"), as_of)
        assert got.tolist() == [self.expected(k, as_of) for k in keys]

    @rule(keys=st.lists(st.integers(-60, 60) | st.sampled_from(EXTREMES), min_size=1, max_size=20),
          back=st.integers(0, 1 << 22))
    def get_one(self, keys, back):
        as_of = self.ts - back
        assert [self.mt.get_one(encode_one(k, "int64"), as_of) for k in keys] == \
            [self.expected(k, as_of) for k in keys]

    @rule(lo=st.integers(-60, 60), span=st.integers(0, 120), back=st.integers(0, 1 << 22))
    def scan(self, lo, span, back):
        as_of = self.ts - back
        enc = lambda v: encode_keys(pa.array([v], pa.int64()), "int64")  # noqa: E731
        run = self.mt.scan(enc(lo)[0], enc(lo + span)[0], as_of)
        want = sorted((k, self.expected(k, as_of)) for k in self.model
                      if lo <= k < lo + span and self.expected(k, as_of) not in (0, int(TOMBSTONE)))
        assert list(zip(decode_keys(run.keys, "int64"), run.rowids.tolist())) == want

    @rule()
    def start_merge(self):  # what a worker thread merges, while inserts and reads go on
        due = self.mt.merge_due()
        if due is not None:
            self.pending.append((due, merge_runs(list(due))))

    @rule(which=st.integers(0, 3))
    def finish_merge(self, which):  # maybe stale: the pair may be merged or consolidated already
        if self.pending:
            due, merged = self.pending.pop(which % len(self.pending))
            self.mt.replace(due, merged)

    @invariant()
    def counted(self):
        assert self.mt.entries == sum(len(v) for v in self.model.values())


TestMemtable = MemtableVsModel.TestCase
TestMemtable.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_string_and_uuid_keys():
    for kind, vals in (("string", ["b", "a", "ab", "é", ""]), ("uuid", [bytes([i]) * 16 for i in (3, 1, 2)])):
        mt = MemTable(kind)
        arr = pa.array(vals, pa.binary(16) if kind == "uuid" else pa.string())
        mt.insert(encode_keys(arr, kind), 10, np.arange(1, len(vals) + 1, dtype=np.uint64) + (1 << 32))
        run = mt.scan(None, None, 10)
        order = sorted(range(len(vals)), key=lambda i: vals[i].encode() if kind == "string" else vals[i])
        assert decode_keys(run.keys, kind) == [vals[i] for i in order]
        assert mt.get(encode_keys(arr, kind), 9).tolist() == [0] * len(vals)


@settings(max_examples=60, deadline=None)
@given(entries=st.lists(st.tuples(st.text(alphabet="abc\u00e9", max_size=4), st.integers(1, 6)), max_size=40),
       probes=st.lists(st.text(alphabet="abc\u00e9", max_size=6), min_size=1, max_size=10), as_of=st.integers(0, 7))
def test_find_one_equals_vectorized_lookup_for_string_keys(entries, probes, as_of):
    """The scalar search (numpy ``searchsorted`` for byte keys) against ``_lookup``, longer probes included."""
    keys = encode_keys(pa.array([k for k, _ in entries] or ["a"], pa.string()), "string")[: len(entries)]
    ts = np.array([t for _, t in entries], np.uint64)
    order = np.lexsort((np.iinfo(np.uint64).max - ts, keys))
    run = Run(keys[order], ts[order], np.arange(1, len(entries) + 1, dtype=np.uint64)[order])
    want_r, want_t = _lookup(run, encode_keys(pa.array(probes, pa.string()), "string"), as_of)
    got = [find_one(run, encode_one(p, "string"), as_of) for p in probes]
    assert got == list(zip(want_r.tolist(), want_t.tolist()))


_KEY = st.binary(min_size=1, max_size=6).filter(lambda b: b[-1] != 0)  # a key never ends in NUL


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(_KEY, st.integers(1, 6)), max_size=40), min_size=2, max_size=5))
def test_byte_key_runs_merge_as_one_stable_sort_of_them_all(runs_spec):
    """Merging byte-key runs by searches and copies gives exactly the stable sort of their
    concatenation in (key asc, ts desc) order — the earlier run's entry first on a tie —
    whatever their sizes (the smaller goes into the larger) and widths."""
    from rowstore.index.key_memtable import sort_run
    runs, next_id = [], 1
    for spec in runs_spec:
        entries = sorted(set(spec), key=lambda e: (e[0], -e[1]))
        keys = np.array([k for k, _ in entries], dtype=f"S{max([len(k) for k, _ in entries] + [1])}")
        ts = np.array([t for _, t in entries], np.uint64)
        runs.append(Run(keys, ts, np.arange(next_id, next_id + len(entries), dtype=np.uint64)))
        next_id += len(entries)
    got = merge_runs(runs)
    width = max(r.keys.dtype.itemsize for r in runs)
    want = sort_run(np.concatenate([r.keys.astype(f"S{width}") for r in runs]),
                    np.concatenate([r.ts for r in runs]), np.concatenate([r.rowids for r in runs]))
    assert got.keys.tolist() == want.keys.tolist() and got.ts.tolist() == want.ts.tolist()
    assert got.rowids.tolist() == want.rowids.tolist()
