"""catalog.retry, with time driven by the test: a fake clock that sleeping moves forward, a
seeded rng. Every behaviour is checked through both loops (blocking and asyncio), which
must agree; nothing here sleeps for real or asserts on wall-clock time."""
from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings, strategies as st

from catalog.retry import ONCE, Retry, acall, call


class Clock:
    """Monotonic time that only sleeping advances; remembers each wait and each attempt's start."""

    def __init__(self):
        self.now, self.waits, self.starts = 1000.0, [], []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.waits.append(s)
        self.now += s

    async def asleep(self, s: float) -> None:
        self.sleep(s)


class Flaky:
    """Fails its first ``n`` calls with ``err`` (a fresh instance each), then returns ``value``."""

    def __init__(self, clock: Clock, n: int, err=ConnectionError, value="ok"):
        self.clock, self.n, self.err, self.value, self.calls = clock, n, err, value, 0

    def __call__(self):
        self.clock.starts.append(self.clock.now)
        self.calls += 1
        if self.calls <= self.n:
            raise self.err(f"attempt {self.calls}")
        return self.value


def run(kind: str, fn, retryable, policy, clock: Clock, **kw):
    """One call through the blocking loop or the asyncio loop, on the same fake time."""
    rng = kw.pop("rng", random.Random(7).random)
    if kind == "sync":
        return call(fn, retryable, policy, clock=clock, sleep=clock.sleep, rng=rng, **kw)

    async def afn():
        return fn()

    return asyncio.run(acall(afn, retryable, policy, clock=clock, sleep=clock.asleep, rng=rng, **kw))


both = pytest.mark.parametrize("kind", ["sync", "async"])
is_conn = lambda e: isinstance(e, ConnectionError)  # noqa: E731


@both
def test_success_after_failures_returns_the_value_after_one_wait_each(kind):
    clock = Clock()
    fn = Flaky(clock, 3)
    assert run(kind, fn, is_conn, Retry(attempts=5), clock) == "ok"
    assert fn.calls == 4 and len(clock.waits) == 3


@both
def test_a_refused_failure_is_raised_unchanged_at_once(kind):
    clock = Clock()
    fn = Flaky(clock, 10, err=PermissionError)
    with pytest.raises(PermissionError, match="attempt 1"):
        run(kind, fn, is_conn, Retry(attempts=5), clock, give_up=lambda e, n: RuntimeError("not this"))
    assert fn.calls == 1 and clock.waits == []


@both
def test_once_never_repeats(kind):
    clock = Clock()
    fn = Flaky(clock, 1)
    with pytest.raises(ConnectionError):
        run(kind, fn, lambda e: True, ONCE, clock)
    assert fn.calls == 1 and clock.waits == []


@both
def test_give_up_maps_only_exhaustion_and_chains_the_last_error(kind):
    clock = Clock()
    fn = Flaky(clock, 10)
    with pytest.raises(TimeoutError, match="after 3") as e:
        run(kind, fn, is_conn, Retry(attempts=3), clock, give_up=lambda err, n: TimeoutError(f"{err} after {n}"))
    assert fn.calls == 3 and str(e.value.__cause__) == "attempt 3"


@both
def test_on_retry_sees_each_failed_attempt_and_its_wait(kind):
    clock, seen = Clock(), []
    fn = Flaky(clock, 3)
    run(kind, fn, is_conn, Retry(attempts=None), clock, on_retry=lambda n, e, d: seen.append((n, str(e), d)))
    assert [(n, e) for n, e, _ in seen] == [(1, "attempt 1"), (2, "attempt 2"), (3, "attempt 3")]
    assert [d for *_, d in seen] == clock.waits


@both
def test_no_jitter_doubles_up_to_the_cap(kind):
    clock = Clock()
    run(kind, Flaky(clock, 6), is_conn, Retry(attempts=None, base=0.5, cap=3.0, jitter=False), clock)
    assert clock.waits == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


