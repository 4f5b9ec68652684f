"""Named fail points in production code paths (SlateDB's pattern).

Tests arm a point to raise at a chosen step (``arm("offload.after_upload")``),
simulating a crash there; production never arms any, and an unarmed point
costs one dict lookup.

A test's child process may also be given, in its environment (never set in production):

* ``TERRASCALE_FAILPOINT_KILL`` — a point's name: the process SIGKILLs itself there;
* ``TERRASCALE_FAILPOINT_CLOCK_SKEW_MS`` — its wall clock runs that many ms ahead (or behind);
* ``TERRASCALE_FAILPOINT_CUT_DIR`` — a folder of network faults on its requests to other
  nodes (``node/cluster/members.py``, ``Cluster.call``), set and lifted while it runs:

  - a file named after a node id (or ``all``): a **cut** — its requests to that node fail
    as if the network dropped them (``cut_to``); its content is not read;
  - a file ``slow-<node id>`` (or ``slow-all``) holding a number of milliseconds (``250``):
    a **slow link** — each of its requests to that node waits that long before it is sent
    (``slow_to``; the larger of the two when both are there). Write it whole (a temporary
    name, then rename): content that is not a number (empty, half-written) delays nothing.
    A cut wins over a slow link.

**Mutations** are the other kind of switch: a deliberate bug a test turns on (``mutate``) to
show that its checker finds it — the seeded simulation's ``--mutate`` (tests/sim, and
docs/rfcs/0010-replication.md, "Histories"). Production never turns one on; one that is off
costs a set lookup where it binds:

* ``lagging_read`` — a read of the present is served 300 ms behind the closed timestamp, as
  a replica that lags would serve it (``rowstore/db/read/reader.py``);
* ``lease_outlives_term`` — a leader serves reads without a current lease, for as long as it
  leads (``rowstore/db/serving/leadership.py``, ``check_lease``);
* ``commit_below_read`` — a new leader's clock does not observe its election's floor, so it
  may commit below a read its predecessor served (``Leadership._promote``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Callable, Iterator


class FailPointCrash(Exception):
    """Raised by an armed fail point: the process 'dies' at this step. Not a TerrafsError on
    purpose: a crash is not a failure the code may catch and handle (``except TerrafsError``
    around a step would swallow it), so it stays outside every package's hierarchy."""


_armed: dict[str, int] = {}
# A real process crash for kill -9 tests of a node: the named point SIGKILLs the process
# (set in the environment of a test's child process only; unset in production).
_KILL_AT = os.environ.get("TERRASCALE_FAILPOINT_KILL")


# A node whose wall clock runs this many ms ahead (or behind): clock-skew faults of a test's
# child process (unset in production).
CLOCK_SKEW_MS = int(os.environ.get("TERRASCALE_FAILPOINT_CLOCK_SKEW_MS", "0"))


# Network faults of a test's child process (the module docstring): cuts and slow links of its
# requests to other nodes, set and lifted while the node runs; unset in production.
CUT_DIR = os.environ.get("TERRASCALE_FAILPOINT_CUT_DIR")
SLOW = "slow-"


def cut_to(node: str) -> bool:
    """Whether a test cut this node's requests to ``node``."""
    return CUT_DIR is not None and (os.path.exists(os.path.join(CUT_DIR, "all"))
                                    or os.path.exists(os.path.join(CUT_DIR, node)))


def slow_to(node: str) -> float:
    """Seconds a test delays each of this node's requests to ``node`` by (0.0: none)."""
    if CUT_DIR is None:
        return 0.0
    return max(_delay(os.path.join(CUT_DIR, SLOW + "all")), _delay(os.path.join(CUT_DIR, SLOW + node)))


def _delay(path: str) -> float:
    """The delay file ``path`` asks for, in seconds (a failed open when there is none; a
    small read when there is: a test's process only)."""
    try:
        with open(path, "rb") as f:
            ms = float(f.read(64).decode("ascii").strip())
    except (OSError, UnicodeDecodeError, ValueError):
        return 0.0
    return ms / 1000 if 0 < ms < float("inf") else 0.0


def skewed_wall_clock() -> Callable[[], int] | None:
    """The node's wall clock in ms when a test skews it, else None (the system's)."""
    if not CLOCK_SKEW_MS:
        return None
    return lambda: time.time_ns() // 1_000_000 + CLOCK_SKEW_MS


MUTATIONS = ("lagging_read", "lease_outlives_term", "commit_below_read")
_mutated: set[str] = set()


def mutate(name: str) -> None:
    """Turn mutation ``name`` on, for the rest of the process (a test's)."""
    if name not in MUTATIONS:
        raise ValueError(f"no mutation called {name!r} (there are {', '.join(MUTATIONS)})")
    _mutated.add(name)


def mutated(name: str) -> bool:
    """Whether a test turned mutation ``name`` on (never in production)."""
    return name in _mutated


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
def armed(name: str, skip: int = 0) -> Iterator[None]:
    arm(name, skip)
    try:
        yield
    finally:
        _armed.pop(name, None)
