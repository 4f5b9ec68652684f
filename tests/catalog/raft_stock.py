"""Stock pysyncobj 0.3.17, unwrapped, reproducing RFC 0005's problems ("before" halves of the tests).

Run as a subprocess (so nothing of ``catalog.raft`` is imported and pysyncobj
is exactly as shipped): ``python -m tests.catalog.raft_stock SCENARIO DIR PORT...``.
Prints one JSON line with what happened.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.syncobj import SyncObjException


class Counter(SyncObj):
    def __init__(self, me, others, conf):
        super().__init__(me, others, conf)
        self.n = 0
        self.blob = 0

    @replicated
    def inc(self):
        self.n += 1
        return self.n

    @replicated
    def put(self, b):
        self.blob = len(b)
        return len(b)

    @replicated
    def boom(self):
        raise ValueError("boom")


def _wait(pred, timeout=10.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.02)
    return True


def serve(d, port):
    """A stock node, no password, bound to loopback only (it runs whatever pickle it is sent)."""
    c = Counter(f"127.0.0.1:{port}", [], SyncObjConf(bindAddress=f"127.0.0.1:{port}"))
    print(json.dumps({"ready": True}), flush=True)
    time.sleep(60)
    c.destroy()


def serve_default_bind(d, port):
    """A stock node with the default bind address; a password keeps strangers out meanwhile."""
    c = Counter(f"127.0.0.1:{port}", [], SyncObjConf(password="0123456789abcdef"))
    print(json.dumps({"ready": True}), flush=True)
    time.sleep(60)
    c.destroy()


def compaction_restart(d, port):
    """Problem 3: journalFile without fullDumpFile, compaction, restart."""
    j = os.path.join(d, "journal")
    c = Counter(f"127.0.0.1:{port}", [], SyncObjConf(journalFile=j))
    for _ in range(50):
        c.inc(sync=True, timeout=5)
    c.forceLogCompaction()
    _wait(lambda: c._getRaftLogSize() < 10)
    before = c.inc(sync=True, timeout=5)
    c.destroy_synchronous()
    c2 = Counter(f"127.0.0.1:{port}", [], SyncObjConf(journalFile=j))
    _wait(lambda: c2.n >= before, timeout=3)
    out = {"before": before, "after_restart": c2.n}
    c2.destroy_synchronous()
    return out


def exception_wedges(d, port):
    """Problem 4: an exception in a replicated method."""
    c = Counter(f"127.0.0.1:{port}", [], SyncObjConf())
    first = c.inc(sync=True, timeout=5)
    c.boom()
    try:
        after = c.inc(sync=True, timeout=3)
    except SyncObjException as e:
        after = f"error {e.errorCode}"
    out = {"first": first, "after_boom": after, "n": c.n}
    c.destroy()
    return out


def timeout_applies(d, port):
    """Problem 5: a timed-out call is applied anyway; a naive retry applies it twice."""
    c = Counter(f"127.0.0.1:{port}", [], SyncObjConf())
    c.inc(sync=True, timeout=5)
    try:
        c.inc(sync=True, timeout=1e-6)
        timed_out = False
    except SyncObjException as e:
        timed_out = e.errorCode == "Timeout"
    c.inc(sync=True, timeout=5)  # the caller's retry
    out = {"timed_out": timed_out, "n": c.n, "intended": 2}
    c.destroy()
    return out


def big_entry(d, *ports):
    """Problem 6: a 100 KB entry goes through the chunked transmission path."""
    failures = []

    class Catch(logging.Handler):
        def emit(self, rec):
            if rec.exc_info:
                failures.append(f"{rec.getMessage()}: {rec.exc_info[0].__name__}")

    lg = logging.getLogger("pysyncobj.syncobj")
    lg.setLevel(logging.ERROR)
    lg.propagate = False
    lg.addHandler(Catch())
    addrs = [f"127.0.0.1:{p}" for p in ports]
    cs = [Counter(a, [x for x in addrs if x != a], SyncObjConf()) for a in addrs]
    _wait(lambda: any(c._isLeader() for c in cs))
    lead = next(c for c in cs if c._isLeader())
    lead.inc(sync=True, timeout=5)
    try:
        lead.put(b"\xff" * 100_000, sync=True, timeout=5)  # pickles to ~2x: past the "finish" chunk
        committed = True
    except SyncObjException:
        committed = False
    for c in cs:
        c.destroy()
    return {"committed": committed, "tick_failures": failures[:5], "n_failures": len(failures)}


def unsynced_ack(d, *ports):
    """Problem 1: count fsyncs of a stock FileJournal cluster committing 50 entries."""
    calls = {"fsync": 0, "fdatasync": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd):
        calls["fsync"] += 1
        return real_fsync(fd)

    def fdatasync(fd):
        calls["fdatasync"] += 1
        return real_fdatasync(fd)

    os.fsync, os.fdatasync = fsync, fdatasync
    addrs = [f"127.0.0.1:{p}" for p in ports]
    cs = [Counter(a, [x for x in addrs if x != a],
                  SyncObjConf(journalFile=os.path.join(d, f"j{i}"), fullDumpFile=os.path.join(d, f"d{i}")))
          for i, a in enumerate(addrs)]
    _wait(lambda: any(c._isLeader() for c in cs))
    lead = next(c for c in cs if c._isLeader())
    for _ in range(50):
        lead.inc(sync=True, timeout=5)
    out = {"committed": lead.n, **calls}
    for c in cs:
        c.destroy()
    return out


if __name__ == "__main__":
    name, d, *ports = sys.argv[1:]
    logging.basicConfig(level=logging.CRITICAL)
    res = globals()[name](d, *[int(p) for p in ports])
    if res is not None:
        print(json.dumps(res), flush=True)
    os._exit(0)
