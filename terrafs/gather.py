"""Many small ranges out of a file's blocks (a row store's multi-row get), shared by active
and sealed files: each block touched is fetched once, only the ranges' bytes are copied.

A multi-row get touches about one block per row, so nothing here runs Python bytecode per
range: block lookups and slices go through ``map`` over builtins and one ``join``; only
the rare range that runs into the next block is assembled on its own.
"""
from __future__ import annotations

import operator
from typing import Awaitable, Callable, cast

import numpy as np
import numpy.typing as npt


async def read_ranges(logical: npt.NDArray[np.int64], size: int, offsets: npt.ArrayLike, lengths: npt.ArrayLike,
                      fetch: Callable[[list[int]], Awaitable[dict[int, bytes]]],
                      ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``logical``: each block's first logical offset (sorted); ``fetch(blocks)`` returns the
    decoded blocks asked for. Returns the ranges' bytes back to back and where each starts."""
    offsets = np.asarray(offsets, np.int64)
    ends = offsets + np.asarray(lengths, np.int64)
    if len(offsets) == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    if offsets.min() < 0 or ends.max() > size:
        raise ValueError("a range lies outside the file's bytes")
    first = np.searchsorted(logical, offsets, side="right") - 1
    last = np.searchsorted(logical, np.maximum(ends - 1, offsets), side="right") - 1
    span = last - first + 1
    blocks = np.unique(np.repeat(first, span) + (np.arange(span.sum()) - np.repeat(np.cumsum(span) - span, span)))
    data = await fetch(blocks.tolist())
    lens = ends - offsets
    starts = np.zeros(len(offsets), np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    lo = offsets - logical[first]
    # slices of the blocks' bytes: bytes (operator.getitem is typed for any sequence)
    pieces = cast("list[bytes]", list(map(operator.getitem, map(data.__getitem__, first.tolist()),
                                          map(slice, lo.tolist(), (lo + lens).tolist()))))
    for i in np.flatnonzero(last > first).tolist():  # runs into the next block(s)
        joined = b"".join([data[b] for b in range(int(first[i]), int(last[i]) + 1)])
        pieces[i] = joined[int(lo[i]) : int(lo[i] + lens[i])]
    return np.frombuffer(b"".join(pieces), np.uint8), starts
