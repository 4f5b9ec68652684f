"""`terrascale fsck`: offline, read-only verification of a node's data.

Checks the catalog log and snapshots, then every TerrascaleFS file and object
(``terrafs.fsck``), then every segment's invariants (``rowstore.segments.fsck``).
"""
from __future__ import annotations

from catalog.errors import CatalogCorruptionError, CatalogError
from catalog.local import LocalCatalog
from node.config import NodeConfig
from node.errors import ConfigError
from terrafs.crypto import KeyEncryptionKey
from terrafs.fsck import Problem, check_fs
from rowstore.segments.fsck import check_segments
from terrafs.backends.memory import MemoryBlockDevice
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.uri import local_path, open_block_device, open_object_store


async def fsck(cfg: NodeConfig) -> list[Problem]:
    if not cfg.catalog.startswith("trkv://"):
        raise ConfigError(f"catalog.uri: fsck reads a local trkv:// catalog; got {cfg.catalog}")
    kek = KeyEncryptionKey.load(cfg.encryption_key_file) if cfg.encryption_key_file else None
    catalog = LocalCatalog(local_path(cfg.catalog), read_only=True, uri=cfg.catalog)
    try:
        await catalog.open()
    except CatalogCorruptionError as e:
        return [Problem(e.where, e.offset, e.reason)]
    except CatalogError as e:
        raise ConfigError(f"catalog.uri: {e}") from None
    problems = []
    if catalog.torn_tail is not None:
        problems.append(Problem(catalog.torn_tail[0], catalog.torn_tail[1],
                                "torn tail (an unacknowledged transaction; cut at the next start)", damage=False))
    objects = open_object_store(cfg.objects)
    try:
        await objects.open_store()
        block = open_block_device(cfg.block)
        problems += await check_fs(catalog, block, objects, kek)
        fs = TerrascaleFS(catalog, block, MemoryBlockDevice(durable=False), objects, kek=kek,
                          config=FsConfig(node_id=cfg.node_id))  # read-only use: no open()
        problems += await check_segments(fs)
    finally:
        await objects.close()
        await catalog.close()
    return problems
