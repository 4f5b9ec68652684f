"""Where a table's partitions live: the placement record and the balancing rule
(docs/rfcs/0010-replication.md §1; record format: docs/format/placement.md).

``node/place/<table name>`` = JSON ``{"format": 1, "partitions": [{"replicas": [node id,
...], "epoch": n}, ...]}``, one entry per hash partition, its leader first. Written by
compare-and-set by the node that creates the table, before the table itself (two nodes
racing to create a name: one CAS fails). A table from before placements has only RFC
0007's ``node/owner/<table name>``: it reads as every partition on that node, epoch 1.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa

from catalog.errors import CorruptionError
from rowstore.schema import SchemaVersion
from rowstore.tables.definitions import TableDef
from rowstore.tables.keys import key_arrays, partitions_of

PLACE = "node/place/"
FORMAT = 1  # part of the record's format


@dataclass(frozen=True)
class PartitionPlace:
    replicas: tuple[str, ...]
    epoch: int = 1
    base: int = 0  # the epoch whose log the leader continued (docs/format/replication.md)
    start: tuple[int, int] = (0, 0)  # the leader's log end when its epoch began
    leaving: str = ""  # a replica being moved away (rebalancing): dropped once its successor caught up

    @property
    def leader(self) -> str:
        return self.replicas[0]

    def doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {"replicas": list(self.replicas), "epoch": self.epoch}
        if self.base or any(self.start):
            out.update(base=self.base, start=list(self.start))
        if self.leaving:
            out["leaving"] = self.leaving
        return out

    @property
    def copies(self) -> int:
        """The replication factor: replicas, not counting one on its way out."""
        return len(self.replicas) - (1 if self.leaving else 0)


@dataclass(frozen=True)
class Placement:
    partitions: tuple[PartitionPlace, ...]

    def leader(self, pid: int) -> str:
        return self.partitions[pid].leader

    def leaders(self) -> list[str]:
        return [p.leader for p in self.partitions]

    def by_node(self, pids: Iterable[int] | None = None) -> dict[str, list[int]]:
        """node id -> the partitions (of ``pids``, default all) it leads, in order."""
        out: dict[str, list[int]] = {}
        for pid in range(len(self.partitions)) if pids is None else pids:
            out.setdefault(self.partitions[pid].leader, []).append(int(pid))
        return out

    def led_by(self, node: str) -> set[int]:
        return {i for i, p in enumerate(self.partitions) if p.leader == node}

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, "partitions": [p.doc() for p in self.partitions]}).encode()

    def with_partition(self, pid: int, place: PartitionPlace) -> "Placement":
        return Placement(tuple(place if i == pid else p for i, p in enumerate(self.partitions)))

    @classmethod
    def from_bytes(cls, raw: bytes, key: str) -> "Placement":
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}")
            # cast: a start of another length is refused just below
            parts = tuple(PartitionPlace(tuple(str(r) for r in p["replicas"]), int(p["epoch"]), int(p.get("base", 0)),
                                         cast(tuple[int, int], tuple(int(x) for x in p.get("start", (0, 0)))),
                                         str(p.get("leaving", "")))
                          for p in doc["partitions"])
            if not parts or any(not p.replicas or len(set(p.replicas)) != len(p.replicas) or len(p.start) != 2
                                or (p.leaving and p.leaving not in p.replicas) for p in parts):
                raise ValueError("a partition without replicas, with a replica twice, or a bad start")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(key, 0, f"not a placement record: {e}") from None
        return cls(parts)

    @classmethod
    def single(cls, node: str, partitions: int) -> "Placement":
        return cls(tuple(PartitionPlace((node,)) for _ in range(partitions)))

    def json(self) -> list[dict[str, Any]]:
        return [{"partition": i, "leader": p.leader, "replicas": list(p.replicas), "epoch": p.epoch,
                 **({"leaving": p.leaving} if p.leaving else {})}
                for i, p in enumerate(self.partitions)]

    @property
    def replicated(self) -> bool:
        return any(len(p.replicas) > 1 for p in self.partitions)


def plan(members: list[str], partitions: int, replicas: int, led: dict[str, int], held: dict[str, int],
         first: str | None = None) -> Placement:
    """Place ``partitions`` partitions, ``replicas`` copies each, over ``members``.

    Balanced by count: each partition's leader is the member leading the fewest partitions so
    far (``led``: over every other table, updated as this table is placed), its followers
    the members holding the fewest replicas (``held``); ties go to the member after the
    previous pick in id order, starting at ``first`` (the creating node), so equal loads
    spread round-robin instead of piling on the lowest id."""
    ids = sorted(set(members))
    if not ids:
        raise ValueError("no members to place partitions on")
    if not 1 <= replicas <= len(ids):
        raise ValueError(f"{replicas} replicas need as many members; the cluster has {len(ids)}")
    led, held = {m: led.get(m, 0) for m in ids}, {m: held.get(m, 0) for m in ids}
    start = ids.index(first) if first in ids else 0
    leaders = []  # every leader first, so the followers' choice sees the copies they hold
    for _ in range(partitions):
        order = ids[start:] + ids[:start]
        leader = min(order, key=lambda m: led[m])
        led[leader] += 1
        held[leader] += 1
        leaders.append(leader)
        start = (ids.index(leader) + 1) % len(ids)
    out = []
    for leader in leaders:
        at = ids.index(leader)
        rest = ids[at + 1:] + ids[:at]  # ties: the members after the leader, in id order
        followers = sorted(rest, key=lambda m: held[m])[: replicas - 1]
        for m in followers:
            held[m] += 1
        out.append(PartitionPlace((leader, *followers)))
    return Placement(tuple(out))


def counts(placements: Iterable[Placement]) -> tuple[dict[str, int], dict[str, int]]:
    """(partitions led, replicas held) per node over ``placements``."""
    led: dict[str, int] = {}
    held: dict[str, int] = {}
    for pl in placements:
        for p in pl.partitions:
            led[p.leader] = led.get(p.leader, 0) + 1
            for r in p.replicas:
                held[r] = held.get(r, 0) + 1
    return led, held


def schema_of(d: TableDef) -> SchemaVersion:
    """The schema of a described table ``d`` (``describe()`` never returns a dropped one: no schema)."""
    assert d.schema is not None
    return d.schema


def key_partitions(d: TableDef, keys: Sequence[pa.Array] | pa.RecordBatch | pa.Table) -> np.ndarray:
    """The partition of each key of table ``d`` (the format's hash, docs/format/keys.md): its
    checked key columns, or rows holding them."""
    pk = schema_of(d).pk
    arrays = keys if isinstance(keys, (list, tuple)) else key_arrays(pk, keys)
    return partitions_of(pk, arrays, d.partitions)
