"""A read plan: the snapshot an external reader (the Spark bridge) reads on its own
(docs/rfcs/0006-external-reads.md). Made by a node, sent as versioned JSON, read back
into the same types by the reader: the fields are named once, here."""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyroaring import BitMap

from rowstore.errors import QueryError
from rowstore.schema import SchemaVersion

PLAN_VERSION = 1


@dataclass(frozen=True)
class SegmentSlice:
    """One offloaded segment of a read plan."""

    segid: int
    key: str  # object key
    object_size: int
    rows: int
    visible: bytes  # portable roaring bitmap of visible localids

    def to_json(self) -> dict[str, Any]:
        return {"segid": self.segid, "key": self.key, "object_size": self.object_size, "rows": self.rows,
                "visible": base64.b64encode(self.visible).decode()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SegmentSlice:
        return cls(d["segid"], d["key"], d["object_size"], d["rows"], base64.b64decode(d["visible"]))


def visible_bitmap(localids: np.ndarray) -> bytes:
    return BitMap(np.asarray(localids, np.uint32)).serialize()


@dataclass(frozen=True)
class ReadPlan:
    """Per offloaded segment its object and visible localids at ``as_of``; the partitions
    whose visible rows are still on the node (``tail``); the lease that keeps the plan's
    segments from being collected."""

    as_of: int
    table: str
    table_id: str
    schema: SchemaVersion  # the table's schema at as_of: rows are read into it
    versions: tuple[SchemaVersion, ...]  # every schema version rows may be written with
    objects: str  # the object store's URI
    encrypted: bool
    sealed: tuple[SegmentSlice, ...]
    tail: tuple[int, ...]
    lease: str

    @property
    def sealed_segids(self) -> list[int]:
        return sorted(s.segid for s in self.sealed)

    def to_json(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, "as_of": self.as_of, "table": self.table, "table_id": self.table_id,
                "schema": self.schema.to_json(), "versions": [v.to_json() for v in self.versions],
                "objects": self.objects, "encrypted": self.encrypted,
                "sealed": [s.to_json() for s in self.sealed], "tail": list(self.tail), "lease": self.lease}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReadPlan:
        if d.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise QueryError(f"read plan version {d.get('version')!r} is not {PLAN_VERSION}: "
                             f"the reader and the node are of different releases")
        return cls(d["as_of"], d["table"], d["table_id"], SchemaVersion.from_json(d["schema"]),
                   tuple(SchemaVersion.from_json(v) for v in d["versions"]), d["objects"], d["encrypted"],
                   tuple(SegmentSlice.from_json(s) for s in d["sealed"]), tuple(d["tail"]), d["lease"])
