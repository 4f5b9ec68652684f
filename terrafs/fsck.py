"""Offline verification of TerrascaleFS data: every checksum and invariant, read-only.

Checks every active file on the block device (header, every group, every
block checksum), every sealed object (footer, key section, block map, every
block, decrypting and decompressing it), and the catalog's file table
against both. Never repairs: a torn tail is reported, not cut.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from catalog.abc import Catalog
from terrafs.abc import BlockDevice, ObjectStore
from terrafs.active import ActiveFile
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import FileCorruptionError, NotFoundError, TerrafsError
from terrafs.records import FILE_PREFIX, FileRecord, FileState, FileTier, parse_name
from terrafs.sealed import SealedFile


@dataclass(frozen=True)
class Problem:
    where: str
    offset: int | None
    reason: str
    damage: bool = True  # False: expected after a crash, repaired at the next start
    orphan: tuple[str, str] | None = None  # ("block" | "objects", name): no catalog row names it

    def line(self) -> str:
        at = f" offset={self.offset}" if self.offset is not None else ""
        kind = "damage" if self.damage else "notice"
        return f"{kind} {self.where}{at}: {self.reason}"


def _problem(where: str, e: TerrafsError) -> Problem:
    if isinstance(e, FileCorruptionError):
        return Problem(e.where, e.offset, e.reason)
    return Problem(where, None, str(e))


async def check_active(dev: BlockDevice, name: str, kek: KeyEncryptionKey | None) -> list[Problem]:
    where = f"{dev.uri}/{name}"
    try:
        af = await ActiveFile.recover(dev, name, kek, read_only=True)
    except TerrafsError as e:
        return [_problem(where, e)]
    try:
        out = []
        if af.torn_tail is not None:
            out.append(Problem(where, af.torn_tail[0], f"torn tail of {af.torn_tail[1]} bytes "
                               "(an unacknowledged write; cut at the next start)", damage=False))
        async for _ in af.scan():  # decrypt and decompress every block
            pass
        return out
    except TerrafsError as e:
        return [_problem(where, e)]
    finally:
        await af.close()


async def check_sealed(store: ObjectStore, key: str, kek: KeyEncryptionKey | None,
                       object_size: int | None = None) -> list[Problem]:
    try:
        sf = await SealedFile.open(store, key, object_size=object_size, kek=kek)
        await sf.verify()
        return []
    except TerrafsError as e:
        return [_problem(f"{store.uri}/{key}", e)]


async def check_fs(catalog: Catalog, block: BlockDevice, objects: ObjectStore,
                   kek: KeyEncryptionKey | None, *, node_id: str | None = None,
                   also_named: Iterable[tuple[int, int]] = ()) -> list[Problem]:
    """Every file the catalog names, every file on the devices, and their agreement.

    ``node_id``: check only this node's block-tier rows against the block device (a shared
    catalog names other nodes' local files too). ``also_named``: (inode, gen) pairs that
    count as named besides the rows (a Raft replica's possibly uncommitted entries)."""
    problems: list[Problem] = []
    recs = [FileRecord.from_bytes(e.value) for e in await catalog.scan(FILE_PREFIX)]
    named = {(r.inode, r.gen) for r in recs} | set(also_named)
    try:
        local = await block.list("files/")
    except FileCorruptionError as e:  # the log device's own structure (docs/format/logdev.md)
        return problems + [Problem(e.where, e.offset, f"the block device cannot be read: {e}")]
    for name in local:
        ident = parse_name(name)
        if ident is None:
            continue
        problems += await check_active(block, name, kek)
        if ident not in named:
            problems.append(Problem(f"{block.uri}/{name}", None, "no catalog row names this file "
                                    "(an orphan; removed at the next start)", damage=False,
                                    orphan=("block", name)))
    for r in recs:
        if r.tier == FileTier.BLOCK and node_id is not None and r.owner != node_id:
            continue  # on that node's own block device
        problems += await _check_record(r, local, objects, kek)
    for info in await objects.list("files/"):
        ident = parse_name(info.key)
        if ident is not None and ident not in named:
            problems.append(Problem(f"{objects.uri}/{info.key}", None, f"no catalog row names this object "
                                    f"(inode {ident[0]}, an orphan: {info.size} bytes)", damage=False,
                                    orphan=("objects", info.key)))
    return problems


async def _check_record(r: FileRecord, local: list[str], objects: ObjectStore,
                        kek: KeyEncryptionKey | None) -> list[Problem]:
    if r.tier == FileTier.BLOCK:
        return [] if r.location in local else [
            Problem(f"catalog fs/file/{r.inode:08x}", None,
                    f"local file {r.location} is missing (owner {r.owner})", damage=r.state != FileState.ACTIVE)]
    if r.state == FileState.BUILDING:
        return [Problem(f"catalog fs/file/{r.inode:08x}", None, "interrupted build; rolled back at the next start",
                        damage=False)]
    try:
        info = await objects.head(r.location)
    except NotFoundError:
        return [Problem(f"{objects.uri}/{r.location}", None, f"object of inode {r.inode} is missing")]
    if info.size != r.object_size:
        return [Problem(f"{objects.uri}/{r.location}", None,
                        f"object is {info.size} bytes; the catalog says {r.object_size}")]
    return await check_sealed(objects, r.location, kek, r.object_size)
