"""``first`` and ``last`` (RFC 0016): the value at the least / greatest ``by`` of each group,
ties broken by the primary key — ``last`` takes the greatest key among rows with the greatest
``by``, ``first`` the least key among rows with the least ``by``. Rows whose ``by`` is null
(or NaN) take no part; the value itself may be null (the value of that row).

A partial keeps, per group, the picked row's value ``p``, its ``by`` ``o`` and its key ``k``
(the index's order-preserving encoding), so picks from many places merge by the same rule.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rowstore.schema import PrimaryKey
from rowstore.tables.keys import encode_columns


def key_order(pk: PrimaryKey, arrays: list[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The rows' primary keys as an Arrow column whose order is the keys' order."""
    flat = [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
    return encoded_key_column(encode_columns(pk, flat))


def encoded_key_column(enc: np.ndarray) -> pa.Array:
    """The index's encoded keys (``u64`` or ``S``) as an Arrow column in the keys' order."""
    if enc.dtype.kind != "S":
        return pa.array(enc)  # uint64
    # bytes padded with NULs to the batch's widest (Arrow's numpy conversion would cut them at
    # the first NUL): no key is a proper prefix of another followed by a NUL, so padding never
    # decides an order
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(enc.dtype.itemsize), len(enc),
                                                 [None, pa.py_buffer(np.ascontiguousarray(enc).tobytes())])
    return fixed.cast(pa.binary())


def at_best(by: pa.Array | pa.ChunkedArray, gid: np.ndarray, n: int, last: bool) -> np.ndarray:
    """Whether each row's ``by`` is its group's greatest (``last``) or least: the only rows a
    pick can take, so the only ones whose keys are needed."""
    by = _comparable(by)
    t = pa.table({"g": pa.array(gid, pa.int64()), "o": by})
    best = t.group_by(["g"], use_threads=False).aggregate([("o", "max" if last else "min")])
    at = np.full(n, -1, np.int64)
    at[best.column("g").to_numpy()] = np.arange(best.num_rows)
    vals = best.column(1).combine_chunks().take(pa.array(at[gid]))
    hit: np.ndarray = pc.equal(by, vals).fill_null(False).to_numpy(zero_copy_only=False)
    return hit


def _comparable(by: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``by`` with NaN as null (a NaN takes no part in a pick)."""
    by = by.combine_chunks() if isinstance(by, pa.ChunkedArray) else by
    if pa.types.is_floating(by.type):
        by = pc.if_else(pc.is_nan(by), pa.scalar(None, by.type), by)
    return by


def pick(value: pa.Array | pa.ChunkedArray, by: pa.Array | pa.ChunkedArray, key: pa.Array | pa.ChunkedArray,
         gid: np.ndarray, n: int, last: bool) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(value, by, key) of each of the ``n`` groups' picked row (nulls: no row with a ``by``)."""
    by = _comparable(by)
    order = "descending" if last else "ascending"
    key = _whole(key)
    # only rows with a key can be picked (an engine gives keys to the rows at their group's
    # best ``by`` alone, :func:`at_best`): the sort is of those
    rows = np.flatnonzero(key.is_valid().to_numpy(zero_copy_only=False)) if key.null_count else None
    sub = pa.array(rows) if rows is not None else None
    t = pa.table({"g": pa.array(gid if rows is None else gid[rows], pa.int64()),
                  "o": by if sub is None else by.take(sub), "k": key if sub is None else key.take(sub)})
    idx = pc.sort_indices(t, sort_keys=[("g", "ascending", "at_end"), ("o", order, "at_end"),
                                        ("k", order, "at_end")]).to_numpy()
    if rows is not None:
        idx = rows[idx]
    g = gid[idx]
    heads = np.flatnonzero(np.r_[True, g[1:] != g[:-1]]) if len(g) else np.zeros(0, np.int64)
    at = np.full(n, -1, np.int64)
    at[g[heads]] = idx[heads]
    taken = pa.array(at, mask=at < 0)
    o = by.take(taken)
    none = o.is_null().to_numpy(zero_copy_only=False)  # every row's by was null: nothing known
    p = value.take(taken)
    if none.any():
        p = pc.if_else(pa.array(none), pa.scalar(None, p.type), p)
    return _whole(p), _whole(o), _whole(key.take(taken))


def _whole(a: pa.Array | pa.ChunkedArray) -> pa.Array:
    return a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
