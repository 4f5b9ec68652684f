"""The log device (docs/format/logdev.md): the BlockDevice conformance suite, reopening from
what the disk holds (hypothesis over create/append/truncate/rename/delete), one fdatasync for
many files' writes, the recovery rules (a missing index, a rename cut by a crash, a flipped
byte), active files on it, and kill -9 of a process writing 8 active files on it."""
import asyncio
import hashlib
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from terrafs.active import ActiveFile
from terrafs.backends.logdev import LogDevice
from terrafs.backends.logdev_format import PAGE
from terrafs.blocks import Codec
from terrafs.errors import FileCorruptionError, FileNotFoundInDeviceError
from terrafs.params import new_params
from tests.terrafs.conformance import BlockDeviceSuite

SMALL = 64 << 10  # extents of 60 KiB payload: files span several


class TestLogDevice(BlockDeviceSuite):
    @pytest.fixture
    def make(self, tmp_path):
        return LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)


class TestLogDeviceZeroEnded(BlockDeviceSuite):
    """The mode a node's active files use: the same behaviour while open."""

    @pytest.fixture
    def make(self, tmp_path):
        return LogDevice(str(tmp_path / "logdev"), extent_size=SMALL, exact_sizes=False)


def reopen(dev: LogDevice) -> LogDevice:
    return LogDevice(dev.path)


async def contents(dev: LogDevice) -> dict[str, bytes]:
    out = {}
    for name in await dev.list():
        f = await dev.open(name)
        out[name] = await f.pread(0, f.size())
    return out


async def test_files_across_extents_come_back_after_a_reopen(tmp_path):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    data = {f"files/{i}.act": os.urandom(i * 50_000 + 7) for i in range(4)}
    for name, b in data.items():
        f = await dev.create(name)
        await f.append(b[:1000])
        await f.append(b[1000:])
    await (await dev.open("files/0.act")).sync()
    again = reopen(dev)
    assert await contents(again) == data
    assert (await again.open("files/3.act")).size() == len(data["files/3.act"])


ops = st.lists(st.tuples(st.sampled_from(["create", "append", "truncate", "rename", "delete"]),
                         st.integers(0, 3), st.integers(0, 150_000)), max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, exact=st.booleans())
def test_a_reopened_device_holds_exactly_what_was_synced(tmp_path_factory, ops, exact):
    """A model (name -> bytes) against the device; after the last op a sync and a reopen:
    the reopened device lists the same files with the same bytes (zero-ended: then zeros up
    to whole extents), and free extents are zero."""
    path = str(tmp_path_factory.mktemp("ld") / "logdev")

    async def run():
        dev, model, handles = LogDevice(path, extent_size=SMALL, exact_sizes=exact), {}, {}
        for op, i, n in ops:
            name = f"f{i}"
            if op == "create" and name not in model:
                handles[name], model[name] = await dev.create(name), b""
            elif op == "append" and name in model:
                b = hashlib.sha256(f"{n}".encode()).digest() * (n // 32 + 1)
                b = b[: n % 70_000]
                await handles[name].append(b)
                model[name] += b
            elif op == "truncate" and name in model:
                size = n % (len(model[name]) + 1)
                await handles[name].truncate(size)
                model[name] = model[name][:size]
            elif op == "rename" and name in model:
                dst = f"f{(i + 1) % 4}"
                await dev.rename(name, dst)
                model[dst] = model.pop(name)
                handles[dst] = await dev.open(dst)
                handles.pop(name, None)
            elif op == "delete" and name in model:
                await dev.delete(name)
                del model[name], handles[name]
        if handles:
            await next(iter(handles.values())).sync()
        again = reopen(dev)
        got = await contents(again)
        if not exact:  # whole extents: the model's bytes, then zeros
            payload = SMALL - PAGE
            got = {n: b[: len(model.get(n, b""))] if not any(b[len(model.get(n, b"")):]) else b
                   for n, b in got.items()}
            assert all(len(b) % payload == 0 for b in (await contents(again)).values())
        assert got == model
        for e in again._free:
            with open(path, "rb") as f:
                f.seek(PAGE + e * SMALL)
                assert not any(f.read(SMALL)), f"free extent {e} is not zero"
    asyncio.run(run())


async def test_one_fdatasync_makes_many_files_durable(tmp_path):
    """8 files each written (no sync), then 8 threads each wanting its file durable: one
    fdatasync of the device serves them all (a group commit at the device)."""
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    files = [await dev.create(f"f{i}") for i in range(8)]
    before = dev.flushes
    for i, f in enumerate(files):
        f.writev_sync([b"x" * (100 + i)], 0)
    threads = [threading.Thread(target=f.fdatasync_sync) for f in files]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert dev.flushes - before == 1
    assert {n: len(b) for n, b in (await contents(reopen(dev))).items()} == {f"f{i}": 100 + i for i in range(8)}


@pytest.mark.parametrize("exact", [True, False])
async def test_a_group_rewrites_its_extent_header_only_with_exact_sizes(tmp_path, monkeypatch, exact):
    """100 small appends inside one extent: with exact sizes each rewrites the header's
    ``used`` (a second page per flush); zero-ended, the header is written once, when taken."""
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL, exact_sizes=exact)
    f = await dev.create("a")
    writes = []
    real = dev._write_header
    monkeypatch.setattr(dev, "_write_header", lambda chain, k: (writes.append(k), real(chain, k)))
    for i in range(100):
        f.writev_sync([b"%05d" % i], i * 5)
    assert len(writes) == (100 if exact else 0)


