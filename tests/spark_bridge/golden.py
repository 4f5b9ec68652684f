"""Golden sealed objects for the JVM reader's own tests (spark_bridge/jvm/test/): segments the
Python writer writes (rowstore.codec.rows, rowstore.segments.sealed, terrafs.sealed) — stored,
zstd, encrypted, several schema versions, and one with a flipped byte — and a manifest,
``golden.json``, of what a reader must find in them: the rows ``rowstore.reads.external``
returns for given visible bitmaps, row ranges and predicates (the node's typed form), or the
error a damaged object must fail with.

The same rows as columnar segments (version 2, docs/format/segment.md §7; rowstore.segments.
columnar) are under ``columnar_objects``, each naming its row-wise ``twin``, in groups of 50 rows
and small pages so that a few rows make many groups and pages; with them the worked example of
§7.3 (``columnar-example.obj``) and a columnar object with a flipped byte in one column's page.
The JVM reader's tests read both (GoldenRowsTest), and hold each columnar object's rows equal to
its twin's.

``python -m tests.spark_bridge.golden [DIR]`` writes them (default: spark_bridge/jvm/testdata/).
The bytes are the same on every run: values are arithmetic, not random, and the writer's key
and nonces come from a seeded generator while it runs. tests/spark_bridge/test_golden_segments.py
checks that the stored files still hold what the writer writes today.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import random
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

import rowstore.segments.columnar_write as columnar_write
from node.http.routes.bridge import typed_predicates
from rowstore.codec.rows import encode_rows
from rowstore.reads.external import read_segment
from rowstore.reads.plan import SegmentSlice, visible_bitmap
from rowstore.reads.predicates import parse_bbox, parse_where
from rowstore.schema import SchemaVersion, parse_schema
from rowstore.segments.columnar_write import columnar_bytes
from rowstore.segments.sealed import key_columns_schema, sealed_bytes
from terrafs import crypto
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.blocks import HEADER_LEN, Codec
from terrafs.crypto import KeyEncryptionKey
from terrafs.params import new_params
from terrafs.sealed import SealedFile, SealedWriter

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / "spark_bridge" / "jvm" / "testdata"
STORE = "memory://golden"  # the object names in error messages: <STORE>/<file>
KEK = bytes(range(32))
INODE = 7
BLOCK = 4096  # small blocks: a read spans several, and starts and ends inside some
GOLDEN_GROUP_ROWS = 50  # columnar objects: groups of 50 rows (readers take the trailer's count)
GOLDEN_PAGE_BYTES = 512  # and pages of ~512 plain bytes: several pages per chunk

ALL_TYPES = parse_schema(
    "id int64 primary key, i8 int8, i16 int16, i32 int32, u8 uint8, u16 uint16, u32 uint32, u64 uint64, "
    "f32 float32, f64 float64, b bool, s string, bin binary, ts timestamp, d date, u uuid, j json, "
    "loc point, bx box, ri range<int64>, rf range<float64>, rt range<timestamp>")


def _all_types_row(k: int, gen: int) -> dict:
    """Every column type, edge values included (the extremes of each integer width, unsigned
    values above the signed range, empty and multi-byte strings); some nulls in every column."""
    r = {"id": k, "i8": (k * 37) % 256 - 128, "i16": (k * 4099) % 65536 - 32768,
         "i32": (k * 2_654_435_761) % 2**32 - 2**31, "u8": (k * 7) % 256, "u16": (k * 331) % 65536,
         "u32": (k * 2_654_435_761) % 2**32, "u64": (k * 0x9E3779B97F4A7C15) % 2**64,
         "f32": float(np.float32(k / 7 - 20)), "f64": k * 0.25 - 50.0, "b": k % 3 == 0,
         "s": ["", "name-%d-v%d" % (k, gen), "ünïcode-%d ✓" % k][k % 3],
         "bin": bytes((k + i) % 256 for i in range(k % 9)),
         "ts": (k * 86_400_000_123 - 2**40) * (1 if k % 2 else -1), "d": k * 97 - 10_000,
         "u": uuid.UUID(int=(k * 0x1F1F_1F1F_1F1F_1F1F_1F1F) % 2**128).bytes,
         "j": json.dumps({"k": k, "v": [gen, None]}),
         "loc": {"x": k % 20 - 10.0, "y": (k * 3) % 20 - 10.0},
         "bx": {"xmin": float(k % 5), "ymin": 1.0, "xmax": float(k % 5 + k % 7), "ymax": 2.5},
         "ri": {"lower": k, "upper": k + 10, "lower_inclusive": True, "upper_inclusive": k % 2 == 0},
         "rf": {"lower": None if k % 4 == 0 else k / 8, "upper": k / 4 + 1, "lower_inclusive": False,
                "upper_inclusive": True},
         "rt": {"lower": 1_000_000 * k, "upper": None, "lower_inclusive": True, "upper_inclusive": False}}
    if k < 2:  # the extremes of every width
        lo = k == 0
        r.update(i8=-128 if lo else 127, i16=-2**15 if lo else 2**15 - 1, i32=-2**31 if lo else 2**31 - 1,
                 u8=0 if lo else 255, u16=0 if lo else 2**16 - 1, u32=0 if lo else 2**32 - 1,
                 u64=0 if lo else 2**64 - 1)
    for i, c in enumerate(ALL_TYPES.columns[1:]):
        if (k + i) % 17 == 0:
            r[c.name] = None
    return r


def _batch(rows: list[dict], schema: SchemaVersion) -> pa.RecordBatch:
    arrow = schema.arrow()
    cols = {f.name: [r.get(f.name) for r in rows] for f in arrow}
    return pa.record_batch([pa.array(cols[f.name], f.type) for f in arrow], schema=arrow)


class _Commit:
    """One commit's rows as ``sealed_bytes`` takes them."""

    def __init__(self, rows: list[dict], schema: SchemaVersion, ts: int, deleted: list[bool] | None = None):
        mask = None if deleted is None else np.array(deleted)
        enc = encode_rows(_batch(rows, schema), schema, ts, mask)
        self.rows, self.starts, self.commit_ts = enc.buf, enc.starts, ts


