"""`terrascale fsck`: offline verification of a node's data, and `--repair` of orphans.

Reads the catalog offline — a ``trkv://`` log and snapshots, or a ``raft://``
replica's journal, meta and dump (``catalog/raft/offline.py``) — then checks every
TerrascaleFS file and object (``terrafs.fsck``), every segment's invariants
(``rowstore.segments.fsck``) and every index run the partition manifests name, and lists every
file and object no catalog row names. Read-only unless ``repair``: then, after every
problem was emitted, orphans (and only orphans) are deleted.
"""
from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from catalog.abc import Catalog, Entry
from catalog.errors import CatalogCorruptionError, CatalogError
from catalog.local import LocalCatalog
from catalog.raft.offline import OfflineRaftCatalog
from node.config import NodeConfig
from node.errors import ConfigError
from rowstore.errors import RowCorruptionError
from rowstore.index.column_index import parse_column_run
from rowstore.rowids import TOMBSTONE
from rowstore.index.key_memtable import Run
from rowstore.index.key_run import IndexRun
from rowstore.segments.fsck import check_segments
from rowstore.segments.position import REP_PREFIX, ReplicaRecord
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.crypto import KeyEncryptionKey
from terrafs.errors import TerrafsError
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.fsck import Problem, check_fs
from terrafs.records import FILE_PREFIX, FileRecord
from terrafs.uri import local_path, open_block_device, open_object_store

log = logging.getLogger("node.fsck")
IDX_PREFIX = "idx/"  # partition manifests: idx/<table id>/<partition>/manifest (docs/format/index-run.md)


def _open_catalog(cfg: NodeConfig) -> LocalCatalog | OfflineRaftCatalog:
    if cfg.catalog.startswith("trkv://"):
        return LocalCatalog(local_path(cfg.catalog), read_only=True, uri=cfg.catalog)
    if cfg.catalog.startswith("raft://"):
        if not cfg.catalog_dir:
            raise ConfigError("catalog.dir: required with a raft:// catalog")
        return OfflineRaftCatalog(cfg.catalog_dir, cfg.catalog)
    raise ConfigError(f"catalog.uri: fsck reads trkv:// and raft:// catalogs; got {cfg.catalog}")


async def fsck(cfg: NodeConfig, *, repair: bool = False,
               emit: Callable[[str], None] = lambda line: None) -> list[Problem]:
    """Every problem found (emitted one line each); with ``repair``, orphans removed after."""
    kek = KeyEncryptionKey.load(cfg.encryption_key_file) if cfg.encryption_key_file else None
    catalog = _open_catalog(cfg)
    try:
        await catalog.open()
    except CatalogCorruptionError as e:
        p = Problem(e.where, e.offset, e.reason)
        emit(p.line())
        return [p]
    except CatalogError as e:
        raise ConfigError(f"catalog.uri: {e}") from None
    try:
        problems = await _check_all(cfg, catalog, kek)
        for p in problems:
            emit(p.line())
        if repair:
            await _repair(cfg, catalog, problems, emit)
        return problems
    finally:
        await catalog.close()


async def _check_all(cfg: NodeConfig, catalog: LocalCatalog | OfflineRaftCatalog,
                     kek: KeyEncryptionKey | None) -> list[Problem]:
    problems: list[Problem] = []
    also_named: list[tuple[int, int]] = []
    node_id: str | None = None
    if catalog.torn_tail is not None:
        problems.append(Problem(catalog.torn_tail[0], catalog.torn_tail[1],
                                "torn tail (an unacknowledged write; cut at the next start)", damage=False))
    files = catalog.files if isinstance(catalog, OfflineRaftCatalog) else None
    if files is not None:  # raft://: the replica's view, and rows its uncommitted entries put
        log.info("event=fsck_raft %s refused_entries=%d", files.summary(), files.refused)
        node_id = cfg.node_id
        also_named = [(r.inode, r.gen) for k, v in files.uncommitted_puts if k.startswith(FILE_PREFIX)
                      for r in _file_record(v)]
    objects = open_object_store(cfg.objects)
    try:
        await objects.open_store()
        block = open_block_device(cfg.block, read_only=True)
        problems += await check_fs(catalog, block, objects, kek, node_id=node_id, also_named=also_named)
        fs = TerrascaleFS(catalog, block, MemoryBlockDevice(durable=False), objects, kek=kek,
                          config=FsConfig(node_id=cfg.node_id))  # read-only use: no open()
        problems += await check_segments(fs)
        problems += await check_index_runs(fs)
        problems += await check_references(catalog)
    finally:
        await objects.close()
    return problems


