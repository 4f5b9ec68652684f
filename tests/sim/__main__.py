"""Run the seeded fault simulation: ``python -m tests.sim --seeds 0-99 [--seconds 30]
[--revert s1] [--mutate lagging_read] [--trace]``. Each seed is one run on virtual time (tests/sim/world.py); a failing
seed prints its violation, the end of its trace and the command that replays it exactly (run
with ``PYTHONHASHSEED=0``, as ``make test`` does); ``--hashes`` prints each seed's trace hash,
equal on every replay (``test_a_seed_replays_the_same_way``). Exit status 1 when any seed failed."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import logging
import random
import sys
import time
import traceback

from terrafs.failpoints import MUTATIONS, mutate
from tests.sim.loop import SimLoop
from tests.sim.nodes import PARTS
from tests.sim.world import Faults, Violation, World

# A run of FLOOR_SEEDS seeds or more fails when it acknowledged fewer than FLOOR_PER_SEED batches a
# seed (seeds 0-59 acknowledge 45 on average, the fewest 6; each seed on its own must
# acknowledge the batches it writes once every fault healed).
FLOOR_SEEDS, FLOOR_PER_SEED = 20, 20


def scale() -> None:
    """Logs of megabytes, not hundreds: catch-up messages of 4 KiB (not 4 MiB), so a replica
    copying a log takes many round trips, as copying a real one does."""
    import rowstore.replication.leader as leader
    leader.CHUNK = 4096


def revert(name: str) -> None:
    """Put a fixed bug back, to show the simulation finds it."""
    if name == "promise":  # a promise from before a restart is not counted: the node promotes for ever
        from rowstore.db.serving.leadership import Leadership
        Leadership._promised_before = lambda self, key, promised: None
    elif name == "reserve-twice":  # a reserve delivered again after its batch ended here holds a new,
        from rowstore.db.write.participant import Participant  # empty reservation; its commit answers a ts
        real_end, real_commit = Participant._end, Participant.commit

        def end(self, txn: int, how: str) -> None:
            if how.startswith("aborted by its coordinator"):  # only what came before
                real_end(self, txn, how)

        async def commit(self, txn: int) -> int:
            p = self._held.get(txn)
            if p is None or p.preparing is not None:
                return await real_commit(self, txn)
            self._held.pop(txn)
            if p.expiry is not None and p.expiry is not asyncio.current_task():
                p.expiry.cancel()
            await self._roll_back(p)  # nothing prepared: nothing to apply
            return p.ts
        Participant._end, Participant.commit = end, commit
    elif name == "s1":  # a follower that diverged discards its whole log instead of cutting it
        import rowstore.replication.follower as follower
        follower.cut_point = lambda *a, **k: None
    elif name == "s2":  # an abort while the prepare's append is in flight rolls back nothing
        from rowstore.db.write.participant import Participant

        async def abort(self, txn: int) -> None:
            p = self._held.pop(txn, None)
            if p is None:
                return
            if p.expiry is not None and p.expiry is not asyncio.current_task():
                p.expiry.cancel()
            await self._roll_back(p)  # p.got is empty while the appends are in flight
        Participant.abort = abort
    elif name == "s2-early":  # an abort before the prepare's appends releases the locks, and the
        from rowstore.db.write.participant import Participant  # prepare appends BATCH X anyway

        async def abort_now_unless_appending(self, txn: int) -> None:
            p = self._held.get(txn)
            if p is None:
                return
            self._forget(p)
            if getattr(p, "appending", False):
                p.aborted = True
                return
            await self._roll_back(p)

        real_prepare = Participant._prepare

        async def prepare_marking_appends(self, p, txn: int, ts: int) -> None:
            real_current = [part.current for part in p.parts]
            for part, cur in zip(p.parts, real_current):
                async def current(cur=cur):  # the appends follow at once: from here on "appending"
                    seg = await cur()
                    p.appending = True
                    return seg
                part.current = current
            try:
                await real_prepare(self, p, txn, ts)
            finally:
                for part in p.parts:
                    del part.current
                p.appending = False
        Participant.abort = abort_now_unless_appending
        Participant._prepare = prepare_marking_appends
    elif name == "mark":  # a checkpoint with no segment current moves the replay mark past an
        import rowstore.db.partition as partition  # active segment, and the replay skips it
        from rowstore.segments.store import SegmentStore

        async def left(self, made, key) -> None:  # the failed create's rows stay, as when
            return None  # their removal fails too: the case the mark rule is for
        SegmentStore._forget_created = left

        async def mark_between(self) -> list[int]:
            return [0, 0, await self.store.next_seq(self.table_id, self.pid)]
        partition.Partition._mark_between = mark_between
        partition.replay_from = lambda rec, mark: None if rec.seq < mark[2] else (
            mark[1] if rec.seq == mark[2] else 0)
    else:
        raise SystemExit(f"nothing to revert called {name!r}")


def run_seed(seed: int, seconds: float, show_trace: bool, faults: Faults, parts: int = PARTS) -> tuple[bool, dict]:
    loop = SimLoop((faults.threads, random.Random(seed * 7919 + 17)) if faults.threads else None)
    w = World(seed, loop, dataclasses.replace(faults), seconds, parts=parts)
    ok, why = True, ""
    try:
        loop.run_until_complete(w.run())
    except Violation as e:
        ok, why = False, str(e)
    except Exception as e:  # noqa: BLE001 - any other failure of a run is reported with its trace
        ok, why = False, "".join(traceback.format_exception(e))[-3000:]
    finally:
        pending = asyncio.all_tasks(loop)
        for t in pending:
            t.cancel()
        # Every task must end once cancelled (a node's shutdown relies on it): one that lives on
        # fails the seed rather than spin the loop's virtual time for ever.
        _, alive = loop.run_until_complete(asyncio.wait(pending, timeout=60)) if pending else (set(), set())
        if alive and ok:
            ok, why = False, f"{len(alive)} tasks outlived their cancellation: " + ", ".join(
                sorted({getattr(t.get_coro(), "__qualname__", repr(t.get_coro())) for t in alive}))[:500]
        for t in alive:
            t.get_coro().close()
        loop.close()
    stats = {"seed": seed, "acked": len(w.ledger.acked), "maybe": len(w.ledger.maybe),
             "elections": w.elections, "virtual_s": round(loop.now, 1), "history": w.summary,
             "trace": trace_hash(w.trace)}
    if not ok:
        print(f"seed {seed}: VIOLATION {why}")
    if not ok or show_trace:  # ``--trace``: the whole trace, of a clean seed too
        print("\n".join(w.trace[-60:] if not show_trace else w.trace))
    if not ok:
        print(f"replay: PYTHONHASHSEED=0 python -m tests.sim --seeds {seed} --seconds {seconds} --parts {parts} "
              f"--crash {faults.crash} --slow {faults.slow} --slow-node {faults.slow_node} --pause {faults.pause} "
              f"--clock-jump {faults.clock_jump} --catalog-stall {faults.catalog_stall} "
              f"--node-catalog {faults.node_catalog} --node-objects {faults.node_objects} "
              f"--threads {faults.threads} --trace")
    return ok, stats


def trace_hash(trace: list[str]) -> str:
    """A run's trace (every fault, election, write outcome, in virtual time) as one hash: two
    runs of a seed replay the same way exactly when their hashes are equal."""
    return hashlib.sha256("\n".join(trace).encode()).hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.sim")
    ap.add_argument("--seeds", default="0-19", help="a seed, or a range a-b (inclusive)")
    ap.add_argument("--seconds", type=float, default=30.0, help="virtual seconds of faults per seed")
    ap.add_argument("--revert", action="append", default=[],
                    help="put a fixed bug back (s1, s2, s2-early, mark, promise)")
    ap.add_argument("--mutate", action="append", default=[], choices=MUTATIONS,
                    help="turn a deliberate bug on (terrafs/failpoints.py): the checks must find it")
    ap.add_argument("--trace", action="store_true", help="print the whole trace of each seed (a clean one too)")
    ap.add_argument("--crash", type=float, default=Faults.crash, help="kills per virtual second")
    ap.add_argument("--slow", type=float, default=Faults.slow, help="slow links per virtual second")
    ap.add_argument("--slow-node", type=float, default=Faults.slow_node, help="slow nodes per virtual second")
    ap.add_argument("--pause", type=float, default=Faults.pause, help="processes stopped (SIGSTOP) per virtual second")
    ap.add_argument("--clock-jump", type=float, default=Faults.clock_jump, help="wall-clock jumps per virtual second")
    ap.add_argument("--node-catalog", type=float, default=Faults.node_catalog,
                    help="one node's catalog calls stall, fail or lose their answers (0.2-2 s), per virtual second")
    ap.add_argument("--node-objects", type=float, default=Faults.node_objects,
                    help="one node's object-store calls fail (0.2-2 s), per virtual second")
    ap.add_argument("--catalog-stall", type=float, default=Faults.catalog_stall,
                    help="catalog stalls (0.2-1.5 s, a Raft election) per virtual second")
    ap.add_argument("--threads", type=float, default=Faults.threads,
                    help="share of thread-pool jobs that complete late, out of order")
    ap.add_argument("--stop", action="store_true", help="stop at the first failing seed")
    ap.add_argument("--parts", type=int, default=PARTS, help="the table's partitions (each led on its own)")
    ap.add_argument("--hashes", action="store_true", help="print each seed's trace hash (replays must agree)")
    a = ap.parse_args(argv)
    lo, _, hi = a.seeds.partition("-")
    seeds = range(int(lo), int(hi or lo) + 1)
    logging.disable(logging.WARNING)
    scale()
    for name in a.revert:
        revert(name)
    for name in a.mutate:
        mutate(name)
    failed, t0, acked, elections = [], time.perf_counter(), 0, 0
    for seed in seeds:
        ok, st = run_seed(seed, a.seconds, a.trace, Faults(crash=a.crash, slow=a.slow, slow_node=a.slow_node,
                                                           pause=a.pause, clock_jump=a.clock_jump,
                                                           catalog_stall=a.catalog_stall,
                                                           node_catalog=a.node_catalog,
                                                           node_objects=a.node_objects, threads=a.threads), a.parts)
        acked += st["acked"]
        elections += st["elections"]
        if a.hashes:
            print(f"seed {seed} trace {st['trace']} acked {st['acked']} elections {st['elections']}", flush=True)
        if not ok:
            failed.append(seed)
            if a.stop:
                break
    took = time.perf_counter() - t0
    n = len(seeds) if not failed or not a.stop else seeds.index(failed[-1]) + 1  # the seeds run
    print(f"{n} seeds in {took:.1f} s ({n / took:.2f} seeds/s): {len(failed)} failed {failed[:20]}; "
          f"{acked} batches acknowledged, {elections} elections")
    if n >= FLOOR_SEEDS and acked < FLOOR_PER_SEED * n:
        print(f"only {acked} batches acknowledged in {n} seeds (at least {FLOOR_PER_SEED} a seed wanted): "
              "a run whose writes fail proves nothing")
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
