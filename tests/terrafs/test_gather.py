"""Many ranges out of a file's blocks equal plain slices of the file's bytes."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from terrafs.gather import read_ranges


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), data=st.data())
async def test_read_ranges_equals_slices(sizes, data):
    """Ranges inside one block, across several blocks, empty, repeated, in any order."""
    raw = bytes(np.random.default_rng(len(sizes)).integers(0, 256, sum(sizes), dtype=np.uint8))
    logical = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    blocks = {i: raw[a : a + n] for i, (a, n) in enumerate(zip(logical.tolist(), sizes))}
    offs = data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=20))
    lens = [data.draw(st.integers(0, len(raw) - o)) for o in offs]
    asked = []

    async def fetch(idx):
        asked.append(idx)
        return {i: blocks[i] for i in idx}

    buf, starts = await read_ranges(logical, len(raw), offs, lens, fetch)
    assert [buf[s : s + n].tobytes() for s, n in zip(starts.tolist(), lens)] == \
        [raw[o : o + n] for o, n in zip(offs, lens)]
    assert len(asked) == 1 and len(set(asked[0])) == len(asked[0])  # each block fetched once
