"""Decoded pages of columnar segments' point reads, kept process-wide: a hot row's pages are
decoded once, not at every read (scans never enter it)."""
from __future__ import annotations

from collections import OrderedDict

import pyarrow as pa


class DecodedPages:
    """Decoded pages of point reads, least recently used first out, bounded in bytes: a hot
    row's pages are decoded once, not at every read (scans never enter it)."""

    def __init__(self, capacity: int):
        self.capacity, self.used = capacity, 0
        self._d: OrderedDict[tuple[str, int], pa.Array] = OrderedDict()

    def get(self, key: tuple[str, int]) -> pa.Array | None:
        arr = self._d.get(key)
        if arr is not None:
            self._d.move_to_end(key)
        return arr

    def clear(self) -> None:
        self._d.clear()
        self.used = 0

    def put(self, key: tuple[str, int], arr: pa.Array) -> None:
        if key in self._d:
            return
        self._d[key] = arr
        self.used += arr.nbytes
        while self.used > self.capacity and self._d:
            _, old = self._d.popitem(last=False)
            self.used -= old.nbytes


DECODED = DecodedPages(32 << 20)  # a node's decoded pages of columnar segments (object key, page)
