"""Row bytes: the vectorized row codec, its numba kernels, and the one-row point decoder."""
