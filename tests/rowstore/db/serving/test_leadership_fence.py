"""A fence that reaches the partition's own leader (rowstore/db/serving/leadership.py).

The rebalancer hands a partition over by fencing its live leader first. The leader steps down,
which drops its replica record from memory, and the record is reloaded to answer the promise.
A reloaded record counts as "just heard from a leader" (a restarted follower may have
acknowledged one a moment ago). With its whole log offloaded, the node holds no segments of
its own, so the promise went through the follower rule, and it answered "heard from leader 0.00
s ago": every hand-over failed and left the partition unled. The next election and the next
hand-over repeated it (found in `make test`: partitions unled for over a minute in the GC
cluster test with kills). The leader itself has no other leader to wait for."""
from types import SimpleNamespace

import pytest

from catalog.memory import MemoryCatalog
from rowstore.db.serving.leadership import Leadership
from rowstore.replication.follower import LeaderAliveError, ReplicaStore
from rowstore.replication.leader import Shipper
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def node(clock, present=None):
    fs = TerrascaleFS(MemoryCatalog(), MemoryBlockDevice(), MemoryBlockDevice(durable=False), MemoryObjectStore(),
                      config=FsConfig(node_id="n1"))
    await fs.open()
    replicas = ReplicaStore(fs, lease_s=1.0, monotonic=clock)

    async def no_own_log(table_id, pid):  # every segment of the partition was offloaded
        return None
    store = SimpleNamespace(shippers={}, own_log=no_own_log, not_led=set(), release_local=lambda t, p: [],
                            fs=fs, epochs={}, node="n1")
    return Leadership(store, replicas, SimpleNamespace(get=lambda tid: None), decide=None, observe=lambda ts: None,
                      observe_durably=_nothing, present=present or (lambda: 0), hold_present=lambda ts: None,
                      monotonic=clock), store


async def _nothing(ts: int) -> None:
    """No election floor to persist: these tests never promote."""


@pytest.mark.parametrize("was_leading", [True, False])
async def test_the_leader_fenced_for_a_hand_over_promises_even_with_its_whole_log_offloaded(was_leading):
    clock = Clock()
    lead, store = await node(clock)
    if was_leading:
        store.shippers[("T", 0)] = Shipper("T", 0, 3, 2, (0, 0), [], None, lease_s=1.0, on_fenced=lambda sh: None,
                                           clock=lambda: 0, monotonic=clock)
        got = await lead.fence("T", 0, 4)
        assert got["last"] == 0 and list(got["pos"]) == [0, 0] and ("T", 0) not in store.shippers
        with pytest.raises(Exception, match="not above the promised 4"):
            await lead.fence("T", 0, 4)  # the promise is recorded
    else:  # a follower that (re)loaded its record just now still waits out a leader's lease
        with pytest.raises(LeaderAliveError):
            await lead.fence("T", 0, 4)
        clock.now += 1.1
        assert (await lead.fence("T", 0, 4))["last"] == 0


async def test_a_node_without_a_log_of_its_own_answers_its_own_clock_too():
    """A leader that restarted with its whole log offloaded answers a fence through the follower
    rule, where the clock in the answer was only the last one a leader had sent it — none, for
    itself. The reads it served up to its present then were above the new epoch's floor when
    the follower that gave it its lease was not among the answers (simulation seed 5199: the
    new leader refused a repeatable read at T as future, its clock below T)."""
    clock = Clock()
    present = 7 << 40
    lead, _ = await node(clock, present=lambda: present)
    with pytest.raises(LeaderAliveError):  # its record, loaded now, counts as just reached
        await lead.fence("T", 0, 4)
    clock.now += 1.1
    assert (await lead.fence("T", 0, 4))["clock"] == present

