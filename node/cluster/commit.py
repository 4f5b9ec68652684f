"""One atomic batch across nodes, with one ``commit_ts`` (docs/rfcs/0010-replication.md §3).

The coordinator is the node that received the batch. It *reserves* each participant
node's share in node-id order: the participant takes its partitions' writer locks (in
partition order, so every cross-node batch takes locks in one global order and two never
deadlock) and a timestamp above its clock and closed timestamp, at least the
coordinator's floor. The batch's ``commit_ts`` is the largest reserved; every participant
*prepares* at it in parallel (``BATCH X``, one fdatasync each). With every share
prepared, the commit point is RFC 0003's one catalog compare-and-set ``txn/X =
committed``; then every participant commits (``COMMIT X``, apply, closed) and the batch
is acknowledged. Before the
decision, any failure aborts; after it, the outcome is committed whatever answers —
a participant that does not confirm finishes it at recovery (the catalog says
committed) — but the caller gets 503, not an acknowledgement it cannot back.

A delete by predicate (RFC 0016 §6) runs the same phases with the terms as each share: the
participant finds its rows at the prepare, under the locks its reservation took.

Wire messages (docs/format/placement.md): ``POST /v1/internal/txn/reserve`` (Arrow IPC
body — or, for a delete by predicate, JSON ``{"where", "bbox", "prefix", "partitions"}`` —
the rest in the query string), ``/prepare`` (``{"txn", "ts"}``; answers the rows prepared),
``/commit``, ``/abort`` (``{"txn"}``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from catalog.abc import Catalog, Check, Delete, Put
from node.cluster.members import raise_remote
from node.cluster.placement import Placement, schema_of
from node.cluster.serving import Serving
from node.wire import ARROW_STREAM, write_arrow_stream
from rowstore.db.write.two_phase import COMMITTED, txn_key
from rowstore.errors import UnavailableError
from rowstore.hlc import HybridClock, ts_from_ms
from rowstore.segments.wal import DECIDED, SPANS_NODES
from rowstore.tables.definitions import TableDef
from terrafs.catalog_ops import commit

log = logging.getLogger("terrascale.node")


@dataclass(frozen=True)
class Outcome:
    rows: int
    existed: int
    commit_ts: int


class Participants(Protocol):
    """What the coordinator asks of each participant node: over HTTP (or in process for its
    own share) in the node layer, over the simulated network in tests/sim — the phases below
    are the same code in both."""

    async def reserve(self, who: str, floor: int, txn: int) -> dict[str, Any]:
        """``who``'s share: its locks and a timestamp ≥ ``floor``; ``{"ts", "rows", "existed"}``."""

    async def prepare(self, who: str, txn: int, ts: int) -> int:
        """``BATCH X`` at ``ts``, durable; the rows prepared."""

    async def commit(self, who: str, txn: int) -> int:
        """``COMMIT X``; the commit timestamp (0: the node found X decided at its recovery)."""

    async def abort(self, who: str, txn: int) -> None: ...


