"""Hypothesis state machine: appends, seal+offload and crashes against a plain list model.

Every acknowledged row must read back by rowid, from an active file or an
object, after any sequence of steps, crashes included.
"""
import asyncio

import hypothesis.strategies as st
import numpy as np
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.rowstore.segments.test_store import World
from tests.rowstore.segments.test_segments import KEYS, S1, batch


class SegmentMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.world = World()
        self.store = self.run(self.world.start())
        self.seg = self.run(self.store.create("t", 0))
        self.model: dict[int, int] = {}  # rowid -> id column value
        self.next_id = 0

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def teardown(self):
        self.loop.close()

    @rule(n=st.integers(1, 300), ts=st.integers(1, 10**6))
    def append(self, n, ts):
        ids = self.run(self.seg.append(batch(self.next_id, self.next_id + n), S1, ts))
        for i, rid in enumerate(ids.tolist()):
            self.model[rid] = self.next_id + i
        self.next_id += n

    @precondition(lambda self: self.seg.durable_rows > 0)
    @rule()
    def seal_and_offload(self):
        self.run(self.store.seal(self.seg.segid))
        self.run(self.store.offload(self.seg.segid, KEYS))
        self.seg = self.run(self.store.create("t", 0))

    @rule(tear=st.booleans())
    def crash(self, tear):
        # Appends are all acknowledged here, so only never-acknowledged bytes may go.
        self.world.block.crash(tear_seed=7 if tear else None)
        segid = self.seg.segid
        self.store = self.run(self.world.start())
        self.seg = self.store.active[segid]

    @invariant()
    def every_acknowledged_row_reads_back(self):
        if not self.model:
            return
        rids = np.array(sorted(self.model), np.uint64)
        for segid in np.unique(rids >> np.uint64(32)):
            mine = rids[(rids >> np.uint64(32)) == segid]
            sample = mine[:: max(len(mine) // 20, 1)]
            got = self.run(self.store.get(sample, S1)).batch.column("id").to_pylist()
            assert got == [self.model[int(r)] for r in sample]


TestSegmentMachine = SegmentMachine.TestCase
TestSegmentMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)