def _all_types_commits() -> tuple[list[_Commit], dict[int, SchemaVersion]]:
    """120 rows, then 12 of them again (newer versions) and 6 deletions: a bitmap decides
    which of a key's versions a read sees."""
    s = ALL_TYPES
    commits = [_Commit([_all_types_row(k, 1) for k in range(lo, lo + 60)], s, 1000 + lo) for lo in (0, 60)]
    commits.append(_Commit([_all_types_row(k, 2) for k in range(30, 42)], s, 2000))
    commits.append(_Commit([{"id": k} for k in range(90, 96)], s, 2100, [True] * 6))
    return commits, {1: s}


def _evolved_commits() -> tuple[list[_Commit], dict[int, SchemaVersion]]:
    """Rows of four schema versions in one segment: a column added, one renamed, one dropped and
    a column of the dropped one's name added again (a new id: old values must not show in it)."""
    v1 = parse_schema("id int64 primary key, name string, i8 int8, f float64")
    v2 = v1.add_column("extra", "float64")
    v3 = v2.rename_column("name", "label")
    v4 = v3.drop_column("i8").add_column("i8", "string")  # two versions: v5 is the target
    commits = [
        _Commit([{"id": k, "name": f"n{k}", "i8": k % 100, "f": k / 2} for k in range(100)], v1, 10),
        _Commit([{"id": k, "name": f"m{k}", "i8": -(k % 100), "f": None, "extra": k * 1.5}
                 for k in range(50, 150)], v2, 20),
        _Commit([{"id": k} for k in range(0, 20)], v2, 25, [True] * 20),
        _Commit([{"id": k, "label": f"l{k}", "i8": 3, "f": 1.0, "extra": None} for k in range(140, 190)], v3, 30),
        _Commit([{"id": k, "label": f"x{k}", "f": -1.0, "extra": 2.0, "i8": f"s{k}"} for k in range(180, 230)], v4, 40),
    ]
    return commits, {s.version: s for s in (v1, v2, v3, v4)}


