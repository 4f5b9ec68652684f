"""Active files on a local disk keep zeroed space ahead of the next group (docs/format/terrafs.md §2):
small groups are written in place, recovery tells the zeros from a torn or damaged tail."""
import os

import pytest

from terrafs.active import PREALLOC, ActiveConfig, ActiveFile
from terrafs.backends.local import LocalBlockDevice
from terrafs.blocks import Codec
from terrafs.errors import FileCorruptionError
from terrafs.params import new_params

CFG = ActiveConfig(flush_bytes=64 * 1024, flush_ms=1.0)


def params():
    return new_params(1, 42, codec=Codec.NONE, block_size=16384, page_size=4096)


async def _groups(path, sizes):
    """A file with one group per size; returns (raw file bytes, physical start of each group, data)."""
    dev = LocalBlockDevice(str(path))
    af = await ActiveFile.create(dev, "f", params(), None, CFG)
    starts, data = [], []
    for i, n in enumerate(sizes):
        starts.append(af._physical_end)
        data.append(os.urandom(n))
        assert await af.append(data[-1]) == sum(sizes[:i])
    ends = af._physical_end
    await af.close()
    with open(path / "f", "rb") as f:
        raw = f.read()
    return raw, starts + [ends], data


async def _recover(path, raw, **kw):
    with open(path / "f", "wb") as f:
        f.write(raw)
    return await ActiveFile.recover(LocalBlockDevice(str(path)), "f", None, CFG, **kw)


async def test_small_groups_are_written_in_place(tmp_path):
    raw, bounds, data = await _groups(tmp_path, [3000, 5000, 100, 20000])
    assert len(raw) >= bounds[-1] + PREALLOC and len(raw) % PREALLOC == 0  # zeros past the last group
    assert raw[bounds[-1]:] == bytes(len(raw) - bounds[-1])
    af = await _recover(tmp_path, raw)
    assert af.torn_tail is None and af.durable_size == sum(map(len, data))
    assert await af.read(0, af.durable_size) == b"".join(data)
    size = os.path.getsize(tmp_path / "f")
    assert await af.append(b"more") == sum(map(len, data))
    assert os.path.getsize(tmp_path / "f") == size  # written into the zeros, the file did not grow
    with open(tmp_path / "f", "rb") as f:
        assert f.read()[bounds[-1] : bounds[-1] + 4] == b"TBLK"  # right after the last group
    await af.close()
    again = await ActiveFile.recover(LocalBlockDevice(str(tmp_path)), "f", None, CFG)
    assert await again.read(0, again.durable_size) == b"".join(data) + b"more"


@pytest.mark.parametrize("tail", ["zeros", "garbage"])
async def test_torn_last_group_at_every_offset(tmp_path, tail):
    raw, bounds, data = await _groups(tmp_path, [3000, 7000, 9000])
    last, end = bounds[-2], bounds[-1]
    for cut in list(range(last, end, 211)) + [end - 1]:
        rest = len(raw) - cut
        # garbage differs from what was there at the cut (a random byte equal to it, 1 in 256
        # at the last offset, would leave the group whole)
        filler = bytes(rest) if tail == "zeros" else bytes([raw[cut] ^ 0xFF]) + os.urandom(rest - 1)
        af = await _recover(tmp_path, raw[:cut] + filler)
        if tail == "zeros" and raw[cut:end] == bytes(end - cut):  # the rest of its pad block: all there
            assert af.durable_size == 19000 and af.torn_tail is None
            await af.close()
            continue
        assert af.durable_size == 10000, cut
        if tail == "zeros" and cut == last:
            assert af.torn_tail is None  # nothing of the group reached the disk: a clean end
        else:
            assert af.torn_tail == (last, len(raw) - last)
            assert os.path.getsize(tmp_path / "f") == last  # cut, the zeros with it
        assert await af.read(0, 10000) == data[0] + data[1]
        assert await af.append(b"again") == 10000
        await af.close()


async def test_damage_before_the_zeros_is_an_error(tmp_path):
    raw, bounds, _ = await _groups(tmp_path, [3000, 7000, 9000])
    bad = bytearray(raw)
    bad[bounds[0] + 100] ^= 0x08  # inside the first group
    with pytest.raises(FileCorruptionError) as ei:
        await _recover(tmp_path, bytes(bad))
    assert ei.value.offset == bounds[0] and os.path.getsize(tmp_path / "f") == len(raw)  # nothing cut
    zeroed = raw[: bounds[1]] + bytes(bounds[2] - bounds[1]) + raw[bounds[2] :]  # a whole group zeroed
    with pytest.raises(FileCorruptionError, match="follows"):
        await _recover(tmp_path, zeroed)


async def test_read_only_recovery_reports_no_tail_for_zeros(tmp_path):
    raw, bounds, data = await _groups(tmp_path, [500, 600])
    af = await _recover(tmp_path, raw, read_only=True)
    assert af.torn_tail is None and af.durable_size == 1100
    await af.close()
    with open(tmp_path / "f", "rb") as f:
        assert f.read() == raw  # untouched


async def test_large_groups_follow_the_last_group_not_the_zeros(tmp_path):
    dev = LocalBlockDevice(str(tmp_path))
    af = await ActiveFile.create(dev, "f", params(), None, CFG)
    small = os.urandom(1000)
    await af.append(small)
    zeroed_to = os.path.getsize(tmp_path / "f")
    big = os.urandom(zeroed_to)  # more than the zeros left
    phys = af._physical_end
    await af.append(big)
    assert os.path.getsize(tmp_path / "f") == af._physical_end > zeroed_to  # grew by the group only
    await af.close()
    with open(tmp_path / "f", "rb") as f:
        assert f.read()[phys : phys + 4] == b"TBLK"
    again = await ActiveFile.recover(dev, "f", None, CFG)
    assert again.torn_tail is None and await again.read(0, again.durable_size) == small + big