async def test_a_missing_extent_header_cuts_the_chain_there(tmp_path):
    """Extent 1's header never reached the disk (zero) while extent 2's did: nothing in
    extent 1 or later was acknowledged (L3): the file ends with extent 0, the rest is freed."""
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    f = await dev.create("a")
    body = os.urandom(3 * (SMALL - PAGE) - 10)
    await f.append(body)
    await f.sync()
    ext1 = dev._chains["a"].extents[1]
    with open(dev.path, "r+b") as raw:
        raw.seek(PAGE + ext1 * SMALL)
        raw.write(bytes(512))
    again = reopen(dev)
    g = await again.open("a")
    assert g.size() == SMALL - PAGE and await g.pread(0, g.size()) == body[: SMALL - PAGE]
    assert len(again._free) == len(dev._free) + 2


async def test_a_rename_cut_by_a_crash_keeps_the_newer_name(tmp_path):
    """Two index-0 headers name one file (a rename over an existing file, the old one not yet
    freed when the process died): the greater seq wins, the other chain is freed."""
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    old = await dev.create("b")
    await old.append(b"old")
    new = await dev.create("a")
    await new.append(b"new")
    chain = dev._chains["a"]
    with chain.lock:
        chain.name = "b"
        dev._write_header(chain, 0)  # the rename's header, and then the process dies
    dev._note_written()
    dev.flush_sync()
    again = reopen(dev)
    assert await contents(again) == {"b": b"new"}


@pytest.mark.parametrize("where", ["superblock", "extent header"])
async def test_a_flipped_byte_in_a_header_is_corruption_naming_the_offset(tmp_path, where):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    f = await dev.create("a")
    await f.append(b"x" * 1000)
    await f.sync()
    at = 12 if where == "superblock" else PAGE + dev._chains["a"].extents[0] * SMALL + 20
    with open(dev.path, "r+b") as raw:
        raw.seek(at)
        b = raw.read(1)
        raw.seek(at)
        raw.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(FileCorruptionError) as e:
        await reopen(dev).list()
    assert e.value.offset == (0 if where == "superblock" else at - 20)


