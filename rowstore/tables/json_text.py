"""JSON text the engine accepts: in request bodies (node/wire.py) and in ``json`` columns.

Strict RFC 8259 — no bare ``NaN`` / ``Infinity`` (Python's parser takes them, and the JSON
output could not write them back) — and nested at most a given depth, checked by one pass
over the bytes *before* parsing, so hostile text never reaches the parser's recursion
(``RecursionError``) nor builds a deep structure that a later ``json.dumps`` cannot write.
"""
from __future__ import annotations

import json
from typing import Any, NoReturn

import numba
import numpy as np
import numpy.typing as npt
from rowstore.errors import RowstoreError

MAX_VALUE_DEPTH = 500  # a json column's value; well below the parsers' recursion limit


class JsonTextError(RowstoreError, ValueError):
    """Raised when text is not strict JSON or nests deeper than allowed."""


def loads(text: str | bytes, max_depth: int) -> Any:
    """``text`` parsed as strict JSON nested at most ``max_depth`` deep, or JsonTextError."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if depth_over(raw, max_depth):
        raise JsonTextError(f"nests arrays and objects more than {max_depth} deep")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise JsonTextError(f"is not valid JSON: {str(e).splitlines()[0][:200]}") from None


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON (a float column takes the string \"{name}\")")


def depth_over(body: bytes, limit: int) -> bool:
    """Whether the JSON text nests ``[``/``{`` (outside strings) more than ``limit`` deep.
    A text with at most ``limit`` opening brackets in all cannot (the usual small body: two
    byte counts, no scan)."""
    if isinstance(body, (bytes, bytearray)) and body.count(b"[") + body.count(b"{") <= limit:
        return False
    return bool(len(body)) and _depth_over(np.frombuffer(body, np.uint8), limit)


@numba.njit(cache=True, nogil=True)
def _depth_over(buf: npt.NDArray[np.uint8], limit: int) -> bool:
    depth, in_str, esc = 0, False, False
    for i in range(buf.shape[0]):
        c = buf[i]
        if in_str:
            if esc:
                esc = False
            elif c == 92:  # backslash
                esc = True
            elif c == 34:  # quote
                in_str = False
        elif c == 34:
            in_str = True
        elif c == 91 or c == 123:  # [ {
            depth += 1
            if depth > limit:
                return True
        elif c == 93 or c == 125:  # ] }
            depth -= 1
    return False
