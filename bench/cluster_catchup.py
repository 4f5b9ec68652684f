"""Catch-up of ``python -m bench cluster``: a restarted replica catching up, and the bytes
shipped to a leader returning after kill -9 and a failover; the workloads are described in
``bench/cluster_bench.py``."""
from __future__ import annotations

import asyncio
import os
import time

from bench.cluster_harness import QUICK, Cluster, send_batches, split_by_leader
from bench.common import Result
from bench.node_bench import BATCH_ROWS, batch

CATCHUP_BATCHES = int(os.environ.get("CLUSTER_BENCH_CATCHUP_BATCHES", "20" if QUICK else "60"))


# -- 4. catch-up -------------------------------------------------------------------------------------

async def catch_up(cl: Cluster) -> list[Result]:
    leaders = await cl.create("cu", 3)
    await cl.caught_up()
    st = await cl.get(leaders[0], "/v1/admin/status")
    victim = next(n for n in cl.nodes if n.node_id != st["catalog_leader"])
    tables = [batch((1 << 30) + i * BATCH_ROWS) for i in range(CATCHUP_BATCHES)]
    victim.kill()
    # wait for the driver to move its partitions, so the writes below measure the leaders' rate
    deadline = time.monotonic() + 60
    while victim.node_id in (leaders := await cl.leaders("cu")):
        if time.monotonic() > deadline:
            raise RuntimeError("the killed node's partitions never failed over")
        await asyncio.sleep(0.1)
    pieces = await asyncio.to_thread(split_by_leader, tables, leaders)
    write_s = await send_batches(cl, "cu", pieces, 4, retry_s=0.05)

    def shipped(shippers: dict) -> int:
        return sum(sh["followers"].get(victim.node_id, {}).get("sent_bytes", 0) for sh in shippers.values())

    before = shipped(await cl.shippers())
    t0 = time.perf_counter()
    victim.start(wait=False)
    await cl.wait_ready(victim)
    t_ready = time.perf_counter()
    t_contact = None  # the first time a leader reports the restarted node's position
    while True:
        sh = await cl.shippers()
        if t_contact is None and any(s["followers"].get(victim.node_id, {}).get("pos") is not None
                                     for s in sh.values()):
            t_contact = time.perf_counter()
        if cl.all_caught_up(sh):
            break
        if time.perf_counter() - t_ready > 120:
            raise RuntimeError(f"{victim.node_id} not caught up after 120 s: {sh}")
        await asyncio.sleep(0.05)
    t_done = time.perf_counter()
    mb = (shipped(sh) - before) / 1e6
    rate, write_rate = mb / (t_done - t_ready), mb / write_s
    print(f"  catch-up: {mb:.1f} MB to {victim.node_id}: ready after {t_ready - t0:.2f} s, first position "
          f"{t_contact - t_ready:.2f} s later, caught up {t_done - t_ready:.2f} s after ready ({rate:.1f} MB/s); "
          f"the leaders wrote them at {write_rate:.1f} MB/s", flush=True)
    await cl.drop("cu")
    return [Result(f"catch-up of a restarted replica: MB shipped to it / time from its /readyz until every "
                   f"follower position equals its leader's log end ({mb:.0f} MB, 8 partitions)", rate,
                   "the leaders' log write rate of the same bytes (R=3 with one replica down, 4 batches in flight)",
                   write_rate, "MB/s", "report (> 1x: it catches up faster than it fell behind)",
                   {"mb": round(mb, 1), "restart_to_ready_s": round(t_ready - t0, 2),
                    "ready_to_first_position_s": round(t_contact - t_ready, 2),
                    "ready_to_caught_up_s": round(t_done - t_ready, 2), "write_s": round(write_s, 2),
                    "rate_from_first_position_mb_s": round(mb / max(t_done - t_contact, 1e-3), 1)})]


# -- 5. a returning leader ---------------------------------------------------------------------------

async def returning_leader(cl: Cluster) -> list[Result]:
    """kill -9 of a node leading partitions while 4 batches are in flight (its log may end past
    the new leaders' starts), more batches through the new leaders, then its restart: the bytes
    shipped to it until every follower is caught up, against the bytes written to the table
    since the kill (the suffix it lacks). A whole re-copy of its log (the old rule) would ship
    the table's whole unoffloaded log instead: ``extra``."""
    leaders = await cl.create("rl", 3)
    await cl.caught_up()
    st = await cl.get(leaders[0], "/v1/admin/status")
    victim = next(n for n in cl.nodes if n.node_id != st["catalog_leader"] and n.node_id in leaders)
    first = [batch((1 << 31) + i * BATCH_ROWS) for i in range(CATCHUP_BATCHES)]
    early = await asyncio.to_thread(split_by_leader, first, leaders)
    total = sum(len(body) for bp in early for _, body in bp)
    await send_batches(cl, "rl", early, 4, retry_s=0.05)
    more = [batch((1 << 31) + (CATCHUP_BATCHES + i) * BATCH_ROWS) for i in range(CATCHUP_BATCHES // 2)]
    mid = await asyncio.to_thread(split_by_leader, more, leaders)
    mid_bytes = sum(len(body) for bp in mid for _, body in bp)
    total += mid_bytes
    inflight = asyncio.ensure_future(send_batches(cl, "rl", mid, 4, retry_s=0.05))
    await asyncio.sleep(0.3)
    victim.kill()  # mid-write: its own log may run past what the new leaders start from
    await inflight
    deadline = time.monotonic() + 60
    while victim.node_id in (leaders := await cl.leaders("rl")):
        if time.monotonic() > deadline:
            raise RuntimeError("the killed node's partitions never failed over")
        await asyncio.sleep(0.1)
    after = [batch((1 << 31) + (2 * CATCHUP_BATCHES + i) * BATCH_ROWS) for i in range(CATCHUP_BATCHES // 2)]
    pieces = await asyncio.to_thread(split_by_leader, after, leaders)
    written = mid_bytes + sum(len(body) for batch_pieces in pieces for _, body in batch_pieces)  # from the kill on

    def shipped(shippers: dict) -> int:
        return sum(sh["followers"].get(victim.node_id, {}).get("sent_bytes", 0) for sh in shippers.values())
    await send_batches(cl, "rl", pieces, 4, retry_s=0.05)
    before = shipped(await cl.shippers())
    victim.start(wait=False)
    await cl.wait_ready(victim)
    sh = await cl.caught_up(timeout=180)
    mb = (shipped(sh) - before) / 1e6
    whole = (total + written - mid_bytes) / 1e6  # nothing is offloaded within the bench's minute: its whole log
    print(f"  returning leader: {mb:.1f} MB shipped to {victim.node_id}; {written / 1e6:.1f} MB of Arrow bodies "
          f"written from just before its kill on; {whole:.1f} MB written to the table in all", flush=True)
    await cl.drop("rl")
    return [Result("bytes shipped to a leader returning after kill -9 mid-write and a failover (R=3, 8 "
                   "partitions, until every follower is caught up)", mb,
                   "the Arrow bodies written from just before its kill on (at most the suffix it lacks)",
                   written / 1e6, "MB",
                   "report (≈ 1x: only the suffix it lacks; a whole re-copy ships the unoffloaded log)",
                   {"table_written_mb": round(whole, 1)})]