@both
def test_the_predicate_can_refuse_a_later_failure(kind):
    """An unbounded policy ends when the caller says so (a stopping replica, say)."""
    clock, stop = Clock(), [False]

    def fn():
        clock.starts.append(clock.now)
        if len(clock.starts) == 4:
            stop[0] = True
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        run(kind, fn, lambda e: not stop[0], Retry(attempts=None), clock)
    assert len(clock.starts) == 4


def test_unbounded_retries_never_overflow_the_wait():
    """A replica may wait out a shortage for hours: the 2000th wait is still the cap."""
    clock = Clock()
    fn = Flaky(clock, 2000, err=OSError)
    assert call(fn, lambda e: True, Retry(attempts=None, base=0.01, cap=1.0), clock=clock, sleep=clock.sleep) == "ok"
    assert max(clock.waits) <= 1.0 and len(clock.waits) == 2000
    assert Retry(base=0.01, cap=1.0, jitter=False).delay(10**6) == 1.0


def test_zero_waits_do_not_sleep():
    """A reconnect that needs no pause (base 0) does not even yield to the sleeper."""
    clock = Clock()
    assert call(Flaky(clock, 1), is_conn, Retry(attempts=2, base=0), clock=clock, sleep=clock.sleep) == "ok"
    assert clock.waits == []


async def test_cancellation_is_never_retried():
    calls = []

    async def fn():
        calls.append(1)
        raise asyncio.CancelledError

    clock = Clock()
    with pytest.raises(asyncio.CancelledError):
        await acall(fn, lambda e: True, Retry(attempts=None), clock=clock, sleep=clock.asleep)
    assert calls == [1]


def test_bad_policies_are_refused():
    for kw in ({"attempts": 0}, {"base": -1}, {"cap": -1}, {"deadline": -1}):
        with pytest.raises(ValueError):
            Retry(**kw)


# -- properties -------------------------------------------------------------------------------

policies = st.builds(
    Retry,
    attempts=st.one_of(st.none(), st.integers(1, 12)),
    deadline=st.one_of(st.none(), st.floats(0, 30)),
    base=st.floats(0, 2),
    cap=st.floats(0, 10),
    jitter=st.booleans(),
)


@settings(max_examples=150, deadline=None)
@given(policy=policies, failures=st.integers(0, 40), seed=st.integers(0, 2**32 - 1),
       kind=st.sampled_from(["sync", "async"]))
def test_a_policy_bounds_attempts_waits_and_time(policy, failures, seed, kind):
    """Whatever the policy: each wait lies in [0, min(cap, base * 2^(n-1))]; no more attempts
    than allowed; no attempt starts after the deadline; the call succeeds exactly when the
    policy leaves room for one more attempt than there are failures."""
    if policy.attempts is None and policy.deadline is None:
        policy = Retry(attempts=20, base=policy.base, cap=policy.cap, jitter=policy.jitter)
    clock = Clock()
    start = clock.now
    fn = Flaky(clock, failures)
    try:
        got = run(kind, fn, is_conn, policy, clock, rng=random.Random(seed).random)
    except ConnectionError:
        got = None
    for n, w in enumerate(clock.waits, 1):
        assert 0 <= w <= min(policy.cap, policy.base * 2 ** (n - 1)) + 1e-9
        if not policy.jitter and policy.deadline is None:
            assert w == min(policy.cap, policy.base * 2 ** (n - 1))
    if policy.attempts is not None:
        assert fn.calls <= policy.attempts
    if policy.deadline is not None:
        assert all(s <= start + policy.deadline + 1e-9 for s in clock.starts)
    assert (got == "ok") == (fn.calls == failures + 1)
    if got is None and policy.deadline is None:
        assert fn.calls == policy.attempts  # only the count ended it


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), failures=st.integers(1, 10))
def test_both_loops_make_the_same_schedule(seed, failures):
    """The blocking and the asyncio loop share one decision function: same rng, same waits."""
    schedules = []
    for kind in ("sync", "async"):
        clock = Clock()
        run(kind, Flaky(clock, failures), is_conn, Retry(attempts=None, deadline=60), clock,
            rng=random.Random(seed).random)
        schedules.append(clock.waits)
    assert schedules[0] == schedules[1]
