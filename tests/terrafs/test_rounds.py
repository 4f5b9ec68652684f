"""Device rounds (terrafs/rounds.py, RFC 0011 step 3): the groups of every active file on the
log device that a commit hands over in one tick go in one thread hop with one fdatasync; a
group whose write fails fails alone; a failed flush fails every group it covered."""
import asyncio
import errno
import threading

import pytest

from terrafs.active import ActiveConfig, ActiveFile
from terrafs.backends.logdev import LogDevice
from terrafs.blocks import Codec
from terrafs.errors import FileStateError
from terrafs.params import new_params
from terrafs.rounds import DeviceRounds
from tests.terrafs.test_logdev import failing_fdatasync

SMALL = 64 << 10


async def _files(dev, n):
    out = []
    for f in range(n):
        p = new_params(20 + f, 1, codec=Codec.NONE, block_size=16384, page_size=4096)
        out.append(await ActiveFile.create(dev, f"files/{f}.act", p, None, ActiveConfig(flush_ms=1)))
    return out


async def test_one_commits_groups_of_eight_files_take_one_hop_and_one_fdatasync(tmp_path):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    files = await _files(dev, 8)
    hops, works, flushes = dev.device_rounds.hops, dev.device_rounds.works, dev.flushes
    offs = await asyncio.gather(*(af.append(b"row of file %d" % i) for i, af in enumerate(files)))
    assert (dev.device_rounds.hops - hops, dev.device_rounds.works - works, dev.flushes - flushes) == (1, 8, 1)
    again = LogDevice(dev.path)
    for i, (af, off) in enumerate(zip(files, offs)):
        await af.close()
        back = await ActiveFile.recover(again, f"files/{i}.act", None)
        assert await back.read(off, 100) == b"row of file %d" % i
        await back.close()


async def test_work_handed_over_during_a_hop_waits_and_goes_together_in_the_next():
    """A busy device makes fewer, larger rounds: what arrives while a hop runs waits for it."""
    gate, started = threading.Event(), threading.Event()
    rounds = DeviceRounds(lambda: None)

    def first():
        started.set()
        gate.wait(30)
        return "first"

    a = asyncio.ensure_future(rounds.run(first))
    await asyncio.to_thread(started.wait, 30)
    later = [asyncio.ensure_future(rounds.run(lambda i=i: i)) for i in range(3)]
    await asyncio.sleep(0)  # all three handed over while the first hop is in its thread
    assert len(rounds._waiting) == 3
    gate.set()
    assert await a == "first" and await asyncio.gather(*later) == [0, 1, 2]
    assert (rounds.hops, rounds.works) == (2, 4)


async def test_a_write_that_fails_fails_its_file_alone():
    flushed = []
    rounds = DeviceRounds(lambda: flushed.append(True))

    def bad():
        raise OSError(errno.EIO, "Input/output error")

    ok, failed = await asyncio.gather(rounds.run(lambda: "written"), rounds.run(bad), return_exceptions=True)
    assert ok == "written" and isinstance(failed, OSError) and flushed == [True]


async def test_a_failed_flush_fails_every_group_of_its_round(tmp_path, monkeypatch):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    files = await _files(dev, 3)
    kept = [await af.append(b"acknowledged") for af in files]
    failing_fdatasync(monkeypatch)
    got = await asyncio.gather(*(af.append(b"covered by the failed flush") for af in files), return_exceptions=True)
    assert all(isinstance(e, (OSError, FileStateError)) for e in got), got
    for i, af in enumerate(files):
        await af.cut_back()
        await af.close()
        back = await ActiveFile.recover(dev, f"files/{i}.act", None)
        assert back.durable_size == 12 and await back.read(kept[i], 12) == b"acknowledged"
        await back.close()


async def test_every_waiter_hears_a_round_that_could_not_run(monkeypatch):
    import terrafs.rounds as rounds_mod

    async def broken(*_):
        raise RuntimeError("the I/O pool is gone")

    monkeypatch.setattr(rounds_mod, "run_io", broken)
    rounds = DeviceRounds(lambda: None)
    got = await asyncio.gather(rounds.run(lambda: 1), rounds.run(lambda: 2), return_exceptions=True)
    assert [type(e) for e in got] == [RuntimeError, RuntimeError]
    with pytest.raises(RuntimeError):
        await rounds.run(lambda: 3)
