"""The block cache's many-key lookup: same answers and recency as one ``get_mem`` per key."""
from terrafs.cache import BlockCache


def test_get_mem_many_returns_held_blocks_and_refreshes_them():
    c = BlockCache(memory_bytes=4 * (100 + 64))
    for i in range(4):
        c.put_mem(("f", i), bytes([i]) * 100)
    assert c.get_mem_many([("f", 0), ("f", 9), ("f", 2)]) == {("f", 0): bytes(100), ("f", 2): b"\x02" * 100}
    assert c.stats["mem_hits"] == 2
    c.put_mem(("f", 4), b"x" * 100)  # evicts the least recent: 1 (0 and 2 were just read)
    c.put_mem(("f", 5), b"y" * 100)  # then 3
    assert sorted(k for _, k in c.get_mem_many([("f", i) for i in range(6)])) == [0, 2, 4, 5]
