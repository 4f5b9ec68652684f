"""A linearizability checker: Wing & Gong's search (J. Parallel Distrib. Comput. 17, 1993)
with Lowe's memoisation of visited configurations ("Testing for linearizability", 2017) and
Porcupine's partitioning of a history into independent sub-histories
(github.com/anishathalye/porcupine, ``checker.go``, ``model.go``).

A history is a list of :class:`Operation`: each has the time it was called, the time it
returned (``None``: it never did — a call whose outcome the client does not know, which may
take effect at any moment after its call or never), what it was asked and what it answered.
It is *linearizable* under a sequential :class:`Model` when each operation can be given a
point between its call and its return such that applying them one by one in the order of
those points, from the model's initial state, answers what each operation answered.

The search (``_check_one``): the calls and returns sorted by time, a call before a return at
the same instant (so operations that touch are taken as concurrent: never a false alarm), in
a doubly linked list. Walking it, a call whose operation the model accepts in the current
state is *lifted* (its call and return unlinked; the operation is linearized next) and the
walk starts over at the head; one it refuses is skipped. Reaching a return means its
operation's call is still in the list, unlinearized, and nothing before it could be chosen:
the last choice is undone (unlifted) and the walk goes on after it. An empty list is a
linearization; undoing with nothing to undo proves there is none. Lowe's refinement: a
configuration — the set of operations linearized and the model's state — reached before is
never searched again (its outcome is known: it failed). Porcupine's: a model may split the
history into parts whose operations never affect each other's answers (per key, per batch);
each part is checked alone, which keeps the search small.
"""
from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

S = TypeVar("S", bound=Hashable)


@dataclass
class Operation:
    """One operation of a history. ``ret`` None: it never returned (its outcome is unknown)."""

    call: float
    ret: float | None
    input: Any
    output: Any = None
    client: str = ""
    note: str = ""  # what a report says of it, besides input and output


class Model(Generic[S]):
    """A sequential specification. States must be hashable (and compare by value): the search
    remembers the configurations it visited."""

    def init(self) -> S:
        raise NotImplementedError

    def step(self, state: S, op: Operation) -> tuple[bool, S]:
        """Whether ``op`` answers what it answered when applied in ``state``; the next state."""
        raise NotImplementedError

    def partition(self, ops: Sequence[Operation]) -> list[list[Operation]]:
        """Independent parts of the history (by default, one)."""
        return [list(ops)]

    def describe(self, op: Operation) -> str:
        end = "never" if op.ret is None else f"{op.ret:.6f}"
        note = f" {op.note}" if op.note else ""
        return f"{op.client or '?'} [{op.call:.6f}, {end}] {op.input!r} -> {op.output!r}{note}"


@dataclass
class Result:
    """``ok``: True (linearizable), False (not) or None (the deadline passed first).
    When not: ``part`` is the sub-history that has no linearization, ``longest`` the longest
    linearizable prefix the search found (operations, in order) and ``stuck`` the operation
    that prefix could not be extended past (its return came, its call not linearizable)."""

    ok: bool | None
    part: list[Operation] = field(default_factory=list)
    stuck: Operation | None = None
    longest: list[Operation] = field(default_factory=list)
    parts: int = 0

    def explain(self, model: Model[Any], limit: int = 12) -> str:
        if self.ok:
            return f"linearizable ({self.parts} parts)"
        if self.ok is None:
            return "undecided: the deadline passed"
        lines = [f"not linearizable: no order of these {len(self.part)} operations answers as they did"]
        lines += ["  " + model.describe(op) for op in sorted(self.part, key=lambda o: o.call)[:limit]]
        if self.stuck is not None:
            lines.append("the longest order found stops at the return of: " + model.describe(self.stuck))
        if self.longest:
            lines.append(f"longest linearizable prefix ({len(self.longest)} operations): "
                         + "; ".join(model.describe(op) for op in self.longest[:limit]))
        return "\n".join(lines)


class _Entry:
    """A call or a return in the doubly linked list of the search."""

    __slots__ = ("op", "n", "match", "prev", "next")

    def __init__(self, op: Operation | None, n: int, match: "_Entry | None"):
        self.op, self.n, self.match = op, n, match  # match: the return entry of a call; None for a return
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _linked(ops: Sequence[Operation]) -> _Entry:
    """The head (a sentinel) of the list of every call and return in time order, a call
    before a return at the same time; a return that never came is after everything."""
    inf = float("inf")
    events = []
    for n, op in enumerate(ops):
        events.append((op.call, 0, n))
        events.append((inf if op.ret is None else op.ret, 1, n))
    events.sort()
    head = _Entry(None, -1, None)
    returns: dict[int, _Entry] = {}
    for _, kind, n in events:  # each return is made before its call is linked: made here, in any order
        if kind == 1:
            returns[n] = _Entry(ops[n], n, None)
    last = head
    for _, kind, n in events:
        e = returns[n] if kind == 1 else _Entry(ops[n], n, returns[n])
        last.next, e.prev = e, last
        last = e
    return head


def _lift(e: _Entry) -> None:
    """Unlink a call and its return (the operation is linearized)."""
    assert e.prev is not None and e.next is not None and e.match is not None and e.match.prev is not None
    e.prev.next, e.next.prev = e.next, e.prev
    m = e.match
    m.prev.next = m.next  # type: ignore[union-attr]
    if m.next is not None:
        m.next.prev = m.prev


def _unlift(e: _Entry) -> None:
    """Link them back where they were (the reverse of :func:`_lift`)."""
    assert e.prev is not None and e.next is not None and e.match is not None and e.match.prev is not None
    m = e.match
    m.prev.next = m  # type: ignore[union-attr]
    if m.next is not None:
        m.next.prev = m
    e.prev.next = e
    e.next.prev = e


def _check_one(model: Model[S], ops: Sequence[Operation], deadline: float | None) -> Result:
    head = _linked(ops)
    state = model.init()
    linearized = 0  # a bit per operation
    seen: set[tuple[int, S]] = set()  # configurations visited (Lowe)
    calls: list[tuple[_Entry, S]] = []  # the choices made: entry lifted, state before it
    longest: list[_Entry] = []
    stuck: Operation | None = None
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if deadline is not None and steps % 4096 == 0 and time.monotonic() > deadline:
            return Result(None, list(ops))
        assert entry is not None and entry.op is not None
        if entry.match is not None:  # a call
            ok, after = model.step(state, entry.op)
            if ok:
                lin = linearized | (1 << entry.n)
                if (lin, after) not in seen:
                    seen.add((lin, after))
                    calls.append((entry, state))
                    state, linearized = after, lin
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:  # a return whose call could not be linearized before it: undo the last choice
            if len(calls) > len(longest) or stuck is None:
                longest, stuck = [e for e, _ in calls], entry.op
            if not calls:
                return Result(False, list(ops), stuck, [e.op for e in longest if e.op is not None])
            top, state = calls.pop()
            linearized &= ~(1 << top.n)
            _unlift(top)
            entry = top.next
    return Result(True, longest=[e.op for e, _ in calls if e.op is not None])


def check(model: Model[Any], ops: Sequence[Operation], timeout_s: float | None = None) -> Result:
    """Whether ``ops`` is linearizable under ``model``: each part of ``model.partition`` in turn,
    the first that has no linearization reported. ``timeout_s``: give up (``ok`` None) after
    that long."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    parts = model.partition(ops)
    for part in parts:
        r = _check_one(model, part, deadline)
        if not r.ok:
            r.parts = len(parts)
            return r
    return Result(True, parts=len(parts))
