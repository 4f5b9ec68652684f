"""The workload of both garbage-collection benchmarks (``bench/gc_bench.py`` on one node,
``bench/gc_cluster_bench.py`` on three): its sizes, its rows (each overwrite a new generation),
and the bytes a directory's files hold (space amplification)."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

ROWS = int(os.environ.get("BENCH_GC_ROWS", 200_000))
ROUNDS = int(os.environ.get("BENCH_GC_ROUNDS", 5))
BATCH = 20_000
SCHEMA = "id int64 primary key, v int64, pad string"


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def rows_of(keys: np.ndarray, gen: int, rng) -> pa.Table:
    pad = [f"{gen:04d}" + rng.bytes(56).hex() for _ in range(len(keys))]  # ~116 random chars
    return pa.table({"id": pa.array(keys, pa.int64()), "v": pa.array(np.full(len(keys), gen), pa.int64()),
                     "pad": pa.array(pad)})
