"""The text forms of query predicates, as people type them: the CLI's ``--where``/``--bbox``
and the Spark bridge's ``where``/``bbox`` options (docs/REFERENCE.md §2, docs/spark.md).

They parse into the HTTP API's JSON forms (``[[col, op, value], ...]`` and the bbox
object); values stay strings and the node converts them to the column's type
(``rowstore.reads.predicates``). One parser, so the CLI and the bridge accept the same text."""
from __future__ import annotations

import math
import re
from typing import Any

from rowstore.errors import QueryError

_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(!=|<=|>=|=|<|>)\s*(.*?)\s*$")
_AND = re.compile(r"\s+and(?:\s+|$)", re.IGNORECASE)
WHERE_SYNTAX = "'col op value' with op in = != < <= > >= (several terms joined with 'and')"
BBOX_SYNTAX = "COL:XMIN,YMIN,XMAX,YMAX"


def parse_where_text(text: str) -> list[list[str]]:
    """``'speed > 30 and name = "a b"'`` -> ``[["speed", ">", "30"], ["name", "=", "a b"]]``.

    Quote a value that contains `` and `` or starts and ends with a quote character."""
    out = []
    for part in _split_and(text):
        m = _TERM.match(part)
        if not m or not m.group(3):
            raise QueryError(f"{part.strip()!r} is not {WHERE_SYNTAX}")
        col, op, value = m.groups()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out.append([col, op, value])
    return out


def parse_bbox_text(text: str) -> dict[str, Any]:
    """``loc:13,52,14,53`` -> the HTTP API's bbox object (edges inclusive)."""
    col, sep, rest = text.partition(":")
    try:
        nums = [float(x) for x in rest.split(",")]
    except ValueError:
        nums = []
    if not sep or not col.strip() or len(nums) != 4 or not all(math.isfinite(v) for v in nums):
        raise QueryError(f"expected {BBOX_SYNTAX}, not {text!r}")
    return {"column": col.strip(), "xmin": nums[0], "ymin": nums[1], "xmax": nums[2], "ymax": nums[3]}


def _split_and(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"" and (not cur or "".join(cur).rstrip()[-1:] in "=<>!"):
            quote = ch  # a quoted value starts right after the operator
        else:
            m = _AND.match(text, i)
            if m:
                parts.append("".join(cur))
                cur, i = [], m.end()
                continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts
