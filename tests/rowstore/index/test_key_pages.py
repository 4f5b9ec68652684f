"""Run pages parsed all at once (``parse_pages``, the numba kernels) equal the pages parsed one
by one, for every key kind; a malformed page is corruption naming its offset either way."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from rowstore.errors import RowCorruptionError
from rowstore.index.key_memtable import Run
from rowstore.index.key_pages import _parse_page, parse_pages
from rowstore.index.key_run import _page

BASE = 4096  # the file offset the pages' bytes start at


def _keys(kind: str, draw_keys: list[bytes]) -> np.ndarray:
    if kind == "int64":
        return np.array([int.from_bytes(k[:8].ljust(8, b"\1"), "little") for k in draw_keys], np.uint64)
    if kind == "uuid":
        return np.array([k[:16].ljust(16, b"\7") for k in draw_keys], "S16")
    return np.array(draw_keys, object).astype(f"S{max(1, max((len(k) for k in draw_keys), default=1))}")


def _pages(kind: str, keys: np.ndarray, sizes: list[int]) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    run = Run(keys, np.arange(len(keys), dtype=np.uint64) * 3 + 7, np.arange(len(keys), dtype=np.uint64) << 32)
    raw, offs, ends, counts, at = b"", [], [], [], 0
    for n in sizes:
        page = _page(run, at, at + n, kind)
        offs.append(len(raw))
        raw += page
        ends.append(len(raw))
        counts.append(n)
        at += n
    return raw, np.array(offs, np.int64), np.array(ends, np.int64), np.array(counts, np.int64)


def _one_by_one(raw: bytes, offs, ends, counts, kind: str) -> Run:
    got = [_parse_page(raw[a:b], kind, int(n), "w", BASE + a) for a, b, n in zip(offs, ends, counts)]
    return Run(np.concatenate([g.keys for g in got]), np.concatenate([g.ts for g in got]),
               np.concatenate([g.rowids for g in got]))


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["int64", "uuid", "string", "tuple"]),
       keys=st.lists(st.binary(min_size=1, max_size=24).filter(lambda b: not b.endswith(b"\0")), min_size=1,
                     max_size=300),
       page=st.integers(1, 40))
def test_pages_parsed_at_once_equal_pages_parsed_one_by_one(kind, keys, page):
    k = np.sort(_keys(kind, keys))
    sizes = [min(page, len(k) - a) for a in range(0, len(k), page)]
    raw, offs, ends, counts = _pages(kind, k, sizes)
    got = parse_pages(raw, offs, ends, counts, kind, "w", BASE)
    want = _one_by_one(raw, offs, ends, counts, kind)
    assert got.keys.dtype.kind == want.keys.dtype.kind and got.keys.tolist() == want.keys.tolist()
    assert got.ts.dtype == np.uint64 and got.ts.tolist() == want.ts.tolist()
    assert got.rowids.dtype == np.uint64 and got.rowids.tolist() == want.rowids.tolist()


@pytest.mark.parametrize("kind,damage", [(k, d) for k in ("int64", "uuid", "string") for d in ("count", "short")]
                         + [("string", "key offsets")])
def test_a_malformed_page_among_many_is_corruption_naming_it(kind, damage):
    k = np.sort(_keys(kind, [bytes([65 + i % 26]) * (1 + i % 5) + bytes([i]) for i in range(1, 60)]))
    raw, offs, ends, counts = _pages(kind, k, [20, 20, 19])
    raw = bytearray(raw)
    if damage == "count":
        raw[offs[1]] ^= 1  # the page says 21 (or 19) entries; the fence says 20
    elif damage == "short":
        ends = ends.copy()
        ends[1] -= 9
    else:
        raw[offs[1] + 4 : offs[1] + 8] = (10_000).to_bytes(4, "little")  # the first key ends past the page
    with pytest.raises(RowCorruptionError) as e:
        parse_pages(bytes(raw), offs, ends, counts, kind, "run 3", BASE)
    assert "run 3" in str(e.value) and str(BASE + offs[1]) in str(e.value)


def test_no_pages_is_an_empty_run():
    for kind in ("int64", "string"):
        got = parse_pages(b"", np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), kind, "w", 0)
        assert len(got.keys) == len(got.ts) == len(got.rowids) == 0
