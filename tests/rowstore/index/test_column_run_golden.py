"""Golden column runs of both versions (docs/format/column-run.md): files kept in ``golden/``,
written once by the writers of their version, read today with the answers listed here — a
version-2 run of each kind (pages of 3 entries) and a version-1 run (which partitions still
write). Regenerate (only for a new version, never to make a test pass):
``python -m tests.rowstore.index.test_column_run_golden``."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rowstore.index.column_index import ColumnRun, _ipc_bytes, parse_column_run
from rowstore.index.column_kinds import index_kind
from rowstore.index.column_pages import PagedRun, encode_run, is_paged
from rowstore.reads.predicates import BBox, Term
from rowstore.schema import Column
from rowstore.types import ColumnType

HERE = Path(__file__).parent / "golden"
IDS = (np.uint64(9) << np.uint64(32)) | np.arange(0, 20, 2, dtype=np.uint64)  # 10 entries, localids 0, 2, ... 18


def _runs() -> dict[str, tuple[Column, pa.Array]]:
    pts = [(0.0, 0.0), (1.0, 1.0), (2.0, 5.0), (3.0, 3.0), (4.0, 4.0), (5.0, 2.0), (6.0, 6.0), (7.0, 7.0),
           (float("nan"), 1.0), (9.0, 0.5)]
    return {
        "value": (Column(4, "sensor", ColumnType.parse("string")),
                  pa.array(["b", "a", "c", "a", "é", "b", "a", "", "c", "a"])),
        "axis": (Column(5, "v", ColumnType.parse("float64")),
                 pa.array([5.5, -1.0, 3.25, float("nan"), 8.0, 0.0, 3.25, 100.0, -7.5, 2.0])),
        "range": (Column(6, "r", ColumnType.parse("range<int64>")), pa.StructArray.from_arrays(
            [pa.array([0, 5, None, 10, 3, 7, 1, 20, 8, 4], pa.int64()), pa.array([4, 9, 2, None, 3, 12, 1, 25, 6, 4],
                                                                              pa.int64()),
             pa.array([True] * 10), pa.array([False] * 10)], ["lower", "upper", "lower_inclusive", "upper_inclusive"])),
        "grid": (Column(7, "loc", ColumnType.parse("point")), pa.StructArray.from_arrays(
            [pa.array([p[0] for p in pts]), pa.array([p[1] for p in pts])], ["x", "y"])),
        "box": (Column(8, "area", ColumnType.parse("box")), pa.StructArray.from_arrays(
            [pa.array([p[0] for p in pts]), pa.array([p[1] for p in pts]), pa.array([p[0] + 1.5 for p in pts]),
             pa.array([p[1] + 0.5 for p in pts])], ["xmin", "ymin", "xmax", "ymax"])),
    }


def _preds(kind: str, c: Column) -> list:
    return {"value": [Term(c, "=", "a"), Term(c, "=", "zz"), Term(c, "!=", "b")],
            "axis": [Term(c, "<", 2.0), Term(c, ">=", 3.25), Term(c, "=", 3.25)],
            "range": [Term(c, "=", 4), Term(c, "<", 1), Term(c, ">=", 21)],
            "grid": [BBox(c, 0.5, 0.5, 4.0, 4.0), BBox(c, 8.5, 0.0, 9.5, 1.0)],
            "box": [BBox(c, 2.0, 2.0, 3.0, 3.0), BBox(c, 100.0, 100.0, 101.0, 101.0)]}[kind]


# the localids each predicate selects (the same from both versions)
ANSWERS = {"value": [[2, 6, 12, 18], [], [2, 4, 6, 8, 12, 14, 16, 18]],
           "axis": [[2, 10, 16], [0, 4, 8, 12, 14], [4, 12]],  # NaN matches nothing
           "range": [[0, 18], [0, 4], [6, 14]],  # [8, 6] indexed as [6, 8]; unbounded as ±inf
           "grid": [[2, 6, 8], [18]],  # edges inclusive; the NaN point in no box
           "box": [[6], []]}


def _localids(rowids: np.ndarray) -> list[int]:
    return (rowids & np.uint64(0xFFFFFFFF)).astype(int).tolist()


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_each_golden_version_2_run_answers_as_listed(kind):
    c, values = _runs()[kind]
    raw = (HERE / f"column-run-v2-{kind}.bin").read_bytes()
    assert is_paged(raw) and len(raw) > 200
    async def read(o: int, n: int) -> bytes:
        return raw[o:o + n]

    async def check() -> None:
        run = await PagedRun.open(c, read, len(raw), f"golden {kind}")
        assert len(run.key_pages) == len(run.rowid_pages) == 4 and run.rows == 10
        assert [_localids(await run.candidates(p)) for p in _preds(kind, c)] == ANSWERS[kind]
        at, vals = await run.values_of(IDS)
        assert at.tolist() == list(range(10)) and repr(vals.to_pylist()) == repr(values.to_pylist())
    asyncio.run(check())
    rowids, got = parse_column_run(raw, f"golden {kind}")  # a whole version-2 run, as merges read one
    assert rowids.tolist() == IDS.tolist() and repr(got.to_pylist()) == repr(values.to_pylist())


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_the_golden_version_1_runs_still_open_and_answer_the_same(kind):
    c, values = _runs()[kind]
    raw = (HERE / f"column-run-v1-{kind}.arrow").read_bytes()
    assert not is_paged(raw)
    rowids, got = parse_column_run(raw, f"golden {kind}")
    assert rowids.tolist() == IDS.tolist() and repr(got.to_pylist()) == repr(values.to_pylist())
    run = ColumnRun(c, rowids, got)
    assert [_localids(run.candidates(p)) for p in _preds(kind, c)] == ANSWERS[kind]


def _write() -> None:
    HERE.mkdir(exist_ok=True)
    for kind, (c, values) in _runs().items():
        (HERE / f"column-run-v2-{kind}.bin").write_bytes(encode_run(c, IDS, values, page_entries=3))
        (HERE / f"column-run-v1-{kind}.arrow").write_bytes(_ipc_bytes(c, index_kind(c), IDS, values))


if __name__ == "__main__":
    _write()
    sys.exit(0)
