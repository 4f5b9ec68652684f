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
    return {f"{name}/{r['name']}": r["rows"] for name, e in manifest["objects"].items() for r in e.get("reads", [])}


def test_the_python_reader_finds_the_manifests_rows_in_the_stored_objects():
    stored = _manifest()
    assert asyncio.run(read_back(DEFAULT_DIR, stored)) == _rows(stored)


def test_the_writer_writes_the_same_data_again(tmp_path):
    """Rows and uncompressed bytes; zstd's bytes may change with the library's version."""
    fresh = asyncio.run(build(tmp_path))
    assert _rows(fresh) == _rows(_manifest()), f"the golden data changed: {REGENERATE}"
    for name in ("stored.obj", "corrupt.obj"):
        assert (tmp_path / name).read_bytes() == (DEFAULT_DIR / name).read_bytes(), \
            f"the Python writer now writes {name} differently (a format change?): {REGENERATE}"
