"""A partition's epoch history and where a replica's log must be cut to be a prefix of the
current leader's (docs/format/replication.md, "Epoch history"; Kafka's leader-epoch
truncation, KIP-101/279, over our (epoch, base, start) records).

Every election writes, with the placement, the new epoch's ``base`` (the epoch whose log the
new leader continued) and ``start`` (its log end then). The log of epoch E is therefore the
log of ``base(E)`` up to ``start(E)``, followed by what E's leader wrote. A replica whose
``last`` is epoch ``e`` holds a prefix of e's log; the bytes it shares with the current
epoch's log are those below the point where the two lineages part.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

from catalog.abc import Catalog
from catalog.errors import CorruptionError
from rowstore.segments.position import REP_PREFIX, Position, ReplicaRecord
from rowstore.segments.records import SEG_PREFIX, SegmentRecord, SegState

EPOCHS_PREFIX = "rs/epochs/"
KEEP = 64  # newest epochs kept per partition, beside those a replica still needs (``History.with_epoch``)


def epochs_key(table_id: str, pid: int) -> str:
    return f"{EPOCHS_PREFIX}{table_id}/{pid:03d}"


async def replica_lasts(catalog: Catalog, table_id: str, pid: int) -> list[int]:
    """The last epochs of the partition's logs, which the next history must still reach: its
    replica rows', and those of the logs nodes hold as their own — the segment rows, active or
    sealed, that name a node (``SegmentStore.own_log``: a former leader's log that no promotion
    adopted yet, whose ``last`` is the newest epoch among them). Without the latter, a former
    leader away while 64 elections passed came back to a history that no longer reached its
    epoch, and its log was discarded and copied whole again."""
    own: dict[str, int] = {}
    # Segment rows first: a promotion moves a former owner's rows into its replica row in one
    # transaction, so a log missed by this scan (moved since) is found by the next.
    for e in await catalog.scan(SEG_PREFIX):
        r = SegmentRecord.from_bytes(e.value)
        if r.table == table_id and r.partition == pid and r.state in (SegState.ACTIVE, SegState.SEALED):
            own[r.owner] = max(own.get(r.owner, 0), r.epoch)
    lasts = [ReplicaRecord.from_bytes(e.value, e.key).last
             for e in await catalog.scan(f"{REP_PREFIX}{table_id}/{pid:03d}/")]
    return lasts + sorted(own.values())


@dataclass(frozen=True)
class Epoch:
    epoch: int
    base: int
    start: Position
    floor: int = 0  # the new leader's clock starts above it (RFC 0010 §5, "Clocks"); 0: none


@dataclass
class History:
    """``rs/epochs/<table id>/<pid>``: the partition's recent epochs, oldest first."""

    epochs: list[Epoch]

    def to_bytes(self) -> bytes:
        return json.dumps({"epochs": [[e.epoch, e.base, *e.start, e.floor] for e in self.epochs]},
                          separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, key: str) -> "History":
        try:
            d = json.loads(raw)
            return cls([Epoch(int(a), int(b), Position(int(s), int(o)), int(f[0]) if f else 0)
                        for a, b, s, o, *f in d["epochs"]])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(key, 0, f"not an epoch history: {e}") from None

    def with_epoch(self, e: Epoch, needed: Iterable[int] = ()) -> "History":
        """This history and ``e`` (replacing a record of the same epoch): the newest ``KEEP``,
        and every older record that a replica whose last epoch is in ``needed`` (the
        partition's replica rows) still needs to find where its log parts from ``e``'s — so a
        replica many elections behind is cut, never copied whole again, while it is known."""
        rec = {x.epoch: x for x in self.epochs if x.epoch != e.epoch}
        rec[e.epoch] = e
        order = sorted(rec)
        keep = set(order[-KEEP:])
        for last in needed:
            keep |= _read_by_cut(rec, e.epoch, last)
        return History([rec[x] for x in order if x in keep])


def _read_by_cut(rec: dict[int, Epoch], current: int, last: int) -> set[int]:
    """The records ``cut_point`` reads for a replica at ``last`` against ``current``: both
    lineages down to the first epoch they share (nothing when it cannot tell already)."""
    mine, x = [], last
    while True:
        mine.append(x)
        if x == 0 or x not in rec:
            break
        x = rec[x].base
    ours, x = [], current
    while x not in mine:
        if x == 0 or x not in rec:
            return set()
        ours.append(x)
        x = rec[x].base
    return (set(ours) | set(mine[: mine.index(x) + 1])) & set(rec)


def cut_point(last: int, pos: Position, epoch: int, base: int, start: Position,
              history: list[Epoch]) -> Position | None:
    """Where a replica whose log is a prefix of epoch ``last``'s and ends at ``pos`` must be cut
    so that it is a prefix of the log of ``epoch`` (which continued ``base`` from ``start``);
    ``pos`` itself when it need not be cut; None when the history cannot tell (the replica is
    then copied whole again). Epoch 0 is the empty log.

    The replica's bytes below ``pos`` are those of ``last``'s log, which below ``start(last)``
    are ``base(last)``'s, and so on up its ancestors; the current log's are, likewise, its
    ancestors' below each start. Both chains are walked up to the first epoch they share:
    below the smallest start crossed on the way, the two logs are that epoch's."""
    rec = {e.epoch: e for e in history}
    rec[epoch] = Epoch(epoch, base, start)
    mine, cut, x = {}, pos, last  # the replica's ancestors -> what of its bytes is theirs
    while True:
        mine[x] = cut
        if x == 0 or x not in rec:
            break
        cut, x = min(cut, rec[x].start), rec[x].base
    bound, x = None, epoch  # up the current epoch's ancestors to the first the replica shares
    while x not in mine:
        r = rec.get(x)
        if r is None or x == 0:
            return None
        bound = r.start if bound is None else min(bound, r.start)
        x = r.base
    return mine[x] if bound is None else min(mine[x], bound)
