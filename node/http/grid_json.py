"""A histogram's counts as JSON text, by a numba kernel: 256 × 256 cells through ``str`` per
value cost ~5 ms a request, a third of a histogram's time; this writes the digits straight
into one byte buffer (~0.3 ms)."""
from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt


@numba.njit(cache=True, nogil=True)
def _write(counts: npt.NDArray[np.int64], out: npt.NDArray[np.uint8]) -> int:
    n = 0
    out[n] = 91  # [
    n += 1
    digits = np.empty(20, np.uint8)
    for r in range(counts.shape[0]):
        if r:
            out[n] = 44  # ,
            n += 1
        out[n] = 91
        n += 1
        for c in range(counts.shape[1]):
            if c:
                out[n] = 44
                n += 1
            v = counts[r, c]
            k = 0
            while True:
                digits[k] = 48 + v % 10
                v //= 10
                k += 1
                if v == 0:
                    break
            for i in range(k - 1, -1, -1):
                out[n] = digits[i]
                n += 1
        out[n] = 93  # ]
        n += 1
    out[n] = 93
    return n + 1


def counts_json(counts: np.ndarray) -> str:
    """``[[...], ...]`` of non-negative integer counts, a list per row."""
    counts = np.ascontiguousarray(counts, np.int64)
    if counts.size and int(counts.min()) < 0:
        raise ValueError("counts are never negative")
    width = len(str(int(counts.max()))) if counts.size else 1
    out = np.empty(2 + counts.shape[0] * (counts.shape[1] * (width + 1) + 3), np.uint8)
    return out[:_write(counts, out)].tobytes().decode("ascii")
