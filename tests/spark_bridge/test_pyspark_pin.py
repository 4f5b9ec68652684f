"""pyspark is pinned to one minor version (pyproject.toml, extra ``spark``): the JVM reader hands
writes, the change feed and ``reader=python`` to Spark's ``PythonDataSourceV2``, a class internal to
Spark whose constructor and methods may change in any release
(spark_bridge/jvm/src/io/terrascale/spark/source/PythonFallback.java). These tests fail, saying what
to do, when the installed pyspark is another minor version than the pin, or lacks that class."""
from __future__ import annotations

import re
import tomllib
import zipfile
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]
INTERNAL_CLASS = "org/apache/spark/sql/execution/datasources/v2/python/PythonDataSourceV2.class"
HOW_TO_MOVE = (
    "The JVM reader calls Spark's internal PythonDataSourceV2 (constructor, setShortName, inferSchema, "
    "getTable; spark_bridge/jvm/src/io/terrascale/spark/source/PythonFallback.java). To move to another "
    "pyspark minor version: check that class in the new Spark, rebuild with `make jvm`, run `make jvm-test` "
    "and tests/spark_bridge (writes, the change feed and reader=python go through it), then change the pin "
    "in pyproject.toml. To stay on the pin, install the range it names: .venv/bin/pip install -e '.[spark]'.")


def _pinned() -> tuple[int, int]:
    spark = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["spark"]
    spec = next(d for d in spark if d.startswith("pyspark")).replace(" ", "")
    m = re.fullmatch(r"pyspark>=(\d+)\.(\d+)(?:\.\d+)?,<(\d+)\.(\d+)", spec)
    assert m and (int(m[3]), int(m[4])) == (int(m[1]), int(m[2]) + 1), \
        f"pyproject.toml asks for {spec!r}: pin one minor version, as 'pyspark>=X.Y,<X.(Y+1)'. {HOW_TO_MOVE}"
    return int(m[1]), int(m[2])


def test_the_installed_pyspark_is_the_pinned_minor_version():
    pinned = _pinned()
    installed = tuple(int(x) for x in pyspark.__version__.split(".")[:2])
    assert installed == pinned, (f"pyspark {pyspark.__version__} is installed, but pyproject.toml pins "
                                 f"{pinned[0]}.{pinned[1]}.x. {HOW_TO_MOVE}")


def test_the_installed_spark_ships_the_internal_class_the_reader_uses():
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("spark-sql_*.jar"))
    assert jars, "the pyspark wheel ships no spark-sql jar"
    with zipfile.ZipFile(jars[0]) as z:
        assert INTERNAL_CLASS in z.namelist(), f"{jars[0].name} has no {INTERNAL_CLASS}. {HOW_TO_MOVE}"