async def test_delete_frees_and_zeroes_and_the_name_is_gone(tmp_path):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    f = await dev.create("a")
    await f.append(os.urandom(2 * SMALL))
    await dev.delete("a")
    with pytest.raises(FileNotFoundInDeviceError):
        await dev.open("a")
    g = await dev.create("b")  # takes a freed extent: it reads as zero past what b wrote
    await g.append(b"y")
    assert await g.pread(0, 10) == b"y"
    raw = open(dev.path, "rb").read()
    e = dev._chains["b"].extents[0]
    assert not any(raw[PAGE + e * SMALL + PAGE + 1: PAGE + (e + 1) * SMALL])


async def test_an_active_file_on_the_log_device_recovers_and_cuts_a_torn_group(tmp_path):
    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    p = new_params(7, 1, codec=Codec.NONE, block_size=16384, page_size=4096)
    af = await ActiveFile.create(dev, "files/7.act", p, None)
    offs = [await af.append(os.urandom(900) + bytes([i])) for i in range(200)]  # across extents
    end = af._physical_end
    await af.close()
    f = await dev.open("files/7.act")
    await f.append(b"TBLK" + os.urandom(100))  # a torn next group, never acknowledged
    await f.sync()
    again = await ActiveFile.recover(reopen(dev), "files/7.act", None)
    assert again.torn_tail is not None and again._physical_end == end
    for i, off in enumerate(offs):
        assert (await again.read(off, 901))[-1] == i
    await again.close()


async def test_a_failed_flush_fails_the_writes_it_covered_and_only_those(tmp_path, monkeypatch):
    """fdatasync answers EIO once (fsyncgate: the kernel may have dropped those pages, and the
    next one succeeds): every write it may have covered is refused as durable, writes made
    after it flush normally, and an active file caught by it is cut back to its last durable
    group and takes appends again."""

    from terrafs.errors import DeviceError

    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    a, b = await dev.create("a"), await dev.create("b")
    p = new_params(9, 1, codec=Codec.NONE, block_size=16384, page_size=4096)
    af = await ActiveFile.create(dev, "files/9.act", p, None)
    kept = await af.append(b"acknowledged")
    fail = failing_fdatasync(monkeypatch)
    a.writev_sync([b"before the failure"], 0)
    with pytest.raises(OSError):
        b.writev_sync([b"also before"], 0)
        b.fdatasync_sync()  # this flush fails ...
    with pytest.raises(DeviceError):
        a.fdatasync_sync()  # ... and it covered a's write: never reported durable
    a.writev_sync([b"after"], 100)
    a.fdatasync_sync()  # a write after the failure: a flush that works makes it durable
    fail.append(True)
    with pytest.raises(DeviceError):
        await af.append(b"its flush fails")
    with pytest.raises(DeviceError):
        await af.append(b"the file takes nothing more")
    af = await dev_reopen_failed(dev, af)
    assert await af.read(kept, 12) == b"acknowledged" and af.durable_size == 12
    more = await af.append(b"again")
    assert await af.read(more, 5) == b"again"
    await af.close()


def failing_fdatasync(monkeypatch) -> list:
    """The log device's next fdatasync fails with EIO (fsyncgate: the next one succeeds);
    append True to the list returned to fail one more."""
    import errno

    import terrafs.backends.logdev_core as ld

    real, fail = os.fdatasync, [True]

    def failing(fd):
        if fail and fail.pop():
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(ld.os, "fdatasync", failing)
    return fail


async def dev_reopen_failed(dev, af):
    """What TerrascaleFS.reopen_failed does: cut back to the last durable group, recover."""
    await af.cut_back()
    await af.close()
    return await ActiveFile.recover(dev, "files/9.act", None)