def _file_record(raw: bytes) -> list[FileRecord]:
    try:
        return [FileRecord.from_bytes(raw)]
    except Exception:  # noqa: BLE001 - a malformed value names nothing
        return []


# -- index runs ----------------------------------------------------------------------------------


async def check_index_runs(fs: TerrascaleFS) -> list[Problem]:
    """Every key-index and column-index run every partition manifest names, and every rowid
    they hold: a segment row must exist for it and, once the segment is sealed, hold its
    localid (docs/format/segment.md §6)."""
    out: list[Problem] = []
    checked = 0
    segs = _segment_rows_by_id(await fs.catalog.scan("rs/seg/"))
    for e in await fs.catalog.scan(IDX_PREFIX):
        if not e.key.endswith("/manifest"):
            continue  # pending markers: files a crash left unpublished, dropped at the next open
        try:
            runs = json.loads(e.value)["runs"]
        except (ValueError, KeyError, TypeError) as err:
            out.append(Problem(f"catalog {e.key}", None, f"malformed manifest: {err}"))
            continue
        for r in runs:
            out += await _check_run(fs, e.key, r, segs)
            checked += 1 + len(r.get("cols") or {})
    log.info("event=fsck_index_runs checked=%d", checked)
    return out


def _segment_rows_by_id(entries: Iterable[Entry]) -> tuple[np.ndarray, np.ndarray]:
    """(segids sorted, their row counts; -1 while the count is not known: an active segment)."""
    got = sorted((d["segid"], d.get("rows", 0) if d.get("state") != "active" else -1)
                 for d in (json.loads(e.value) for e in entries))
    return np.array([s for s, _ in got], np.uint64), np.array([n for _, n in got], np.int64)


def _dangling(rowids: np.ndarray, segs: tuple[np.ndarray, np.ndarray], manifest: str, what: str) -> list[Problem]:
    """Rowids of a run that name no segment, or a localid past a sealed segment's end."""
    ids = np.asarray(rowids, np.uint64)
    ids = ids[ids != np.uint64(TOMBSTONE)]
    segids, counts = segs
    seg, loc = ids >> np.uint64(32), (ids & np.uint64(0xFFFFFFFF)).astype(np.int64)
    at = np.minimum(np.searchsorted(segids, seg), max(len(segids) - 1, 0))
    known = (at < len(segids)) & (segids[at] == seg) if len(segids) else np.zeros(len(ids), bool)
    rows = np.where(known, counts[at] if len(counts) else 0, 0)
    tid, pid = manifest.split("/")[1:3]
    out = []
    for bad, why in ((~known, "no such segment"), (known & (rows >= 0) & (loc >= rows), "past the segment's end")):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            first = int(ids[i])
            out.append(Problem(f"catalog {manifest}", None, f"table {tid} partition {int(pid)}: {what} names "
                               f"{int(bad.sum())} rowids of no row ({why}), e.g. rowid {first} (segment "
                               f"{first >> 32}, localid {first & 0xFFFFFFFF}, segment rows {int(rows[i])})"))
    return out


async def _check_run(fs: TerrascaleFS, manifest: str, r: dict[str, Any],
                     segs: tuple[np.ndarray, np.ndarray]) -> list[Problem]:
    inode, where = r.get("inode"), f"catalog {manifest}"
    assert inode is not None  # every run a manifest names has its inode (docs/format/index-run.md)
    try:
        run = await IndexRun.open(await fs.open_sealed(inode))
        where = run.where
        entries = await run.all()
        _check_entries(run, entries, r)
        out = _dangling(entries.rowids, segs, manifest, f"key-index run (inode {inode})")
        for cid, cinode in (r.get("cols") or {}).items():
            where = f"catalog {manifest} column {cid}"
            sf = await fs.open_sealed(cinode)
            where = sf.where
            rowids, values = parse_column_run(await sf.read(0, sf.size), sf.where)
            if len(rowids) != len(values):
                raise RowCorruptionError(sf.where, 0, f"{len(rowids)} rowids but {len(values)} values")
            out += _dangling(rowids, segs, manifest, f"column {cid} run (inode {cinode})")
        return out
    except RowCorruptionError as err:
        return [Problem(err.where, err.offset, f"index run of {manifest}: {err.reason}")]
    except TerrafsError as err:
        return [Problem(getattr(err, "where", where), getattr(err, "offset", None),
                        f"index run (inode {inode}) of {manifest}: {getattr(err, 'reason', err)}")]


