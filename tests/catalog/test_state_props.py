"""Property tests: the state machine against a dict model; log and snapshot codecs round-trip."""
import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from catalog.abc import Check, Delete, Put
from catalog.logfile import LogRecord, decode_record, encode_record
from catalog.state import CatalogState

keys = st.sampled_from(["a", "a/1", "a/2", "b", "b/é", "c\u4e2d", "zz"])
values = st.binary(max_size=20)
ops = st.lists(st.one_of(st.builds(Put, keys, values), st.builds(Delete, keys)), max_size=4,
               unique_by=lambda o: o.key)


class StateVsDict(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.s = CatalogState(dedup_capacity=5)
        self.model: dict[str, tuple[bytes, int]] = {}
        self.rev = 0

    @rule(ops=ops, check_keys=st.lists(keys, max_size=2), stale=st.booleans())
    def txn(self, ops, check_keys, stale):
        checks = [Check(k, self.model.get(k, (b"", 0))[1] + (1 if stale else 0)) for k in check_keys]
        r = self.s.apply(checks, ops)
        ok = not (stale and check_keys)
        assert r.committed == ok
        if ok:
            self.rev += 1
            for op in ops:
                if isinstance(op, Put):
                    self.model[op.key] = (op.value, self.rev)
                else:
                    self.model.pop(op.key, None)

    @rule()
    def snapshot_round_trip(self):
        self.s = CatalogState.restore(self.s.snapshot(), "mem", dedup_capacity=5)

    @rule(prefix=st.sampled_from(["", "a", "a/", "b", "z"]), limit=st.none() | st.integers(0, 5),
          reverse=st.booleans())
    def scan(self, prefix, limit, reverse):
        want = sorted((k for k in self.model if k.startswith(prefix)), key=lambda k: k.encode(), reverse=reverse)
        if limit is not None:
            want = want[:limit]
        assert [e.key for e in self.s.scan(prefix, limit=limit, reverse=reverse)] == want

    @invariant()
    def same(self):
        assert self.s.revision == self.rev
        for k, (v, ver) in self.model.items():
            e = self.s.get(k)
            assert e is not None and (e.value, e.version) == (v, ver)
        assert len(self.s) == len(self.model)


TestStateVsDict = StateVsDict.TestCase
TestStateVsDict.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@settings(max_examples=200, deadline=None)
@given(rev=st.integers(1, 2**63), rid=st.none() | st.text(min_size=1, max_size=64), ops=ops)
def test_log_record_round_trip(rev, rid, ops):
    rec = LogRecord(rev, rid, tuple(ops))
    raw = encode_record(rec)
    got, nxt = decode_record(b"xx" + raw, 2)
    assert got == rec and nxt == len(raw) + 2


@settings(max_examples=100, deadline=None)
@given(ops=ops, rid=st.text(min_size=1, max_size=10))
def test_request_ids_survive_snapshot(ops, rid):
    s = CatalogState()
    r = s.apply([], ops, rid)
    s2 = CatalogState.restore(s.snapshot(), "mem")
    assert s2.outcome(rid) == r