CHILD = textwrap.dedent("""
    import asyncio, hashlib, sys
    from terrafs.active import ActiveConfig, ActiveFile
    from terrafs.backends.logdev import LogDevice
    from terrafs.blocks import Codec
    from terrafs.params import new_params

    def payload(f, i):
        return hashlib.sha256(f"{f}.{i}".encode()).digest() * (1 + i % 40)

    async def writer(af, f, w, out):
        i = w
        while True:
            off = await af.append(payload(f, i))
            out.write(f"{f} {i} {off}\\n"); out.flush()
            i += 4

    async def main(path):
        dev = LogDevice(path, extent_size=256 << 10)
        files = []
        for f in range(8):
            p = new_params(10 + f, 1, codec=Codec.NONE, block_size=16384, page_size=4096)
            files.append(await ActiveFile.create(dev, f"files/{f}.act", p, None,
                                                 ActiveConfig(flush_bytes=32768, flush_ms=1)))
        await asyncio.gather(*(writer(af, f, w, sys.stdout) for f, af in enumerate(files) for w in range(4)))

    asyncio.run(main(sys.argv[1]))
""")


def payload(f, i):
    return hashlib.sha256(f"{f}.{i}".encode()).digest() * (1 + i % 40)


@pytest.mark.parametrize("round_", range(3))
async def test_kill9_of_8_active_files_on_one_device_loses_nothing_acknowledged(tmp_path, round_):
    path = str(tmp_path / "logdev")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    acked = []
    try:
        for line in proc.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) >= 1500 + 1000 * round_:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert len(acked) >= 1500, "the writer process stopped early"
    dev = LogDevice(path)
    files = {f: await ActiveFile.recover(dev, f"files/{f}.act", None) for f in range(8)}
    for f, i, off in acked:
        assert await files[f].read(off, len(payload(f, i))) == payload(f, i), (f, i, off)
    for af in files.values():
        await af.close()


def test_header_layout_is_the_documented_one():
    from terrafs.backends.logdev_format import HEAD as _HEAD, SUPER as _SUPER
    assert (_SUPER.size, _HEAD.size) == (32, 40)
    assert struct.calcsize("<8sHHIQQII") == 40


async def test_a_burst_gives_its_space_back_once_deleted(tmp_path):
    """A burst of writes grows the device; once its files are deleted (offloaded), every free
    extent beyond the spare ones goes back to the host — a free tail cut off the file, free
    extents below a live file punched out — the files left read what they hold, before and
    after a reopen, and extents given back are taken again as zeros."""
    from terrafs.backends.logdev_core import SPARE

    dev = LogDevice(str(tmp_path / "logdev"), extent_size=SMALL)
    keep = await dev.create("keep")
    await keep.append(b"k" * 100)
    burst = []
    for i in range(6):
        f = await dev.create(f"burst{i}")
        await f.append(os.urandom(10 * SMALL))  # 11 extents each
        burst.append(f)
    late = await dev.create("late")  # a live file above the burst: the burst's extents are no tail
    await late.append(b"l" * 100)
    await keep.sync()
    await late.sync()
    allocated, used = dev.space()
    assert used == 2 * SMALL + 6 * 11 * SMALL and allocated >= used
    size_before = os.path.getsize(dev.path)
    for i in range(6):
        await dev.delete(f"burst{i}")
    allocated_after, used_after = dev.space()
    assert used_after == 2 * SMALL
    # what is left on the host: the two files' extents and the spare ones (plus the superblock)
    assert allocated_after <= PAGE + (2 + SPARE) * SMALL + 4096, (allocated_after, allocated)
    assert os.path.getsize(dev.path) <= size_before  # the free tail past "late" was cut
    assert len(dev._holes) > 0  # free extents below "late" were punched out
    assert await (await dev.open("keep")).pread(0, 100) == b"k" * 100
    assert await (await dev.open("late")).pread(0, 100) == b"l" * 100
    again = reopen(dev)
    assert await contents(again) == {"keep": b"k" * 100, "late": b"l" * 100}
    g = await again.create("next")  # takes free extents, punched ones last, written as zeros again
    await g.append(os.urandom(20 * SMALL))
    await g.sync()
    assert await contents(reopen(again)) == {"keep": b"k" * 100, "late": b"l" * 100,
                                             "next": await g.pread(0, g.size())}
