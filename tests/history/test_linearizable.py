"""The linearizability checker (tests/history/linearizable.py) on small histories whose answer
is known — by hand, and against a brute-force search over every order."""
from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings, strategies as st

from tests.history.linearizable import Model, Operation, check


class Register(Model[int]):
    """A register holding an integer, 0 at first: ("put", v) and ("get",) -> v."""

    def init(self) -> int:
        return 0

    def step(self, state: int, op: Operation) -> tuple[bool, int]:
        if op.input[0] == "put":
            return True, op.input[1]
        return op.output == state, state


class KV(Register):
    """One register per key: ("put", k, v), ("get", k) -> v; each key checked on its own."""

    def step(self, state: int, op: Operation) -> tuple[bool, int]:
        if op.input[0] == "put":
            return True, op.input[2]
        return op.output == state, state

    def partition(self, ops: Sequence[Operation]) -> list[list[Operation]]:
        parts: dict[int, list[Operation]] = {}
        for op in ops:
            parts.setdefault(op.input[1], []).append(op)
        return list(parts.values())


class Counter(Model[int]):
    """("add",) increments; ("read",) -> the count. Counts its steps."""

    def __init__(self) -> None:
        self.steps = 0

    def init(self) -> int:
        return 0

    def step(self, state: int, op: Operation) -> tuple[bool, int]:
        self.steps += 1
        if op.input[0] == "add":
            return True, state + 1
        return op.output == state, state


def put(v, call, ret, client="w"):
    return Operation(call, ret, ("put", v), None, client)


def get(v, call, ret, client="r"):
    return Operation(call, ret, ("get",), v, client)


def test_a_read_overlapping_a_write_may_see_either_value():
    assert check(Register(), [put(1, 0, 10), get(1, 5, 15), get(0, 1, 3)]).ok
    assert check(Register(), [put(1, 0, 10), get(0, 5, 15), get(0, 1, 3)]).ok
    assert check(Register(), [put(1, 0, 10), get(1, 5, 15), get(1, 1, 3)]).ok


def test_a_read_called_after_a_write_returned_must_see_it():
    r = check(Register(), [put(1, 0, 2), get(0, 3, 4)])
    assert r.ok is False
    assert r.stuck is not None and r.stuck.input == ("get",)
    assert "not linearizable" in r.explain(Register())


def test_two_reads_in_real_time_order_cannot_see_the_new_value_then_the_old():
    """Each read alone overlaps the write; together no order fits (the new value, then the old)."""
    ops = [put(1, 0, 10), get(1, 1, 2, "r1"), get(0, 3, 4, "r2")]
    assert check(Register(), ops).ok is False
    ops = [put(1, 0, 10), get(0, 1, 2, "r1"), get(1, 3, 4, "r2")]
    assert check(Register(), ops).ok


def test_a_write_that_never_returned_may_take_effect_late_or_never():
    assert check(Register(), [put(1, 0, None), get(0, 5, 6), get(1, 7, 8)]).ok
    assert check(Register(), [put(1, 0, None), get(0, 100, 101)]).ok
    assert check(Register(), [put(1, 0, None), get(1, 5, 6), get(0, 7, 8)]).ok is False
    assert check(Register(), [put(1, 5, None), get(1, 1, 4)]).ok is False  # seen before it was called


def test_operations_that_touch_in_time_are_concurrent():
    assert check(Register(), [put(1, 0, 3), get(0, 3, 4)]).ok


def test_each_key_is_checked_on_its_own_and_the_bad_one_is_named():
    ops = [Operation(0, 2, ("put", "a", 1), None), Operation(3, 4, ("get", "a"), 1),
           Operation(0, 2, ("put", "b", 7), None), Operation(3, 4, ("get", "b"), 0),  # b: stale
           Operation(5, 9, ("put", "a", 2), None), Operation(6, 7, ("get", "a"), 1)]
    r = check(KV(), ops)
    assert r.ok is False and r.parts == 2
    assert {op.input[1] for op in r.part} == {"b"}


def test_visited_configurations_are_not_searched_again():
    """14 concurrent increments and a read of 15 after them: no order fits, and proving it
    visits each set of increments once (2^14 configurations), not each of their 14! orders."""
    n = 14
    m = Counter()
    ops = [Operation(0, 10, ("add",), None, f"c{i}") for i in range(n)] + [Operation(11, 12, ("read",), n + 1)]
    assert check(m, ops).ok is False
    assert m.steps <= (n + 1) * 2 ** n
    m = Counter()
    ops[-1] = Operation(11, 12, ("read",), n)
    assert check(m, ops).ok
    assert m.steps <= 2 * (n + 1)


def brute_force(model: Model[int], ops: list[Operation]) -> bool:
    """Some order of all operations that keeps real-time order (an operation that returned
    before another was called comes first) answers as they did."""
    inf = float("inf")
    for order in itertools.permutations(range(len(ops))):
        if any((ops[b].ret if ops[b].ret is not None else inf) < ops[a].call
               for i, a in enumerate(order) for b in order[i + 1:]):
            continue
        state, ok = model.init(), True
        for i in order:
            ok, state = model.step(state, ops[i])
            if not ok:
                break
        if ok:
            return True
    return False


@st.composite
def histories(draw):
    ops = []
    for i in range(draw(st.integers(1, 6))):
        call = draw(st.integers(0, 20))
        ret = None if draw(st.integers(0, 4)) == 0 else call + draw(st.integers(0, 8))
        if draw(st.booleans()):
            ops.append(put(draw(st.integers(1, 3)), call, ret, f"c{i}"))
        elif ret is not None:  # a read without an answer says nothing: left out, as the checks do
            ops.append(get(draw(st.integers(0, 3)), call, ret, f"c{i}"))
    return ops


@settings(max_examples=400, deadline=None)
@given(histories())
def test_it_agrees_with_a_search_over_every_order(ops):
    assert bool(check(Register(), ops).ok) == brute_force(Register(), ops)
