"""Retries with jittered exponential backoff: the one helper every layer uses.

A caller says *what* may be retried; this module says *how*: how long to wait and when to
give up. Only a call that is safe to repeat may be retried — a read, an idempotent write
(a whole-object put, a transaction or read plan carrying a request id), or an attempt that
failed before it reached the other side. ``retryable`` is where a caller draws that line,
per failure; a call that is none of these runs once (``ONCE``) or is made idempotent first.

The wait after the n-th failed attempt is uniform in [0, min(cap, base * 2^(n-1))] — "full
jitter", so clients that failed together do not come back together. A call gives up after
``attempts`` attempts, or once ``deadline`` seconds have passed since the first one: the
wait before a last attempt is cut to end at the deadline, and none starts after it.

Time is passed in: ``clock``, ``sleep`` and ``rng`` default to the real ones; tests and
simulations pass their own, so nothing waits and runs replay. ``catalog`` is the lowest
layer, so every package (and the Python client) imports this from here.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")
Retryable = Callable[[Exception], bool]  # True: this failure may be followed by another attempt
OnRetry = Callable[[int, Exception, float], None]  # (failed attempt, its error, the wait before the next)
GiveUp = Callable[[Exception, int], Exception]  # (last error, attempts made) -> what the caller sees


@dataclass(frozen=True)
class Retry:
    """A retry policy: at most ``attempts`` attempts (None: no limit) within ``deadline``
    seconds of the first (None: no deadline), waiting as the module docstring says."""

    attempts: int | None = 5
    deadline: float | None = None
    base: float = 0.1
    cap: float = 5.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"attempts must be >= 1 or None, not {self.attempts}")
        if self.base < 0 or self.cap < 0 or (self.deadline is not None and self.deadline < 0):
            raise ValueError("base, cap and deadline must be >= 0")

    def delay(self, attempt: int, rng: Callable[[], float] = random.random) -> float:
        """The wait after failed attempt ``attempt`` (1-based), before any deadline cuts it."""
        top = min(self.cap, self.base * 2.0 ** min(attempt - 1, 64))  # capped exponent: no overflow
        return top * rng() if self.jitter else top


ONCE = Retry(attempts=1)  # a call that must not be repeated


class _Attempts:
    """The loop's decisions, shared by :func:`call` and :func:`acall`."""

    def __init__(self, policy: Retry, retryable: Retryable, on_retry: OnRetry | None,
                 clock: Callable[[], float], rng: Callable[[], float]):
        self.policy, self.retryable, self.on_retry = policy, retryable, on_retry
        self.clock, self.rng = clock, rng
        self.start = clock() if policy.deadline is not None else 0.0
        self.made = 0
        self.exhausted = False  # gave up on a retryable failure (out of attempts or time)

    def after(self, exc: Exception, give_up: GiveUp | None) -> float:
        """The wait before the next attempt, or ``exc`` raised (as ``give_up`` makes it, once
        the policy is used up)."""
        delay = self.wait(exc)
        if delay is None:
            if give_up is None or not self.exhausted:
                raise exc
            raise give_up(exc, self.made) from exc
        return delay

    def wait(self, exc: Exception) -> float | None:
        """After a failed attempt: the wait before the next one, or None to give up."""
        self.made += 1
        p = self.policy
        if not self.retryable(exc):
            return None
        delay = p.delay(self.made, self.rng)
        if p.deadline is not None:
            left = self.start + p.deadline - self.clock()
            delay = min(delay, left)
            self.exhausted = left <= 0
        self.exhausted = self.exhausted or (p.attempts is not None and self.made >= p.attempts)
        if self.exhausted:
            return None
        if self.on_retry is not None:
            self.on_retry(self.made, exc, delay)
        return delay


def call(fn: Callable[[], T], retryable: Retryable, policy: Retry, *, on_retry: OnRetry | None = None,
         give_up: GiveUp | None = None, clock: Callable[[], float] = time.monotonic,
         sleep: Callable[[float], object] = time.sleep, rng: Callable[[], float] = random.random) -> T:
    """``fn()``, attempted again after each failure ``retryable`` accepts, as ``policy`` allows.
    A refused failure is raised as it is; a retryable one that used up the policy is raised
    as it is too, or as ``give_up(error, attempts)`` (chained from it) when that is given."""
    tries = _Attempts(policy, retryable, on_retry, clock, rng)
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - retryable() decides; after() re-raises what it refuses
            delay = tries.after(e, give_up)
        if delay > 0:
            sleep(delay)


async def acall(fn: Callable[[], Awaitable[T]], retryable: Retryable, policy: Retry, *,
                on_retry: OnRetry | None = None, give_up: GiveUp | None = None,
                clock: Callable[[], float] = time.monotonic, rng: Callable[[], float] = random.random,
                sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> T:
    """:func:`call` for coroutines: ``await fn()``, waiting with ``await sleep(delay)``.
    Cancellation is not an ``Exception``: it ends the loop at once, whatever ``retryable`` says."""
    tries = _Attempts(policy, retryable, on_retry, clock, rng)
    while True:
        try:
            return await fn()
        except Exception as e:  # noqa: BLE001 - retryable() decides; after() re-raises what it refuses
            delay = tries.after(e, give_up)
        if delay > 0:
            await sleep(delay)
