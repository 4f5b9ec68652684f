"""`python -m bench column_pages`: what a paged column run (version 2, docs/format/column-run.md;
RFC 0014 "Step (2)") costs against version 1 on the same entries, run by run (partitions write it).

For each indexed kind, one run of ``TERRASCALE_BENCH_PAGES_ROWS`` entries (default 2,000,000;
rowids of 8 segments): a string of 1,000 sensors, a float64 uniform on [0, 1000), a point
uniform on [0, 1000)², and a range<int64> of intervals of exponential length. Both sides answer
the same predicates and the answers are asserted equal. Version 1 (the peer): the run's Arrow
IPC blob is read and its structure built (what a cold first query pays, and what the run
cache then holds); its query is the in-memory structure's. Version 2 (ours): the fence is read
(what the cache holds instead); a query decodes the pages its fence selects, from bytes in
memory (what the block cache holds). Bytes are zstd level 3 of the whole run (the sealed
file compresses block by block; the ratio is what matters)."""
from __future__ import annotations

import inspect
import os
import time

import numpy as np
import pyarrow as pa
import zstandard

from bench.common import Result, print_table, write_json
from rowstore.index.column_cache import nbytes
from rowstore.index.column_index import ColumnRun, _ipc_bytes, parse_column_run
from rowstore.index.column_kinds import index_kind
from rowstore.index.column_pages import PAGE_ENTRIES, PagedRun, encode_run
from rowstore.index.column_values import gather
from rowstore.reads.predicates import BBox, Term
from rowstore.schema import Column
from rowstore.types import ColumnType

N = int(os.environ.get("TERRASCALE_BENCH_PAGES_ROWS", "2000000"))


def _data(t: str, n: int, rng: np.random.Generator) -> pa.Array:
    if t == "string":
        names = np.array([f"sensor-{i:04d}" for i in range(1000)], dtype=object)
        return pa.array(names[rng.integers(0, 1000, n)].tolist(), pa.string())
    if t == "float64":
        return pa.array(rng.random(n) * 1000)
    if t == "point":
        return pa.StructArray.from_arrays([pa.array(rng.random(n) * 1000), pa.array(rng.random(n) * 1000)],
                                          ["x", "y"])
    lo = rng.integers(0, 1_000_000, n)
    hi = lo + rng.exponential(2_000, n).astype(np.int64)
    return pa.StructArray.from_arrays([pa.array(lo), pa.array(hi), pa.array(np.ones(n, bool)),
                                       pa.array(np.zeros(n, bool))],
                                      ["lower", "upper", "lower_inclusive", "upper_inclusive"])


def _preds(c: Column) -> list[tuple[str, object]]:
    t = str(c.type)
    if t == "string":
        return [("= one of 1,000 sensors", Term(c, "=", "sensor-0042"))]
    if t == "float64":
        return [("< 1% of the values", Term(c, "<", 10.0)), ("a range of 10%", Term(c, ">=", 900.0))]
    if t == "point":
        return [("a box of 1% of the points", BBox(c, 100, 100, 200, 200))]
    return [("intervals holding one value", Term(c, "=", 500_000))]


async def _timed(f, repeat: int = 3):
    """(the best of ``repeat`` runs in seconds, the answer); ``f()`` may return an awaitable."""
    best, got = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        got = f()
        if inspect.isawaitable(got):
            got = await got
        best = min(best, time.perf_counter() - t0)
    return best, got


async def _one(t: str, results: list[Result]) -> None:
    rng = np.random.default_rng(7)
    c = Column(1, t.replace("<", "").replace(">", ""), ColumnType.parse(t))
    rowids = np.sort((rng.integers(1, 9, N).astype(np.uint64) << np.uint64(32))
                     | rng.permutation(N).astype(np.uint64))
    values = _data(t, N, rng)
    v1 = _ipc_bytes(c, index_kind(c), rowids, values)
    v2 = encode_run(c, rowids, values)
    z = zstandard.ZstdCompressor(level=3)
    results.append(Result(f"{t}: bytes at rest (zstd 3), {N:,} entries", len(z.compress(v2)) / 1e6,
                          "version 1 (one Arrow IPC blob, by rowid)", len(z.compress(v1)) / 1e6, "MB",
                          "the cost of the second copy: ≤ 2.5x"))
    build_s, run1 = await _timed(lambda: ColumnRun(c, *parse_column_run(v1, "v1"), 1), 1)
    async def read(o: int, n: int) -> bytes:
        return v2[o:o + n]
    open_s, run2 = await _timed(lambda: PagedRun.open(c, read, len(v2), "v2"))
    fence = run2.fence_bytes
    results.append(Result(f"{t}: what the run cache holds for the run", fence / 1e6,
                          "version 1: the built structure", nbytes(run1) / 1e6, "MB", "≤ 0.01x"))
    results.append(Result(f"{t}: a cold first use (v2: read the fence; v1: parse + build)", open_s * 1e3,
                          "version 1", build_s * 1e3, "ms", "≤ 0.1x"))
    for label, p in _preds(c):
        s1, want = await _timed(lambda p=p: run1.candidates(p))
        run2.pages_read = 0
        s2, got = await _timed(lambda p=p: run2.candidates(p))
        assert got.tolist() == want.tolist(), (t, label)
        pages, filled = run2.pages_read // 3, -(-len(want) // PAGE_ENTRIES)
        results.append(Result(f"{t}: {label}, warm ({len(want):,} rowids: v2 decodes {pages} of "
                              f"{len(run2.key_pages)} pages, for an answer that fills {filled})", s2 * 1e3,
                              "version 1: the built structure in memory", s1 * 1e3, "ms",
                              "pages decoded ≤ 2x + 2 the answer's"))
    if c.type.kind.value == "range":
        return  # the aggregates gather no range values from the index (``gatherable``)
    probe = np.sort(rng.choice(rowids, N // 100, replace=False))
    s1, want = await _timed(lambda: gather([run1], c, probe))
    run2.pages_read = 0
    s2, (at, vals) = await _timed(lambda: run2.values_of(probe))
    assert len(at) == len(probe) and vals.equals(want), t
    label = f"{t}: values of 1% of the rowids, at random ({len(probe):,}: every one of {len(run2.rowid_pages)} pages)"
    results.append(Result(f"{label}, cold: v2 decodes the pages", s2 * 1e3,
                          "version 1: parse + build, then gather", build_s * 1e3 + s1 * 1e3, "ms", "≤ 0.5x"))
    results.append(Result(f"{label}, warm: v2 decodes them again (no decoded-page cache yet)", s2 * 1e3,
                          "version 1: gathered from the built structure's side table", s1 * 1e3, "ms",
                          "none until the decoded-page cache"))


async def main() -> None:
    results: list[Result] = []
    for t in ("string", "float64", "point", "range<int64>"):
        await _one(t, results)
    print_table(f"Paged column runs (version 2) against version 1, {N:,} entries a run", results)
    write_json("column_pages", results)