def _check_entries(run: IndexRun, e: Run, r: dict[str, Any]) -> None:
    n = len(e.keys)
    if n != run.entries or ("entries" in r and r["entries"] != n):
        raise RowCorruptionError(run.where, None, f"{n} entries; the footer says {run.entries}, "
                                 f"the manifest {r.get('entries')}")
    if n == 0:
        return
    k, ts = e.keys, e.ts
    ordered = (k[1:] > k[:-1]) | ((k[1:] == k[:-1]) & (ts[1:] < ts[:-1]))
    if not np.all(ordered):
        at = int(np.argmin(ordered)) + 1
        raise RowCorruptionError(run.where, None, f"entry {at} is out of (key asc, commit_ts desc) order")
    if ts.min() < run.min_ts or ts.max() > run.max_ts:
        raise RowCorruptionError(run.where, None, "a commit timestamp lies outside the footer's range")


async def check_references(catalog: Catalog) -> list[Problem]:
    """Every file row is named by a segment row, a follower's replica row, a partition manifest
    (runs, column runs, runs awaiting deletion) or a pending row (a column run or a GC copy not yet published, removed
    at the owner's next start); a sealed file nothing names is leaked space."""
    named: set[int] = set()
    for e in await catalog.scan("rs/seg/"):
        named.add(json.loads(e.value)["inode"])
    for e in await catalog.scan("gc/pending/"):
        named.add(json.loads(e.value)["inode"])
    for e in await catalog.scan(REP_PREFIX):  # a follower's copies (docs/format/replication.md)
        named.update(inode for _, inode in ReplicaRecord.from_bytes(e.value, e.key).segs.values())
    for e in await catalog.scan(IDX_PREFIX):
        if "/pending/" in e.key:
            named.add(int(e.key.rsplit("/", 1)[1], 16))
        elif e.key.endswith("/manifest"):
            m = json.loads(e.value)
            named.update(r["inode"] for r in m.get("runs", []))
            named.update(i for r in m.get("runs", []) for i in (r.get("cols") or {}).values())
            named.update(m.get("garbage", []))
    out = []
    for e in await catalog.scan(FILE_PREFIX):
        for rec in _file_record(e.value):
            if rec.inode not in named and rec.state.value != "building":  # building: finished or removed at start
                out.append(Problem(f"catalog {e.key}", None, f"inode {rec.inode} ({rec.state.value}, "
                                   f"{rec.size} bytes) is named by no segment, index manifest or pending row "
                                   f"(leaked)", damage=False))
    return out


# -- repair --------------------------------------------------------------------------------------


async def _repair(cfg: NodeConfig, catalog: LocalCatalog | OfflineRaftCatalog, problems: list[Problem],
                  emit: Callable[[str], None]) -> None:
    orphans = [p.orphan for p in problems if p.orphan is not None]
    if not orphans:
        emit("repair: no orphans")
        return
    if isinstance(catalog, OfflineRaftCatalog):  # a raft:// catalog (_open_catalog)
        up = _members_up(cfg, catalog)
        if up:
            raise ConfigError(f"--repair: Raft members {', '.join(up)} are running; their catalog may name "
                              "these objects: stop every node first")
    block, objects = open_block_device(cfg.block), open_object_store(cfg.objects)
    await objects.open_store()
    try:
        for store, name in orphans:
            if store == "block":
                await block.delete(name)
                emit(f"repair: removed {block.uri}/{name}")
            else:
                await objects.delete(name)
                emit(f"repair: removed {objects.uri}/{name}")
    finally:
        await objects.close()


def _members_up(cfg: NodeConfig, catalog: OfflineRaftCatalog) -> list[str]:
    from catalog.raft import parse_raft_uri

    assert catalog.files is not None  # read by open()
    members, me, _ = parse_raft_uri(cfg.catalog)
    up = []
    for addr in sorted(set(members) | set(catalog.files.members)):
        if addr == me:
            continue
        host, port = addr.rsplit(":", 1)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                up.append(addr)
        except OSError:
            pass
    return up
