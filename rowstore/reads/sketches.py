"""Quantiles and approximate distinct counts from Apache DataSketches (RFC 0016): each place
builds one sketch per group of its rows and hands it on serialized, as a binary column of its
partial; the receiving node merges them, so where rows live does not change the error bound.

- ``quantile`` / ``median``: a KLL sketch of doubles, k = ``KLL_K``. The answer is one of the
  group's values whose normalized rank is within ``KLL_RANK_ERROR`` of q (DataSketches' a
  priori bound for one quantile, 99% confidence); a group of at most k values is exact.
  Integers beyond 2^53 are rounded to doubles; NaN and null are left out.
- ``approx_count_distinct``: an HLL sketch, lg k = ``HLL_LG_K`` (HLL_8): relative standard
  error ``HLL_RSE`` after merges (1.04/√4096); small groups are counted almost exactly (the
  sketch keeps coupons before it keeps registers). Null is left out.

The binding updates KLL from a numpy array (one call per group) but HLL one value a call: a
group's values are made distinct by Arrow first, so those calls are one per distinct value.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketches import hll_sketch, hll_union, kll_doubles_sketch, tgt_hll_type

from rowstore.types import Kind

KLL_K = 200
KLL_RANK_ERROR = kll_doubles_sketch.get_normalized_rank_error(KLL_K, False)  # 0.0133
HLL_LG_K = 12
HLL_RSE = 1.04 / 2 ** (HLL_LG_K / 2)  # 0.01625
_HLL = tgt_hll_type.HLL_8


def _spans(gid: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): rows in group order (stable), group g at ``order[bounds[g]:bounds[g+1]]``."""
    order = np.argsort(gid, kind="stable")
    return order, np.searchsorted(gid[order], np.arange(n + 1))


def kll_partials(values: pa.Array | pa.ChunkedArray, gid: np.ndarray, n: int) -> pa.Array:
    """One serialized KLL sketch per group (null: the group has no value)."""
    v = values.cast(pa.float64()).fill_null(np.nan).to_numpy()
    keep = ~np.isnan(v)
    v, g = v[keep], gid[keep]
    order, bounds = _spans(g, n)
    v = v[order]
    out: list[bytes | None] = [None] * n
    for i in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
        sk = kll_doubles_sketch(KLL_K)
        sk.update(np.ascontiguousarray(v[bounds[i]:bounds[i + 1]]))
        out[i] = sk.serialize()
    return pa.array(out, pa.binary())


def hll_partials(values: pa.Array | pa.ChunkedArray, kind: Kind, gid: np.ndarray, n: int) -> pa.Array:
    """One serialized HLL sketch per group (null: the group has no value)."""
    t = pa.table({"g": pa.array(gid, pa.int64()), "v": values}).filter(pc.is_valid(values))
    t = t.group_by(["g", "v"], use_threads=False).aggregate([])  # each group's distinct values
    g = t.column("g").to_numpy()
    vals = _hashable(t.column("v").combine_chunks(), kind)
    order, bounds = _spans(g, n)
    vals = [vals[j] for j in order.tolist()]
    out: list[bytes | None] = [None] * n
    for i in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
        sk = hll_sketch(HLL_LG_K, _HLL)
        deque(map(sk.update, vals[bounds[i]:bounds[i + 1]]), maxlen=0)
        out[i] = sk.serialize_compact()
    return pa.array(out, pa.binary())


def _hashable(values: pa.Array, kind: Kind) -> list[int] | list[float] | list[str]:
    """Values as the sketch hashes them, the same wherever they are read: integers (times,
    booleans) as int64, floats as float64, text and bytes as text (with a tag: the sketch
    skips an empty string)."""
    if pa.types.is_floating(values.type):
        floats: list[float] = values.cast(pa.float64()).to_pylist()
        return floats
    if kind in (Kind.STRING, Kind.BINARY, Kind.UUID):
        if kind == Kind.STRING:
            return ["s" + x for x in values.to_pylist()]
        return ["b" + bytes(x).hex() for x in values.cast(pa.binary()).to_pylist()]
    if kind == Kind.UINT64:
        wrapped: list[int] = values.to_numpy(zero_copy_only=False).view(np.int64).tolist()  # one-to-one
        return wrapped
    ints = values.cast({Kind.DATE: pa.int32(), Kind.BOOL: pa.int8()}.get(kind, values.type)).cast(pa.int64())
    out: list[int] = ints.to_pylist()
    return out


def merge_sketches(col: pa.Array | pa.ChunkedArray, fn: str, gid: np.ndarray, n: int) -> pa.Array:
    """Serialized sketches of partial rows merged per group (``gid``: each row's group)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    ok = col.is_valid().to_numpy(zero_copy_only=False)
    order, bounds = _spans(gid[ok], n)
    blobs = [col[j].as_py() for j in np.flatnonzero(ok)[order].tolist()]
    merge = _merge_kll if fn in ("quantile", "median") else _merge_hll
    out: list[bytes | None] = [None] * n
    for i in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
        out[i] = merge(blobs[bounds[i]:bounds[i + 1]])
    return pa.array(out, pa.binary())


def _merge_kll(blobs: list[bytes]) -> bytes:
    if len(blobs) == 1:
        return blobs[0]
    sk = kll_doubles_sketch.deserialize(blobs[0])
    for b in blobs[1:]:
        sk.merge(kll_doubles_sketch.deserialize(b))
    out: bytes = sk.serialize()
    return out


def _merge_hll(blobs: list[bytes]) -> bytes:
    if len(blobs) == 1:
        return blobs[0]
    u = hll_union(HLL_LG_K)
    for b in blobs:
        u.update(hll_sketch.deserialize(b))
    out: bytes = u.get_result(_HLL).serialize_compact()
    return out


def answers(col: pa.Array | pa.ChunkedArray, fn: str, q: float | None) -> pa.Array:
    """The final answer of each group's merged sketch: a quantile (float64, null for no value)
    or an estimated distinct count (int64, 0 for no value)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if fn == "approx_count_distinct":
        return pa.array([0 if b is None else round(hll_sketch.deserialize(b).get_estimate()) for b in col.to_pylist()],
                        pa.int64())
    rank = 0.5 if q is None else q
    return pa.array([None if b is None else kll_doubles_sketch.deserialize(b).get_quantile(rank)
                     for b in col.to_pylist()], pa.float64())
