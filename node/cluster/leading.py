"""What a node does about a partition the placement names — the reconcile rules of RFC 0010
§5 as pure functions, so that the node layer (``node/cluster/controller.py``) and the seeded
simulation (``tests/sim/nodes.py``) act on the same rules, not on two copies of them."""
from __future__ import annotations

import enum
from collections.abc import Sequence

from rowstore.replication.leader import Shipper


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
