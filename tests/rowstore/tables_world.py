"""A node's tables on in-memory devices that can crash (unsynced bytes lost) and restart."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from catalog.memory import MemoryCatalog
from rowstore.db.database import Database, TablesConfig
from terrafs.active import ActiveConfig
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.fs import FsConfig, TerrascaleFS
from tests.fixtures.clock import ManualClock

SCHEMA = "id int64 primary key, ts timestamp, loc point, name string, v float64, n int64"


class TablesWorld:
    def __init__(self, partitions: int = 4, fs_cfg: dict | None = None, objects=None, kek=None, **cfg):
        self.cat, self.block, self.objects = MemoryCatalog(), MemoryBlockDevice(), objects or MemoryObjectStore()
        self.kek = kek
        self.cfg = TablesConfig(partitions=partitions, **cfg)
        self.fs_cfg = fs_cfg or {}  # FsConfig overrides (tiny caches)
        self.clock = ManualClock()  # kept across restarts, like a machine's clock

    async def start(self) -> Database:
        fs = TerrascaleFS(self.cat, self.block, MemoryBlockDevice(durable=False), self.objects, kek=self.kek,
                          config=FsConfig(**{"sealed_block_size": 4096, "flush": ActiveConfig(flush_ms=0.5),
                                             **self.fs_cfg}))
        await fs.open()
        db = Database(fs, self.cfg, self.clock.now_ms)
        await db.open()
        self.db = db
        return db

    def crash(self, tear: bool = False) -> None:
        """Power loss: unsynced bytes go, and the old process's pending work dies with it."""
        self.block.crash(tear_seed=7 if tear else None)
        if getattr(self, "db", None) is not None:
            self.db.tasks.cancel_all()


def rows(ids, v=None, seed: int = 0) -> pa.Table:
    ids = np.asarray(ids, np.int64)
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0, 100, len(ids)), rng.uniform(0, 100, len(ids))
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "ts": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")),
        "loc": pa.StructArray.from_arrays([pa.array(x), pa.array(y)], names=["x", "y"]),
        "name": pa.array([f"name-{i % 13}" for i in ids.tolist()]),
        "v": pa.array(rng.uniform(-50, 50, len(ids)) if v is None else np.full(len(ids), v, float)),
        "n": pa.array(ids % 17, pa.int64()),
    })
