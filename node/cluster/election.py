"""One partition's election (RFC 0010 §5): fence a majority of its replicas at a new epoch,
choose the longest log among the answers, and write the placement with the epoch history.

The rounds are the driver's (``node/cluster/controller.py``) and the simulation's
(``tests/sim``) alike: what they need of the world — a fence sent to a replica, the
compare-and-set of the placement — comes through a :class:`Ballot`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from node.cluster.placement import PartitionPlace
from rowstore.errors import FencedError
from rowstore.replication.leader import clock_floor, lease_wait
from rowstore.segments.position import Position

log = logging.getLogger("terrascale.node.driver")
ROUNDS = 3  # elections refused by a promise of a later epoch, each run again above it


class Ballot(Protocol):
    """How an election reaches the world."""

    async def fence(self, node: str, epoch: int, force: bool) -> dict[str, Any]:
        """``node``'s promise of ``epoch``: its last epoch, log end (``pos``), clock, contact
        age; FencedError (with ``promised``) when it promised a later one, ConnectionError or
        TimeoutError when it does not answer."""

    async def write(self, was: PartitionPlace, new: PartitionPlace, floor: int) -> bool:
        """The placement entry ``was`` → ``new`` and ``new``'s epoch (with clock ``floor``) in
        the epoch history, in one compare-and-set; False when the entry changed meanwhile."""


def choose_leader(answers: dict[str, dict[str, Any]], need: int, prefer: str | None, was: str) -> str:
    """The longest log among a majority of promises (it holds every acknowledged write). A node
    that cannot take writes (its block device is full) is passed over while the others still
    make a majority: the longest log among *them* holds every acknowledged write too."""
    able = {n: a for n, a in answers.items() if a.get("writable", True)}
    pool = able if len(able) >= need else answers
    return max(pool, key=lambda n: (answers[n]["last"], tuple(answers[n]["pos"]), n == prefer, n == was, n))


def majority(n: int) -> int:
    return n // 2 + 1


@dataclass(frozen=True)
class Won:
    place: PartitionPlace  # the partition's new entry: its leader first
    answers: dict[str, dict[str, Any]]  # the promises it was chosen from


@dataclass(frozen=True)
class _Higher:
    epoch: int  # a replica had promised this (≥ the epoch asked): the next round goes above it


async def elect(p: PartitionPlace, voters: list[str], need: int, ballot: Ballot, lease_s: float, *,
                handoff: str | None = None, force: bool = False, prefer: str | None = None, where: str = "",
                sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> Won | None:
    """Elect a leader of the partition placed at ``p`` among ``voters`` (``need`` answers
    make a majority); the new entry, or None. ``handoff``: a planned change — that live leader
    is fenced first, so it has stopped before the followers are told to stop waiting for it,
    and is not chosen. ``force``: the followers promise even while they hear from the leader,
    so the placement is written only once its read lease ran out (:func:`lease_wait`)."""
    epoch = p.epoch + 1
    for _ in range(ROUNDS):
        got = await _elect_at(p, voters, need, epoch, ballot, lease_s, handoff, force, prefer, where, sleep)
        if not isinstance(got, _Higher):
            return got
        epoch = got.epoch + 1
    return None


async def _elect_at(p: PartitionPlace, voters: list[str], need: int, epoch: int, ballot: Ballot, lease_s: float,
                    handoff: str | None, force: bool, prefer: str | None, where: str,
                    sleep: Callable[[float], Awaitable[Any]]) -> Won | _Higher | None:
    if handoff is not None:
        try:
            await ballot.fence(handoff, epoch, False)
        except (ConnectionError, asyncio.TimeoutError, ValueError, FencedError) as e:
            log.info("event=handoff_refused partition=%s node=%s error=%r", where, handoff, e)
            return None
    rest = [n for n in voters if n != handoff]
    got = await asyncio.gather(*[ballot.fence(n, epoch, force or handoff is not None) for n in rest],
                               return_exceptions=True)
    ok = {n: g for n, g in zip(rest, got) if isinstance(g, dict)}
    # Every acknowledged write is on a majority: the longest log among a majority of answers
    # holds them all. A planned hand-over counts only the others' answers (the old leader's own
    # tail may hold writes no majority acknowledged: dropped, as after a crash).
    if len(ok) < need:
        log.info("event=election_failed partition=%s epoch=%d answers=%d need=%d why=%s", where, epoch, len(ok),
                 need, [repr(g)[:120] for g in got if not isinstance(g, dict)])
        promised = [g.promised for g in got if isinstance(g, FencedError) and g.promised >= epoch]
        if promised and len(ok) + len(promised) >= need:
            return _Higher(max(promised))
        return None
    if force and handoff is None and p.leader not in ok:
        await sleep(lease_wait(ok.values(), lease_s))
    chosen = choose_leader(ok, need, prefer, p.leader)
    new = PartitionPlace((chosen, *[n for n in p.replicas if n != chosen]), epoch, int(ok[chosen]["last"]),
                         cast(tuple[int, int], tuple(Position.of(ok[chosen]["pos"]))), p.leaving)  # (seq, offset)
    if not await ballot.write(p, new, clock_floor(ok.values(), lease_s)):
        return None
    return Won(new, ok)
