"""Log positions and a follower's replica record (docs/format/replication.md)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import NamedTuple

from catalog.errors import CorruptionError

REP_PREFIX = "rs/rep/"


class Position(NamedTuple):
    """``(seq, offset)``: the highest segment a replica holds and its durable logical bytes.
    Tuples compare lexicographically, which is the log order."""

    seq: int
    offset: int

    def json(self) -> list[int]:
        return [self.seq, self.offset]

    @classmethod
    def of(cls, raw: object) -> "Position":
        if not (isinstance(raw, (list, tuple)) and len(raw) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                                        and 0 <= x < 2**63 for x in raw)):
            raise ValueError(f"a position is [seq, offset], not {raw!r}"[:200])
        return cls(int(raw[0]), int(raw[1]))


NOTHING = Position(0, 0)


def rep_key(table_id: str, pid: int, node: str) -> str:
    return f"{REP_PREFIX}{table_id}/{pid:03d}/{node}"


@dataclass
class ReplicaRecord:
    """``rs/rep/<table id>/<pid>/<node>``: what a follower promised and holds."""

    promised: int = 0
    last: int = 0
    segs: dict[int, tuple[int, int]] = field(default_factory=dict)  # segid -> (seq, inode)
    rewriting: dict[int, int] = field(default_factory=dict)  # inode -> segid: a cut copy being written

    def to_bytes(self) -> bytes:
        doc = {"promised": self.promised, "last": self.last,
               "segs": {f"{s:x}": {"seq": q, "inode": i} for s, (q, i) in sorted(self.segs.items())}}
        if self.rewriting:
            doc["rewriting"] = {f"{i:x}": s for i, s in sorted(self.rewriting.items())}
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, key: str) -> "ReplicaRecord":
        try:
            d = json.loads(raw)
            segs = {int(s, 16): (int(v["seq"]), int(v["inode"])) for s, v in d["segs"].items()}
            rewriting = {int(i, 16): int(s) for i, s in d.get("rewriting", {}).items()}
            return cls(int(d["promised"]), int(d["last"]), segs, rewriting)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptionError(key, 0, f"not a replica record: {e}") from None

    def copy(self) -> "ReplicaRecord":
        return ReplicaRecord(self.promised, self.last, dict(self.segs), dict(self.rewriting))


def keeps_log(last: int, pos: Position, epoch: int, base: int, start: Position) -> bool:
    """Whether a replica whose log continues epoch ``last`` and ends at ``pos`` may keep it under
    a leader of ``epoch`` that continued epoch ``base`` from ``start`` (invariant 4): its log is
    then a prefix of the leader's."""
    if last == epoch:
        return True
    return pos == NOTHING or (last == base and pos <= start)