@dataclass
class Coordinator:
    """The coordinator's two phases over ``Participants``. What they need of the node is
    passed in: the catalog the decision goes to, the node's clock, how a background task is
    spawned, and where a transaction id's random bits come from."""

    catalog: Catalog
    clock: HybridClock
    spawn: Callable[[Coroutine[Any, Any, Any]], Any]
    randbits: Callable[[int], int] = secrets.randbits

    async def run(self, name: str, whos: list[str], parts: Participants) -> tuple[Outcome, int]:
        """Reserve ``whos`` one at a time (locks in one global order), prepare every share,
        then decide and commit; also the rows the prepares wrote. ``name``: the table's."""
        txn = DECIDED | SPANS_NODES | self.randbits(62)
        floor = max(ts_from_ms(self.clock.now_ms()), self.clock.last + 1)
        got: list[tuple[str, dict[str, Any]]] = []
        sent: list[str] = []  # the nodes a reserve went to (one that failed or timed out may still reserve)
        try:
            for who in whos:  # one node at a time: locks in one global order
                sent.append(who)
                ans = await parts.reserve(who, floor, txn)
                got.append((who, ans))
                floor = max(floor, int(ans["ts"]))
            ts = max(int(a["ts"]) for _, a in got)
            answers = await asyncio.gather(*(parts.prepare(who, txn, ts) for who, _ in got), return_exceptions=True)
            failed = next((a for a in answers if isinstance(a, BaseException)), None)
            if failed is not None:
                raise failed
        except BaseException:
            await _abort_all(parts, sent, txn)
            raise
        return await self._decide_and_commit(name, parts, got, txn, ts), \
            sum(a for a in answers if isinstance(a, int))

    async def _decide_and_commit(self, name: str, parts: Participants, got: list[tuple[str, dict[str, Any]]],
                                 txn: int, ts: int) -> Outcome:
        key = txn_key(txn)
        # A failure here leaves the outcome to the catalog: each participant resolves it after
        # its prepare timeout, and the caller got no acknowledgement.
        res = await commit(self.catalog, [Check(key, 0)], [Put(key, COMMITTED)])
        if not res.committed:
            e = await self.catalog.get(key)
            if e is None or e.value != COMMITTED:  # a participant gave up on us and aborted
                await _abort_all(parts, [w for w, _ in got], txn)
                raise UnavailableError(f"table {name!r}: the batch was aborted by a participant that timed out; "
                                       "retry")
        self.clock.observe(ts)
        answers = await asyncio.gather(*(parts.commit(who, txn) for who, _ in got), return_exceptions=True)
        failed = [(who, a) for (who, _), a in zip(got, answers) if isinstance(a, BaseException)]
        if failed:
            who, err = failed[0]
            log.warning("event=txn_commit_unconfirmed txn=%s node=%s error=%r", key, who, err)
            raise UnavailableError(f"the batch is committed (txn {key}) but node {who} did not confirm it: {err}; "
                                   "it is applied when that node recovers")
        # Every share has its COMMIT X — unless a participant answered 0: it had restarted and
        # found X decided by its recovery, which for a replicated partition is one copy of the
        # log; the copy leading it next may hold BATCH X alone and must still find the decision.
        if all(answers):
            self.spawn(commit(self.catalog, [], [Delete(key)]))
        return Outcome(sum(a["rows"] for _, a in got), sum(a["existed"] for _, a in got), ts)


def coordinator(sv: Serving) -> Coordinator:
    return Coordinator(sv.catalog, sv.db.clock, sv.db.tasks.spawn)


async def commit_across(sv: Serving, d: TableDef, batch: pa.RecordBatch, pids: np.ndarray, placement: Placement,
                        delete: bool) -> Outcome:
    """Commit ``batch`` (for ``delete``: the keys to delete) whose rows hash to ``pids`` on
    the nodes ``placement`` names, atomically, with one commit timestamp."""
    shares: dict[str, pa.RecordBatch] = {}
    for who, mine in placement.by_node(np.unique(pids).tolist()).items():
        shares[who] = batch.filter(pa.array(np.isin(pids, mine)))
    # the remote shares as Arrow IPC before any lock is taken (a reservation holds locks)
    me = sv.cluster.node_id
    bodies = dict(zip([w for w in shares if w != me], await asyncio.gather(*(
        asyncio.to_thread(write_arrow_stream, pa.Table.from_batches([shares[w]])) for w in shares if w != me))))

    async def reserve(who: str, floor: int, txn: int) -> dict[str, Any]:
        return await _reserve(sv, who, d, shares[who], bodies.get(who), floor, txn, delete)
    out, _ = await coordinator(sv).run(d.name, sorted(shares), _Nodes(sv, reserve))
    return out


async def delete_across(sv: Serving, d: TableDef, spec: dict[str, Any], pids: list[int],
                        placement: Placement) -> Outcome:
    """Delete by predicate (RFC 0016 §6) across the nodes leading ``pids``: each share is the
    terms ``spec`` (``where``, ``bbox``, ``prefix``) and its partitions; each participant finds
    its rows at its prepare. ``existed``: the rows deleted."""
    shares = placement.by_node(sorted(set(pids)))

    async def reserve(who: str, floor: int, txn: int) -> dict[str, Any]:
        return await _reserve_where(sv, who, d, spec, shares[who], floor, txn)
    out, found = await coordinator(sv).run(d.name, sorted(shares), _Nodes(sv, reserve))
    return Outcome(found, found, out.commit_ts)