@contextmanager
def _seeded_randomness(seed: int):
    """The writer draws data keys and nonces from os.urandom; a seeded stream makes the
    encrypted object the same bytes on every run (test data only)."""
    rng = random.Random(seed)
    with mock.patch.object(crypto.os, "urandom", lambda n: rng.randbytes(n)):
        yield


async def _write(commits, schemas, codec: Codec, kek: KeyEncryptionKey | None, segid: int,
                 version: int = 1) -> bytes:
    keys = key_columns_schema(schemas[min(schemas)])

    async def batches():
        for c in commits:
            yield c

    dev = MemoryBlockDevice()
    out = await dev.create("stage")
    w = SealedWriter(out, new_params(INODE, 1, codec=codec, block_size=BLOCK, kek=kek), kek)
    write = columnar_bytes if version == 2 else sealed_bytes
    with mock.patch.object(columnar_write, "GROUP_ROWS", GOLDEN_GROUP_ROWS), \
            mock.patch.object(columnar_write, "PAGE_BYTES", GOLDEN_PAGE_BYTES):
        async for chunk in write(segid, batches(), schemas.__getitem__, keys):
            await w.write(chunk)
    size = await w.finish()
    return bytes(await out.pread(0, size))


def _canonical(batch: pa.RecordBatch, schema: SchemaVersion) -> list[list]:
    """Rows as the JVM test compares them, one list per row in the schema's column order:
    integers (timestamps µs, dates days), floats, text, base64 for binary, uuid text, structs
    as objects."""
    out = []
    for row in batch.to_pylist():
        r = []
        for c in schema.columns:
            v, kind = row[c.name], c.type.kind.value
            if isinstance(v, bytes):
                v = str(uuid.UUID(bytes=v)) if kind == "uuid" else base64.b64encode(v).decode()
            elif isinstance(v, dt.datetime):
                v = _micros(v)
            elif isinstance(v, dt.date):
                v = (v - dt.date(1970, 1, 1)).days
            elif isinstance(v, dict):
                v = {k: _micros(x) if isinstance(x, dt.datetime) else x for k, x in v.items()}
            r.append(v)
        out.append(r)
    return out


def _micros(t: dt.datetime) -> int:
    t = t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)


async def _expect(store, name: str, entry: dict, read: dict, kek) -> list[list]:
    """What the Python reader returns for ``read``; a task's row range is the visible rows in it."""
    schemas = {v.version: v for v in map(SchemaVersion.from_json, entry["versions"])}
    target = SchemaVersion.from_json(entry["schema"])
    visible = BitMap.deserialize(base64.b64decode(read["visible"]))
    if "first_row" in read:
        visible &= BitMap(range(read["first_row"], read["end_row"]))
    part = SegmentSlice(1, name, entry["object_size"], entry["rows"], visible.serialize())
    terms = parse_where(target, read.get("where"))
    box = parse_bbox(target, read.get("bbox"))
    got = [b async for b in read_segment(STORE, part, schemas.__getitem__, target, terms, box, kek, store=store)]
    return _canonical(pa.Table.from_batches(got, target.arrow()), target)


async def read_back(folder: Path, manifest: dict) -> dict[str, list[list]]:
    """Each read of the manifest done by the Python reader on the objects in ``folder``:
    {"object/read name": rows}."""
    store = MemoryObjectStore(STORE)
    kek = KeyEncryptionKey.load(str(folder / manifest["kek_file"]))
    out = {}
    for name, entry in [*manifest["objects"].items(), *manifest.get("columnar_objects", {}).items()]:
        await store.put(name, (folder / name).read_bytes())
        for r in entry.get("reads", []):
            out[f"{name}/{r['name']}"] = await _expect(store, name, entry, r, kek)
    return out


def _reads(rows: int, target: SchemaVersion, extra: list[dict], subsets: bool) -> list[dict]:
    """Every localid visible; with ``subsets`` every third and a split task's row range too;
    then ``extra``'s predicates."""
    every = list(range(rows))
    reads = [{"name": "every row", "visible": every}]
    if subsets:
        reads += [{"name": "every third row", "visible": every[::3]},
                  {"name": "rows 23..101 of a split segment", "visible": every, "first_row": 23, "end_row": 101}]
    reads += [dict(r, visible=every) for r in extra]
    for r in reads:
        r["visible"] = base64.b64encode(visible_bitmap(np.array(r["visible"], np.uint32))).decode()
        if "where" in r or "bbox" in r:
            r["predicates"] = typed_predicates(target, r.get("where"), r.get("bbox"))
    return reads


