"""Named fail points in production code paths (SlateDB's pattern).

Tests arm a point to raise at a chosen step (``arm("offload.after_upload")``),
simulating a crash there; production never arms any, and an unarmed point
costs one dict lookup.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time


class FailPointCrash(Exception):
    """Raised by an armed fail point: the process 'dies' at this step."""


_armed: dict[str, int] = {}
# A real process crash for kill -9 tests of a node: the named point SIGKILLs the process
# (set in the environment of a test's child process only; unset in production).
_KILL_AT = os.environ.get("TERRASCALE_FAILPOINT_KILL")


# A node whose wall clock runs this many ms ahead (or behind): clock-skew faults of a test's
# child process (unset in production).
CLOCK_SKEW_MS = int(os.environ.get("TERRASCALE_FAILPOINT_CLOCK_SKEW_MS", "0"))


# Network cuts of a test's child process: a file named after a node (or ``all``) in this
# folder makes this node's requests to it fail as if the network dropped them (one-way
# partitions, set and lifted while the node runs; unset in production).
CUT_DIR = os.environ.get("TERRASCALE_FAILPOINT_CUT_DIR")


def cut_to(node: str) -> bool:
    """Whether a test cut this node's requests to ``node``."""
    return CUT_DIR is not None and (os.path.exists(os.path.join(CUT_DIR, "all"))
                                    or os.path.exists(os.path.join(CUT_DIR, node)))


def skewed_wall_clock():
    """The node's wall clock in ms when a test skews it, else None (the system's)."""
    if not CLOCK_SKEW_MS:
        return None
    return lambda: time.time_ns() // 1_000_000 + CLOCK_SKEW_MS


def failpoint(name: str) -> None:
    """Raise FailPointCrash if ``name`` is armed (after its skip count runs out)."""
    if name == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if name in _armed:
        left = _armed[name]
        if left <= 0:
            del _armed[name]
            raise FailPointCrash(name)
        _armed[name] = left - 1


def arm(name: str, skip: int = 0) -> None:
    """Make the (skip+1)-th pass through ``name`` raise."""
    _armed[name] = skip


@contextlib.contextmanager
def armed(name: str, skip: int = 0):
    arm(name, skip)
    try:
        yield
    finally:
        _armed.pop(name, None)
