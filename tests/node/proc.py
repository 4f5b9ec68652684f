"""What the tests of real node processes share besides the processes themselves
(``bench/node_proc.py``): short cluster timings, the wait for a condition, a metric's value."""
from __future__ import annotations

import time

from node.errors import ApiError

SCHEMA = "id int64 primary key, ts timestamp, loc point, name string, v float64, n int64"

# Short replication timings for tests: faults show in about a second (docs/format/replication.md).
FAST_CLUSTER = "[cluster]\nheartbeat = \"200ms\"\nfailure_timeout = \"1500ms\"\nack_timeout = \"3s\"\n"


def eventually(fn, timeout: float = 30.0, every: float = 0.1, proc=None):
    """``fn()``'s result once it stops raising ApiError, OSError (ConnectionError among them)
    or AssertionError — the one wait for a condition in these tests (never a fixed sleep).
    ``proc``: a process (``subprocess.Popen``) whose exit ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (ApiError, OSError, AssertionError):
            if time.monotonic() > deadline:
                raise
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"the process exited ({proc.returncode}) while waiting") from None
            time.sleep(every)


def unavailable_retried(fn, timeout: float = 60.0):
    """``fn()``'s result, retried only while it answers 503 ``unavailable`` (a partition moving
    to a new leader while jobs run on a slow machine): any other error, a wrong answer among
    them, fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except ApiError as e:
            if e.code != "unavailable" or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def on_every(nodes, check, timeout: float = 90.0) -> None:
    """``check(client)`` holds through each of ``nodes`` (each waited for as ``eventually``)."""
    for n in nodes:
        with n.client(timeout=60) as c:
            eventually(lambda c=c: check(c), timeout)


def stop_all(nodes) -> None:
    """Every node still running stopped (a test's ``finally``)."""
    for n in nodes:
        if n.proc is not None:
            n.ensure_stopped()


def metric(node, name: str, **labels) -> float:
    """One sample of the node's ``/metrics`` (0.0 when absent): ``name`` with exactly ``labels``."""
    with node.client() as c:
        text = c.metrics()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key = line.rsplit(" ", 1)[0]
        got_name, _, got_labels = key.partition("{")
        if got_name == name and got_labels.rstrip("}") == want:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def holds(value, what: str = "the condition"):
    """``value`` when it is truthy, else AssertionError (for ``eventually(lambda: holds(...))``)."""
    assert value, f"{what} does not hold yet"
    return value
