"""Per-chunk statistics of a columnar segment (docs/format/segment.md §7, "Statistics"): null
and distinct counts and the bounds of a chunk's values, written with each chunk and checked
when a chunk is decoded; read by zone maps (``rowstore.reads.zones``) to skip groups."""
from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.errors import ColumnCorruptionError
from rowstore.segments.columnar_layout import CHUNK, HAS_MINMAX, NO_DISTINCT, STAT_BYTES
from rowstore.types import ColumnType, Kind

# -- statistics ---------------------------------------------------------------------------------

_SIGNED = {Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.TIMESTAMP, Kind.DATE, Kind.BOOL}
_UNSIGNED = {Kind.UINT8, Kind.UINT16, Kind.UINT32, Kind.UINT64}
_BYTES = {Kind.STRING, Kind.JSON, Kind.BINARY, Kind.UUID}


def chunk_stats(entry: np.ndarray, arr: pa.Array, t: ColumnType) -> None:
    """Null count, distinct count (where a hash of the values is enough) and bounds."""
    k = t.kind
    entry["nulls"] = arr.null_count
    entry["distinct"] = NO_DISTINCT
    if k in (Kind.POINT, Kind.BOX, Kind.RANGE):
        if k != Kind.RANGE:
            _box_stats(entry, arr, k)
        return
    valid = arr.drop_null() if arr.null_count else arr
    # cheap only where values repeat: a hash of a high-cardinality chunk costs more than its encoding
    if pc.count_distinct(valid.slice(0, 1024)).as_py() * 4 <= min(len(valid), 1024):
        entry["distinct"] = pc.count_distinct(valid).as_py()
    if len(valid) == 0:
        return
    if k in _BYTES:
        vals = valid.cast(pa.binary()) if k != Kind.BINARY else valid
        mm = pc.min_max(vals)
        lo, hi = mm["min"].as_py(), _upper(mm["max"].as_py())
        if hi is None:
            return
        _put(entry, lo[:STAT_BYTES], hi)
    elif k in (Kind.FLOAT32, Kind.FLOAT64):
        v = valid.to_numpy(zero_copy_only=False).astype(np.float64)
        v = v[~np.isnan(v)]
        if len(v) == 0:
            return
        _put(entry, struct.pack("<d", v.min()), struct.pack("<d", v.max()))
    else:
        if k == Kind.TIMESTAMP:
            valid = valid.cast(pa.int64())
        elif k == Kind.DATE:
            valid = valid.cast(pa.int32())
        v = valid.to_numpy(zero_copy_only=False)
        fmt = "<Q" if k in _UNSIGNED else "<q"
        _put(entry, struct.pack(fmt, int(v.min())), struct.pack(fmt, int(v.max())))


def _put(entry: np.ndarray, lo: bytes, hi: bytes) -> None:
    entry["min"][: len(lo)] = np.frombuffer(lo, np.uint8)
    entry["max"][: len(hi)] = np.frombuffer(hi, np.uint8)
    entry["min_len"], entry["max_len"] = len(lo), len(hi)
    entry["flags"] = HAS_MINMAX


def _upper(v: bytes) -> bytes | None:
    """An upper bound of ``v`` in at most ``STAT_BYTES`` bytes (None: none that short)."""
    if len(v) <= STAT_BYTES:
        return v
    p = bytearray(v[:STAT_BYTES])
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def _box_stats(entry: np.ndarray, arr: pa.Array, k: Kind) -> None:
    """The extent of the points (or boxes): (xmin, ymin) and (xmax, ymax) as float64."""
    valid = arr.drop_null() if arr.null_count else arr
    if len(valid) == 0:
        return
    names = ("x", "y", "x", "y") if k == Kind.POINT else ("xmin", "ymin", "xmax", "ymax")
    vals = [valid.field(n).to_numpy(zero_copy_only=False) for n in names]
    ext = [np.nanmin(vals[0]), np.nanmin(vals[1]), np.nanmax(vals[2]), np.nanmax(vals[3])]
    if any(np.isnan(ext)):
        return
    _put(entry, struct.pack("<2d", ext[0], ext[1]), struct.pack("<2d", ext[2], ext[3]))


def check_stats(entry: np.ndarray, arr: pa.Array, t: ColumnType, where: str, g: int) -> None:
    """A chunk's statistics hold for its decoded values (fsck)."""
    fresh = np.zeros((), CHUNK)
    chunk_stats(fresh, arr, t)
    if int(entry["nulls"]) != int(fresh["nulls"]):
        raise ColumnCorruptionError(where, None, f"group {g}: null count {int(entry['nulls'])}, the pages hold "
                                                 f"{int(fresh['nulls'])}")
    if int(entry["distinct"]) != NO_DISTINCT and int(entry["pages"]) and int(entry["distinct"]) != int(
            pc.count_distinct(arr.drop_null() if arr.null_count else arr).as_py()):
        raise ColumnCorruptionError(where, None, f"group {g}: distinct count {int(entry['distinct'])}, the pages "
                                                 f"hold {int(fresh['distinct'])}")
    if not int(entry["flags"]) & HAS_MINMAX:
        return
    if not int(fresh["flags"]) & HAS_MINMAX:
        raise ColumnCorruptionError(where, None, f"group {g}: bounds kept for values that have none")
    lo, hi = bounds(entry, t)
    flo, fhi = bounds(fresh, t)
    if _below(flo, lo) or _below(hi, fhi):
        raise ColumnCorruptionError(where, None, f"group {g}: the values lie outside the chunk's bounds")


def _below(a: Any, b: Any) -> bool:
    """a < b; for (x, y) pairs: either coordinate."""
    if isinstance(a, tuple):
        return bool(a[0] < b[0] or a[1] < b[1])
    return bool(a < b)


def bounds(entry: np.ndarray, t: ColumnType) -> tuple[Any, Any]:
    """A chunk entry's (min, max) as values (``stat_value``)."""
    return (stat_value(t, entry["min"].tobytes(), int(entry["min_len"])),
            stat_value(t, entry["max"].tobytes(), int(entry["max_len"])))


def stat_value(t: ColumnType, raw: bytes, n: int) -> int | float | bytes | tuple[float, float]:
    """A chunk's min or max as a value: ints, floats, bytes (strings as UTF-8), (x, y)."""
    k = t.kind
    if k in _BYTES:
        return raw[:n]
    if k in (Kind.POINT, Kind.BOX):
        x, y = struct.unpack("<2d", raw[:16])
        return (x, y)
    if k in (Kind.FLOAT32, Kind.FLOAT64):
        return float(struct.unpack("<d", raw[:8])[0])
    return int(struct.unpack("<Q" if k in _UNSIGNED else "<q", raw[:8])[0])


