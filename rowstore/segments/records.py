"""The segment table's rows (``rs/seg/<segid:08x>``, docs/format/segment.md §5): a segment's
state in its life cycle and what the catalog keeps about it.

    create ──> ACTIVE ──seal──> SEALED ──offload──> OFFLOADED ──(GC)──> RETIRED
"""
from __future__ import annotations

import builtins
import enum
import json
from dataclasses import asdict, dataclass

SEG_PREFIX = "rs/seg/"


class SegState(str, enum.Enum):
    ACTIVE = "active"
    SEALED = "sealed"
    OFFLOADED = "offloaded"
    RETIRED = "retired"


@dataclass(frozen=True)
class SegmentRecord:
    segid: int
    table: str
    partition: int
    state: SegState
    owner: str
    inode: int
    rows: int = 0
    bytes: int = 0
    min_ts: int = 0
    max_ts: int = 0
    live_rows: int = 0
    live_bytes: int = 0
    location: str = ""
    seq: int = 0  # position among its partition's segments (replay order; segids are not ordered)
    retired_ms: int = 0  # when the garbage collector retired it (ms since the epoch)
    copy: bool = False  # written by the garbage collector (rows in cluster order; never replayed)
    deletions: int = 0  # deletion rows (live while newer than the horizon; no index entry names them)
    deletions_max_ts: int = 0  # the newest of them
    cluster: list[int | float] | None = None  # [kind, column id, lo..., hi...]: its rows' cluster range (RFC 0009)
    epoch: int = 0  # the partition's leader epoch when ``owner`` took it (replication, RFC 0010)
    format: int = 1  # of its object: 1 row-wise, 2 columnar (docs/format/segment.md §3, §7)

    @property
    def key(self) -> str:
        return f"{SEG_PREFIX}{self.segid:08x}"

    def to_bytes(self) -> builtins.bytes:  # (the field ``bytes`` hides the type here)
        return json.dumps(dict(asdict(self), state=self.state.value), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: builtins.bytes) -> "SegmentRecord":
        d = json.loads(raw)
        return cls(**{k: v for k, v in dict(d, state=SegState(d["state"])).items() if k in _FIELDS})


_FIELDS = set(SegmentRecord.__dataclass_fields__)
PENDING_PREFIX = "gc/pending/"  # a copy written by the garbage collector, not yet published
SEQ_FLOOR_PREFIX = "rs/seqfloor/"  # a partition's highest seq once no segment row holds it


def seq_floor_key(table: str, partition: int) -> str:
    """The row keeping partition ``partition``'s highest segment ``seq`` after the garbage
    collector retired the segment that held it (docs/format/segment.md §5)."""
    return f"{SEQ_FLOOR_PREFIX}{table}/{partition:03d}"
