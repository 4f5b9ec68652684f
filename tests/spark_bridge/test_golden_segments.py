"""The golden objects of the JVM reader's tests (spark_bridge/jvm/testdata/, written by
tests/spark_bridge/golden.py) hold what the Python side means them to: the Python reader finds
the manifest's rows in the stored files, and the writer of today writes the same data again.
(`make jvm-test` checks that the JVM reader finds the same rows.)"""
from __future__ import annotations

import asyncio
import json

from tests.spark_bridge.golden import DEFAULT_DIR, build, read_back

REGENERATE = "run `python -m tests.spark_bridge.golden`, then `make jvm-test`, and commit spark_bridge/jvm/testdata/"


def _manifest() -> dict:
    return json.loads((DEFAULT_DIR / "golden.json").read_text())


def _rows(manifest: dict) -> dict:
    every = [*manifest["objects"].items(), *manifest.get("columnar_objects", {}).items()]
    return {f"{name}/{r['name']}": r["rows"] for name, e in every for r in e.get("reads", [])}


def test_the_python_reader_finds_the_manifests_rows_in_the_stored_objects():
    stored = _manifest()
    assert asyncio.run(read_back(DEFAULT_DIR, stored)) == _rows(stored)


def test_the_writer_writes_the_same_data_again(tmp_path):
    """Rows and uncompressed bytes; zstd's bytes may change with the library's version."""
    fresh = asyncio.run(build(tmp_path))
    assert _rows(fresh) == _rows(_manifest()), f"the golden data changed: {REGENERATE}"
    for name in ("stored.obj", "corrupt.obj", "columnar-stored.obj", "columnar-example.obj", "columnar-corrupt.obj"):
        assert (tmp_path / name).read_bytes() == (DEFAULT_DIR / name).read_bytes(), \
            f"the Python writer now writes {name} differently (a format change?): {REGENERATE}"


def test_columnar_objects_hold_their_row_wise_twins_rows():
    """Golden segments in both formats: every read of a columnar object finds exactly the rows
    the same read finds in the row-wise object of the same rows."""
    m = _manifest()
    twins = {n: e for n, e in m["columnar_objects"].items() if e.get("twin")}
    assert len(twins) == 4
    for name, e in twins.items():
        twin = m["objects"][e["twin"]]
        assert [r["name"] for r in e["reads"]] == [r["name"] for r in twin["reads"]]
        for r, t in zip(e["reads"], twin["reads"]):
            assert r["rows"] == t["rows"] and r["rows"], (name, r["name"])


def test_the_worked_example_is_the_formats():
    """columnar-example.obj is docs/format/segment.md §7.3's segment, page by page."""
    import numpy as np

    from rowstore.segments.columnar import ColumnarSegment
    from terrafs.backends.memory import MemoryObjectStore
    from terrafs.sealed import SealedFile

    async def pages():
        store = MemoryObjectStore("memory://golden")
        await store.put("x", (DEFAULT_DIR / "columnar-example.obj").read_bytes())
        sf = await SealedFile.open(store, "x")
        seg = await ColumnarSegment.open(sf)
        raw = [await sf.read(int(p["off"]), int(p["len"])) for p in seg.meta.pages]
        return seg, raw

    seg, raw = asyncio.run(pages())
    assert seg.meta.ids.tolist() == [0xFFFFFFF0, 0xFFFFFFF1, 0xFFFFFFF2, 1, 2, 3]
    assert seg.meta.pages["off"].tolist() == [0, 26, 44, 68, 94, 119] and seg.footer.rows_len == 151
    assert (seg.footer.segid, seg.footer.rows, seg.footer.versions) == (5, 2, (3,))
    assert (seg.footer.min_key.hex(), seg.footer.max_key.hex()) == ("8000000000000007", "8000000000000008")
    v = seg.meta.versions[3]
    assert [c.id for c in v.columns] == [1, 2, 3] and [c.nullable for c in v.columns] == [False, True, True]
    assert [r.hex(" ") for r in raw] == [
        "02 00 00 00 00 01 00 00 03 01 00 00 0a 00 00 00 64 00 00 00 00 00 00 00 00 01",
        "02 00 00 00 00 01 00 00 00 01 00 00 02 00 00 00 00 00",
        "02 00 00 00 00 01 00 00 00 04 00 00 08 00 00 00 03 00 00 00 03 00 00 00",
        "02 00 00 00 00 01 00 00 03 01 00 00 0a 00 00 00 07 00 00 00 00 00 00 00 00 01",
        "02 00 00 00 01 01 00 00 02 05 04 00 00 08 00 00 00 00 00 00 00 00 c0 00 3f",
        "02 00 00 00 00 01 00 00 01 00 00 00 10 00 00 00 00 00 00 00 02 00 00 00 04 00 00 00 61 62 61 62"]
    assert np.all(seg.meta.pages["rows"] == 2)


def test_the_damaged_columnar_object_is_refused_naming_segment_and_column():
    import pytest

    from rowstore.errors import ColumnCorruptionError
    from rowstore.segments.columnar import ColumnarSegment
    from terrafs.backends.memory import MemoryObjectStore
    from terrafs.sealed import SealedFile
    from tests.spark_bridge.golden import ALL_TYPES

    m = _manifest()["columnar_objects"]["columnar-corrupt.obj"]

    async def scan():
        store = MemoryObjectStore("memory://golden")
        await store.put("x", (DEFAULT_DIR / "columnar-corrupt.obj").read_bytes())
        seg = await ColumnarSegment.open(await SealedFile.open(store, "x"))
        return [d async for d in seg.scan(None, ALL_TYPES)]

    with pytest.raises(ColumnCorruptionError) as ei:
        asyncio.run(scan())
    assert f"segment {m['error']['segment']} column id {m['error']['column']}" in ei.value.where
    assert m["error"]["what"] in ei.value.reason
