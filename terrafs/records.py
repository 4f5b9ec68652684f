"""The catalog's file table: one row per TerrascaleFS file (docs/format/terrafs.md §4)."""
from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, replace
from typing import TypedDict, Unpack

from terrafs.blocks import Codec

FILE_PREFIX = "fs/file/"


class FileState(str, enum.Enum):
    ACTIVE = "active"  # appendable by its owner
    SEALED = "sealed"  # immutable
    BUILDING = "building"  # a sealed object being built from a stream; not yet readable


class FileTier(str, enum.Enum):
    BLOCK = "block"  # on the owner's durable block device
    OBJECT = "object"  # in the shared object store


_LEGAL = {(FileState.ACTIVE, FileTier.BLOCK), (FileState.SEALED, FileTier.BLOCK),
          (FileState.SEALED, FileTier.OBJECT), (FileState.BUILDING, FileTier.OBJECT)}


@dataclass(frozen=True, slots=True)
class FileRecord:
    inode: int
    gen: int
    state: FileState
    tier: FileTier
    owner: str
    location: str  # device-file name (block tier) or object key (object tier)
    codec: Codec
    encrypted: bool
    size: int = 0  # logical size, known once sealed
    object_size: int = 0

    def __post_init__(self) -> None:
        if (self.state, self.tier) not in _LEGAL:
            raise ValueError(f"illegal file state {self.state.value}/{self.tier.value}")

    @property
    def key(self) -> str:
        return file_key(self.inode)

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d.update(state=self.state.value, tier=self.tier.value, codec=int(self.codec))
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "FileRecord":
        d = json.loads(raw)
        d.update(state=FileState(d["state"]), tier=FileTier(d["tier"]), codec=Codec(d["codec"]))
        return cls(**d)

    def evolve(self, **changes: Unpack[RecordChanges]) -> "FileRecord":
        return replace(self, **changes)


class RecordChanges(TypedDict, total=False):
    """Fields of a :class:`FileRecord` that ``evolve`` may change."""

    inode: int
    gen: int
    state: FileState
    tier: FileTier
    owner: str
    location: str
    codec: Codec
    encrypted: bool
    size: int
    object_size: int


def file_key(inode: int) -> str:
    return f"{FILE_PREFIX}{inode:08x}"


def active_name(inode: int, gen: int) -> str:
    return f"files/{inode:08x}-{gen:016x}.act"


def object_key(inode: int, gen: int) -> str:
    return f"files/{inode:08x}-{gen:016x}.tfs"


def parse_name(name: str) -> tuple[int, int] | None:
    """(inode, gen) from an active-file name or object key, else None."""
    base = name.rsplit("/", 1)[-1].split(".", 1)[0]
    try:
        ino, gen = base.split("-")
        return int(ino, 16), int(gen, 16)
    except ValueError:
        return None
