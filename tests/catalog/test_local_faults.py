"""trkv:// recovery: torn tails cut, earlier damage refused, kill -9 loses nothing acknowledged."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from catalog.abc import Put
from catalog.errors import CatalogCorruptionError, CatalogUnavailableError
from catalog.local import LocalCatalog


async def _fill(path, n=10, **kw):
    c = LocalCatalog(path, **kw)
    await c.open()
    for i in range(n):
        await c.txn(ops=[Put(f"k{i}", b"value-%d" % i)])
    await c.close()
    logs = sorted(f for f in os.listdir(path) if f.startswith("log-"))
    return os.path.join(path, logs[-1])


def _record_starts(raw: bytes) -> list[int]:
    starts, i = [], raw.find(b"TKVR")
    while i >= 0:
        starts.append(i)
        i = raw.find(b"TKVR", i + 1)
    return starts


async def test_torn_tail_at_every_offset(tmp_path):
    logf = await _fill(str(tmp_path / "c"))
    raw = open(logf, "rb").read()
    last = _record_starts(raw)[-1]
    for cut in range(last, len(raw)):
        with open(logf, "wb") as f:
            f.write(raw[:cut])
        c = LocalCatalog(str(tmp_path / "c"))
        await c.open()
        assert await c.revision() == 9, cut
        assert (c.torn_tail is not None) == (cut > last)
        r = await c.txn(ops=[Put("new", b"x")])
        assert r.revision == 10
        await c.close()
        assert os.path.getsize(logf) > last


async def test_flipped_byte_in_last_record_is_cut(tmp_path):
    logf = await _fill(str(tmp_path / "c"))
    raw = bytearray(open(logf, "rb").read())
    raw[-3] ^= 0xFF
    open(logf, "wb").write(raw)
    c = LocalCatalog(str(tmp_path / "c"))
    await c.open()
    assert await c.revision() == 9
    await c.close()


async def test_flipped_byte_earlier_is_corruption_and_nothing_cut(tmp_path):
    logf = await _fill(str(tmp_path / "c"))
    raw = bytearray(open(logf, "rb").read())
    at = _record_starts(bytes(raw))[4] + 20
    raw[at] ^= 0x01
    open(logf, "wb").write(raw)
    with pytest.raises(CatalogCorruptionError) as ei:
        await LocalCatalog(str(tmp_path / "c")).open()
    assert ei.value.where == logf and ei.value.offset == at - 20
    assert os.path.getsize(logf) == len(raw)


async def test_corrupt_snapshot_is_an_error(tmp_path):
    await _fill(str(tmp_path / "c"), n=30, snapshot_bytes=300)
    snap = [f for f in os.listdir(tmp_path / "c") if f.startswith("snap-")][0]
    p = tmp_path / "c" / snap
    raw = bytearray(p.read_bytes())
    raw[30] ^= 1
    p.write_bytes(raw)
    with pytest.raises(CatalogCorruptionError, match="snapshot"):
        await LocalCatalog(str(tmp_path / "c")).open()


async def test_crash_during_snapshot_recovers(tmp_path):
    path = str(tmp_path / "c")
    await _fill(path, n=20)
    c = LocalCatalog(path)
    await c.open()
    # A snapshot written but the old log not yet replaced, plus a stray temp file.
    raw = c.state.snapshot()
    await c.close()
    open(os.path.join(path, "snap-%016x.trkv" % 20), "wb").write(raw)
    open(os.path.join(path, "snap-%016x.trkv.tmp" % 25), "wb").write(b"half")
    c = LocalCatalog(path)
    await c.open()
    assert await c.revision() == 20 and (await c.get("k19")).value == b"value-19"
    assert not any(f.endswith(".tmp") for f in os.listdir(path))
    assert (await c.txn(ops=[Put("k", b"")])).revision == 21
    await c.close()


async def test_second_process_is_refused(tmp_path):
    c = LocalCatalog(str(tmp_path / "c"))
    await c.open()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import asyncio
        from catalog.local import LocalCatalog
        asyncio.run(LocalCatalog({str(tmp_path / 'c')!r}).open())
    """)], capture_output=True, text=True)
    assert proc.returncode != 0 and "LOCK is held" in proc.stderr
    await c.close()


async def test_group_commit_shares_fsyncs(tmp_path):
    c = LocalCatalog(str(tmp_path / "c"))
    await c.open()
    syncs = 0
    real = c._append_sync

    def counting(data):
        nonlocal syncs
        syncs += 1
        real(data)

    c._append_sync = counting
    await asyncio.gather(*(c.txn(ops=[Put(f"k{i}", b"")]) for i in range(100)))
    assert await c.revision() == 100 and syncs < 100
    await c.close()


CHILD = textwrap.dedent("""
    import asyncio, sys
    from catalog.abc import Put
    from catalog.local import LocalCatalog

    async def worker(c, w):
        i = 0
        while True:
            r = await c.txn(ops=[Put(f"w{w}/{i:06d}", b"x" * (i % 300))], request_id=f"w{w}-{i}")
            print(f"{w} {i} {r.revision}", flush=True)
            i += 1

    async def main():
        c = LocalCatalog(sys.argv[1], snapshot_bytes=20000)
        await c.open()
        await asyncio.gather(*(worker(c, w) for w in range(8)))

    asyncio.run(main())
""")


@pytest.mark.parametrize("n", [200, 900])
async def test_kill9_loses_no_acknowledged_txn(tmp_path, n):
    path = str(tmp_path / "c")
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path], stdout=subprocess.PIPE, text=True)
    acked = []
    try:
        for line in proc.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) >= n:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    c = LocalCatalog(path)
    await c.open()
    for w, i, rev in acked:
        e = await c.get(f"w{w}/{i:06d}")
        assert e is not None and e.version == rev, (w, i, rev)
    assert await c.revision() >= max(r for _, _, r in acked)
    await c.close()


async def test_closed_catalog_refuses(tmp_path):
    c = LocalCatalog(str(tmp_path / "c"))
    await c.open()
    await c.close()
    with pytest.raises(CatalogUnavailableError):
        await c.get("a")
