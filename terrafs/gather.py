"""Many small ranges out of a file's blocks (a row store's multi-row get), shared by active
and sealed files: each block touched is fetched once, only the ranges' bytes are copied."""
from __future__ import annotations

from typing import Awaitable, Callable

import numpy as np


async def read_ranges(logical: np.ndarray, size: int, offsets, lengths,
                      fetch: Callable[[list[int]], Awaitable[dict[int, bytes]]]) -> tuple[np.ndarray, np.ndarray]:
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
    data = {i: memoryview(b) for i, b in (await fetch(blocks.tolist())).items()}
    lens = ends - offsets
    starts = np.zeros(len(offsets), np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    out = bytearray(int(lens.sum()))
    for o, e, b, p in zip(offsets.tolist(), ends.tolist(), first.tolist(), starts.tolist()):
        while o < e:  # usually one block; a range may run into the next ones
            base = int(logical[b])
            piece = data[b][o - base : e - base]
            out[p : p + len(piece)] = piece
            o, p, b = o + len(piece), p + len(piece), b + 1
    return np.frombuffer(out, np.uint8), starts