ALL_TYPES_PREDICATES = [
    {"name": "int and string terms", "where": [["i32", ">", "0"], ["s", ">=", "name-15"]]},
    {"name": "uint64 above the signed range, timestamp", "where": [["u64", ">=", "9223372036854775808"],
                                                                  ["ts", "<", "2000-01-01T00:00:00Z"]]},
    {"name": "ranges", "where": [["ri", "=", "50"], ["rf", "<", "3"], ["rt", ">", "1970-01-01T00:00:05Z"]]},
    {"name": "bool, date, float, unsigned !=", "where": [["b", "=", "true"], ["d", ">=", "1960-01-01"],
                                                         ["f64", "<", "0"], ["u16", "!=", "7"]]},
    {"name": "binary and uuid", "where": [["bin", ">", "AQI="], ["u", "!=", "00000000-0000-0000-0000-000000000000"]]},
    {"name": "bbox on a point", "bbox": {"column": "loc", "xmin": -3, "ymin": -3, "xmax": 5, "ymax": 5}},
    {"name": "bbox on a box", "bbox": {"column": "bx", "xmin": 0, "ymin": 1, "xmax": 3, "ymax": 1.5},
     "where": [["i8", "<", "0"]]},
]
EVOLVED_PREDICATES = [
    {"name": "a renamed column and one added later", "where": [["label", ">=", "m1"], ["extra", ">", "80"]]},
]


async def build(out_dir: Path) -> dict:
    """Write the golden objects and golden.json into ``out_dir``; returns the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kek = KeyEncryptionKey(KEK)
    (out_dir / "kek.hex").write_text(KEK.hex() + "\n")
    store = MemoryObjectStore(STORE)
    manifest: dict = {"store": STORE, "kek_file": "kek.hex", "objects": {}}
    specs = [("stored.obj", _all_types_commits, Codec.NONE, None, ALL_TYPES_PREDICATES, True),
             ("zstd.obj", _all_types_commits, Codec.ZSTD, None, [], False),
             ("encrypted.obj", _all_types_commits, Codec.ZSTD, kek, ALL_TYPES_PREDICATES[:1], False),
             ("evolved.obj", _evolved_commits, Codec.ZSTD, None, EVOLVED_PREDICATES, True)]
    for segid, (name, make, codec, key, preds, subsets) in enumerate(specs, 1):
        commits, schemas = make()
        with _seeded_randomness(segid):
            raw = await _write(commits, schemas, codec, key, segid)
        (out_dir / name).write_bytes(raw)
        await store.put(name, raw)
        rows = sum(len(c.starts) for c in commits)
        target = schemas[max(schemas)]
        entry = {"object_size": len(raw), "rows": rows, "codec": codec.name.lower(), "encrypted": key is not None,
                 "versions": [schemas[v].to_json() for v in sorted(schemas)], "schema": target.to_json(),
                 "reads": _reads(rows, target, preds, subsets)}
        if key is not None:
            sf = await SealedFile.open(store, name, kek=kek)
            p = sf.params
            entry["data_key"] = base64.b64encode(kek.unwrap(p.wrapped_key, p.key_id, p.inode, sf.where)).decode()
            entry["key_id"] = kek.key_id
        manifest["objects"][name] = entry
    rows = await read_back(out_dir, manifest)
    for name, entry in manifest["objects"].items():
        for r in entry["reads"]:
            r["rows"] = rows[f"{name}/{r['name']}"]
    manifest["objects"]["corrupt.obj"] = await _corrupt(out_dir, store)
    manifest["columnar_objects"] = await _columnar(out_dir, store, kek, specs)
    (out_dir / "golden.json").write_text(json.dumps(manifest, sort_keys=True, separators=(",", ":")) + "\n")
    return manifest


async def _corrupt(out_dir: Path, store) -> dict:
    """stored.obj with one bit flipped in the payload of its third block: a reader must refuse
    it, naming the object, the block's offset and the failed check."""
    raw = bytearray((out_dir / "stored.obj").read_bytes())
    sf = await SealedFile.open(store, "stored.obj")
    block = int(sf._blocks["physical"][2])
    raw[block + HEADER_LEN + 100] ^= 0x10
    (out_dir / "corrupt.obj").write_bytes(bytes(raw))
    return {"object_size": len(raw), "error": {"offset": block, "what": "block payload checksum mismatch"},
            "flipped": block + HEADER_LEN + 100}


