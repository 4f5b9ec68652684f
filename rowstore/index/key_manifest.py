"""A partition's key-index manifest (docs/format/index-run.md): the catalog row that names the
runs, the replay mark and the replaced runs still to delete, and the claim of the node that
serves the partition."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Manifest:
    runs: list[dict[str, Any]] = field(default_factory=list)  # {"inode", "level", "entries"}; newest first per level
    mark: list[int] = field(default_factory=lambda: [0, 0])  # (segid, localid) replay starts at
    checkpoints: int = 0
    garbage: list[int] = field(default_factory=list)  # inodes of replaced runs, deleted after the swap
    owner: str = ""  # the claim: the node serving the partition ...
    epoch: int = 0  # ... at this placement epoch (docs/format/index-run.md, "The claim")

    def to_bytes(self) -> bytes:
        return json.dumps({"runs": self.runs, "mark": self.mark, "checkpoints": self.checkpoints,
                           "garbage": self.garbage, "owner": self.owner, "epoch": self.epoch}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "Manifest":
        d = json.loads(raw)
        return cls(d["runs"], d["mark"], d["checkpoints"], d.get("garbage", []), d.get("owner", ""),
                   int(d.get("epoch", 0)))


@dataclass(frozen=True)
class Claim:
    """Who serves a partition: ``owner`` (a node id) at placement ``epoch`` (0: no placement)."""

    owner: str
    epoch: int = 0

    def refuses(self, m: Manifest) -> bool:
        """Whether ``m`` was claimed by a newer server: a higher epoch, or the same epoch
        (above 0) by another node."""
        return m.epoch > self.epoch or (m.epoch == self.epoch > 0 and m.owner not in ("", self.owner))