class _Nodes:
    """The participants as the node layer reaches them: this node's own share in process, the
    others over HTTP (``/v1/internal/txn/…``)."""

    def __init__(self, sv: Serving, reserve: Callable[[str, int, int], Awaitable[dict[str, Any]]]):
        self.sv, self._reserve = sv, reserve

    async def reserve(self, who: str, floor: int, txn: int) -> dict[str, Any]:
        return await self._reserve(who, floor, txn)

    async def prepare(self, who: str, txn: int, ts: int) -> int:
        sv = self.sv
        if who == sv.cluster.node_id:
            return await sv.db.participant.prepare(txn, ts)
        status, _, payload = await sv.cluster.call(who, "POST", "/v1/internal/txn/prepare", doc={"txn": txn, "ts": ts})
        if status != 200:
            raise_remote(status, payload, who)
        return int(json.loads(payload).get("rows", 0))

    async def commit(self, who: str, txn: int) -> int:
        sv = self.sv
        if who == sv.cluster.node_id:
            return await sv.db.participant.commit(txn)
        status, _, payload = await sv.cluster.call(who, "POST", "/v1/internal/txn/commit", doc={"txn": txn})
        if status != 200:
            raise_remote(status, payload, who)
        return int(json.loads(payload)["commit_ts"])

    async def abort(self, who: str, txn: int) -> None:
        if who == self.sv.cluster.node_id:
            await self.sv.db.participant.abort(txn)
            return
        await self.sv.cluster.call(who, "POST", "/v1/internal/txn/abort", doc={"txn": txn})


async def _reserve(sv: Serving, who: str, d: TableDef, rows: pa.RecordBatch, body: bytes | None, floor: int,
                   txn: int, delete: bool) -> dict[str, Any]:
    if who == sv.cluster.node_id:
        r = await sv.db.participant.reserve(d.name, d.table_id, schema_of(d).version, rows, floor, txn, delete)
        return {"ts": r.ts, "rows": r.rows, "existed": r.existed}
    q = (f"/v1/internal/txn/reserve?table={d.name}&table_id={d.table_id}&schema_version={schema_of(d).version}"
         f"&floor={floor}&txn={txn}&delete={int(delete)}")
    status, _, payload = await sv.cluster.call(who, "POST", q, body=body, headers={"Content-Type": ARROW_STREAM})
    if status != 200:
        raise_remote(status, payload, who)
    ans: dict[str, Any] = json.loads(payload)
    return ans


async def _reserve_where(sv: Serving, who: str, d: TableDef, spec: dict[str, Any], pids: list[int], floor: int,
                         txn: int) -> dict[str, Any]:
    if who == sv.cluster.node_id:
        r = await sv.db.participant.reserve_where(d.name, d.table_id, schema_of(d).version, spec.get("where"),
                                                  spec.get("bbox"), spec.get("prefix"), pids, floor, txn)
        return {"ts": r.ts, "rows": 0, "existed": 0}
    q = (f"/v1/internal/txn/reserve?table={d.name}&table_id={d.table_id}&schema_version={schema_of(d).version}"
         f"&floor={floor}&txn={txn}")
    status, _, payload = await sv.cluster.call(who, "POST", q, doc=dict(spec, partitions=pids))
    if status != 200:
        raise_remote(status, payload, who)
    ans: dict[str, Any] = json.loads(payload)
    return ans


async def _abort_all(parts: Participants, whos: list[str], txn: int) -> None:
    """Best effort: a participant that misses this aborts by itself after its prepare timeout."""
    answers = await asyncio.gather(*(parts.abort(w, txn) for w in whos), return_exceptions=True)
    for who, r in zip(whos, answers):
        if isinstance(r, BaseException):
            log.warning("event=txn_abort_unsent txn=%s node=%s error=%r", txn_key(txn), who, r)
