"""Which replica a move that cannot finish drops (node/cluster/rebalance.py, RFC 0010 §7),
against a driver double that records the placement writes: the newcomer, or one of the first
three only once the leader, shipping to all four, reported a follower that stays at its log
end. The nemesis suite's seed 140 lost a committed batch's share when a move dropped one of
the first three early: writes acknowledged before the move were on two of the first three
only (the dropped one and the leaving one, which then went silent), and the three that stayed
elected a log without them."""
import json
import logging

from node.cluster.placement import PartitionPlace, Placement
from node.cluster.rebalance import Rebalancer
from rowstore.tables.definitions import TableDef


class Cluster:
    def __init__(self, members: set[str], lag: dict[str, int] | None):
        self.members, self.lag = members, lag  # lag None: the leader does not answer

    async def placeable(self) -> list[str]:
        return sorted(self.members)

    async def call(self, node: str, method: str, path: str):
        if self.lag is None:
            raise ConnectionError(f"{node}: no answer")
        led = {"t/0": {"followers": {n: {"lag_bytes": b} for n, b in self.lag.items()}}}
        return 200, {}, json.dumps({"replication": {"led": led}}).encode()


class Cfg:
    failure_timeout_s = 1.0


class Driver:
    def __init__(self, members: set[str], dead: set[str], lag: dict[str, int] | None, elects: bool = False):
        self.cluster, self.cfg, self.dead = Cluster(members, lag), Cfg(), dead
        self.elects, self.written = elects, []

    async def elect(self, d, pid, exclude, handoff=None, force=False, prefer=None) -> bool:
        return self.elects

    async def _write_place(self, name, pid, was, new, table_id=None, floor=0) -> bool:
        self.written.append(new)
        return True


def table(p: PartitionPlace) -> list[tuple[TableDef, Placement]]:
    return [(TableDef("t", "tid", 1, (), None, 0), Placement((p,)))]


# n1 leads, n3 is moving to n5 (the newcomer, last): four replicas while the move runs
MOVING = PartitionPlace(("n1", "n2", "n3", "n5"), 1, leaving="n3")


async def test_a_third_replica_that_left_is_dropped_only_once_a_follower_that_stays_holds_the_log(caplog):
    """n2 left (dead): {n1, n2} may be all that holds a write acknowledged before the move, so
    n2 goes only once the leader, shipping to all four, reports n3 or n5 at its log end. A move
    that waits says why, once while nothing changes."""
    caplog.set_level(logging.WARNING, "terrascale.node.rebalance")
    for lag in ({"n2": 0, "n3": 512, "n5": 4096},  # neither that stays at the end
                {"n2": 0, "n3": 0}):  # the leader does not ship to n5 yet: it counts over three
        drv = Driver({"n1", "n3", "n5"}, {"n2"}, lag)
        r = Rebalancer(drv)
        caplog.clear()
        assert await r.step(table(MOVING)) is False and await r.step(table(MOVING)) is False
        assert drv.written == []
        waits = [m for m in caplog.messages if "event=replica_move_waiting" in m]
        assert len(waits) == 1 and "n2 gone" in waits[0] and "n3=" in waits[0], waits
    for lag in ({"n2": 0, "n3": 0, "n5": 4096}, {"n2": 4096, "n3": 512, "n5": 0}):
        drv = Driver({"n1", "n3", "n5"}, {"n2"}, lag)
        assert await Rebalancer(drv).step(table(MOVING)) is True
        assert drv.written[0].replicas == ("n1", "n3", "n5") and not drv.written[0].leaving


async def test_a_newcomer_that_left_is_dropped_at_once():
    drv = Driver({"n1", "n2", "n3"}, set(), None)
    assert await Rebalancer(drv).step(table(MOVING)) is True
    assert drv.written[0].replicas == ("n1", "n2", "n3") and not drv.written[0].leaving


async def test_a_leader_that_left_with_no_election_winning_drops_the_newcomer_not_a_dead_follower():
    """The leader removed, n2 dead: with four replicas no election wins. Dropping n2 would let
    {n3, n5} elect — and n5 may lack what {n1, n2} acknowledged; dropping the newcomer leaves
    the first three, whose majority holds every acknowledged write."""
    drv = Driver({"n2", "n3", "n5"}, {"n2"}, None, elects=False)
    assert await Rebalancer(drv).step(table(MOVING)) is True
    assert drv.written[0].replicas == ("n1", "n2", "n3") and not drv.written[0].leaving