def _example_commits() -> tuple[list[_Commit], dict[int, SchemaVersion]]:
    """docs/format/segment.md §7.3's segment: (7, null, "ab") at 100 and (8, 1.5, "ab") at 101."""
    s = parse_schema("id int64 primary key, temp float32, name string", version=3)
    return [_Commit([{"id": 7, "temp": None, "name": "ab"}], s, 100),
            _Commit([{"id": 8, "temp": 1.5, "name": "ab"}], s, 101)], {3: s}


async def _columnar(out_dir: Path, store, kek: KeyEncryptionKey, specs: list) -> dict:
    """The row-wise objects' rows again as columnar segments (each names its ``twin``), the
    worked example, and a columnar object with a flipped byte in one column's page."""
    out: dict = {}
    twins = [(f"columnar-{name}", name, make, codec, key, preds, subsets)
             for name, make, codec, key, preds, subsets in specs]
    twins.append(("columnar-example.obj", None, _example_commits, Codec.NONE, None, [], False))
    for segid, (name, twin, make, codec, key, preds, subsets) in enumerate(twins, 11):
        commits, schemas = make()
        with _seeded_randomness(segid):
            raw = await _write(commits, schemas, codec, key, 5 if twin is None else segid, version=2)
        (out_dir / name).write_bytes(raw)
        await store.put(name, raw)
        rows = sum(len(c.starts) for c in commits)
        target = schemas[max(schemas)]
        out[name] = {"object_size": len(raw), "rows": rows, "codec": codec.name.lower(), "encrypted": key is not None,
                     "versions": [schemas[v].to_json() for v in sorted(schemas)], "schema": target.to_json(),
                     "reads": _reads(rows, target, preds, subsets), "format": 2, "twin": twin,
                     "group_rows": GOLDEN_GROUP_ROWS}
    rows = await read_back(out_dir, {"kek_file": "kek.hex", "objects": {}, "columnar_objects": out})
    for name, entry in out.items():
        for r in entry["reads"]:
            r["rows"] = rows[f"{name}/{r['name']}"]
    out["columnar-corrupt.obj"] = await _columnar_corrupt(out_dir, store)
    return out


async def _columnar_corrupt(out_dir: Path, store) -> dict:
    """columnar-stored.obj with one bit flipped in the payload of the block of the first page of
    column ``f64``: a reader must refuse it naming the segment and the column."""
    from rowstore.segments.columnar import ColumnarSegment
    raw = bytearray((out_dir / "columnar-stored.obj").read_bytes())
    sf = await SealedFile.open(store, "columnar-stored.obj")
    seg = await ColumnarSegment.open(sf)
    col = ALL_TYPES.by_name("f64")
    assert col is not None
    ci = seg.index_of(col)
    page = int(seg.meta.chunks[0, ci]["first"])
    logical = int(seg.meta.pages["off"][page])
    block = int(np.searchsorted(sf._logical, logical, "right")) - 1
    phys = int(sf._blocks["physical"][block])
    raw[phys + HEADER_LEN + 3] ^= 0x10
    (out_dir / "columnar-corrupt.obj").write_bytes(bytes(raw))
    return {"object_size": len(raw), "format": 2, "error": {"offset": phys, "what": "block payload checksum mismatch",
                                                             "segment": seg.segid, "column": col.id},
            "flipped": phys + HEADER_LEN + 3}


if __name__ == "__main__":
    target_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_DIR
    asyncio.run(build(target_dir))
    print(f"wrote {len(os.listdir(target_dir))} files into {target_dir}")
