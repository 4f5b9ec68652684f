"""numba kernels for the byte loops of the row codec that numpy cannot vectorize.

Each moves variable-length byte runs between row-oriented and columnar
buffers; compiled once and cached on disk (``cache=True``).
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def scatter_rows(out, row_start, fixed, fixed_size):
    """Copy row i's fixed part (``fixed[i]``, ``fixed_size`` bytes) to ``out[row_start[i]:]``."""
    for i in range(row_start.shape[0]):
        s = row_start[i]
        out[s : s + fixed_size] = fixed[i]


@numba.njit(cache=True, nogil=True)
def scatter_runs(out, dst_start, src, src_start, lens):
    """Copy ``lens[i]`` bytes from ``src[src_start[i]:]`` to ``out[dst_start[i]:]`` for every i."""
    for i in range(dst_start.shape[0]):
        d, s, n = dst_start[i], src_start[i], lens[i]
        out[d : d + n] = src[s : s + n]


@numba.njit(cache=True, nogil=True)
def gather_fixed(buf, starts, fixed_size, out):
    """``out[i] = buf[starts[i] : starts[i] + fixed_size]`` for every row."""
    for i in range(starts.shape[0]):
        s = starts[i]
        out[i] = buf[s : s + fixed_size]


@numba.njit(cache=True, nogil=True)
def gather_runs(buf, src_start, lens, out_offsets, out):
    """Concatenate ``buf[src_start[i] : + lens[i]]`` into ``out`` at ``out_offsets[i]``."""
    for i in range(src_start.shape[0]):
        d, s, n = out_offsets[i], src_start[i], lens[i]
        out[d : d + n] = buf[s : s + n]


def warm_up() -> None:
    """Compile (or load from cache) every kernel with the dtypes the codec uses."""
    b = np.zeros(8, np.uint8)
    i64 = np.zeros(1, np.int64)
    scatter_rows(b, i64, np.zeros((1, 1), np.uint8), 1)
    scatter_runs(b, i64, b, i64, i64)
    gather_fixed(b, i64, 1, np.zeros((1, 1), np.uint8))
    gather_runs(b, i64, i64, i64, b)
