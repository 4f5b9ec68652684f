"""What a node does about a partition the placement names — the reconcile rules of RFC 0010
§5 as pure functions, so that the node layer (``node/cluster/controller.py``) and the seeded
simulation (``tests/sim/nodes.py``) act on the same rules, not on two copies of them."""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rowstore.replication.leader import Shipper, Transport
from rowstore.segments.position import Position

if TYPE_CHECKING:
    from rowstore.db.database import Database
    from rowstore.tables.definitions import TableDef


class Step(enum.Enum):
    """A reconcile's step for one partition."""

    TAKE = "take"  # the placement names this node leader: lead it (``take_step`` says how)
    FOLLOWERS = "followers"  # lead on, with the placement's followers (a rebalancing moved one)
    DEMOTE = "demote"  # another node leads it: stop


class Take(enum.Enum):
    """How a node takes a partition the placement names it leader of."""

    PROMOTE = "promote"  # the epoch came from an election naming it (or the table is new): lead at it
    ELECT = "elect"  # it led at this epoch before (a restart: another replica may hold more), or
    #                  was fenced beyond it (an election that did not finish): an election of its own first
    WAIT = "wait"  # someone's election fenced it just now: let that election finish


def reconcile_step(me: str, leader: str, epoch: int, replicas: Sequence[str], sh: Shipper | None) -> Step | None:
    """The step for a partition led by ``leader`` at ``epoch`` over ``replicas`` (leader first),
    given what this node ``me`` leads of it (``sh``); None: nothing to do."""
    if leader == me:
        if sh is None or sh.epoch < epoch or sh.fenced is not None:
            return Step.TAKE
        return Step.FOLLOWERS if sh.followers != list(replicas[1:]) else None
    return Step.DEMOTE if sh is not None else None


async def how_to_take(db: Database, me: str, table_id: str, pid: int, epoch: int, outvoted: int,
                      clock: Callable[[], float], failure_timeout: float) -> Take:
    """``take_step`` on what ``db`` knows of partition ``pid``: whether ``me`` owned a segment of
    it at ``epoch``, the highest epoch it was fenced with (``outvoted``: by a follower's answer
    while leading) and when — on ``clock`` read once the records are listed."""
    key = (table_id, pid)
    recs = [r for r in await db.store.list(table=table_id) if r.partition == pid]
    return take_step(epoch, any(r.epoch == epoch for r in recs if r.owner == me),
                     max(outvoted, db.leadership.fenced_epoch.get(key, 0)),
                     db.leadership.fenced_at.get(key), clock(), failure_timeout)


async def lead(db: Database, d: TableDef, pid: int, epoch: int, base: int, start: Position,
               followers: list[str], transport: Transport, lease_s: float,
               on_fenced: Callable[[Shipper], None]) -> None:
    """Lead ``pid`` at ``epoch``, demoting first a shipper of it that was fenced."""
    sh = db.leadership.shipper(d.table_id, pid)
    if sh is not None and sh.fenced is not None:
        await db.leadership.demote(d.table_id, pid)
    await db.leadership.promote(d, pid, epoch, base, start, followers, transport, lease_s, on_fenced=on_fenced)


def take_step(epoch: int, led_at_epoch: bool, beyond: int, fenced_at: float | None, now: float,
              failure_timeout: float) -> Take:
    """How to take a partition placed at ``epoch``: ``led_at_epoch`` — this node owned a segment
    of it at that epoch; ``beyond`` — the highest epoch anyone fenced it with; ``fenced_at`` —
    when (monotonic) it was last fenced, if ever. Taking an epoch led before again would lead
    with a log that may be shorter than another replica's (a restart, a lost disk), and taking
    one fenced beyond would only be fenced again, for ever."""
    if beyond > epoch or led_at_epoch:
        if fenced_at is not None and now - fenced_at < failure_timeout:
            return Take.WAIT
        return Take.ELECT
    return Take.PROMOTE
