"""kill -9 while 16 writers append to an active file on a local disk: every
acknowledged append is there after recovery, byte for byte."""
import hashlib
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from terrafs.active import ActiveFile
from terrafs.backends.local import LocalBlockDevice

CHILD = textwrap.dedent("""
    import asyncio, hashlib, sys
    from terrafs.active import ActiveConfig, ActiveFile
    from terrafs.backends.local import LocalBlockDevice
    from terrafs.blocks import Codec
    from terrafs.params import new_params

    def payload(i):
        return hashlib.sha256(str(i).encode()).digest() * (1 + i % 50)

    async def writer(af, w, out):
        i = w
        while True:
            off = await af.append(payload(i))
            out.write(f"{i} {off}\\n"); out.flush()
            i += 16

    async def main(root):
        dev = LocalBlockDevice(root)
        p = new_params(3, 1, codec=Codec.NONE, block_size=16384, page_size=4096)
        af = await ActiveFile.create(dev, "f.act", p, None, ActiveConfig(flush_bytes=32768, flush_ms=1))
        await asyncio.gather(*(writer(af, w, sys.stdout) for w in range(16)))

    asyncio.run(main(sys.argv[1]))
""")


def payload(i):
    return hashlib.sha256(str(i).encode()).digest() * (1 + i % 50)


@pytest.mark.parametrize("round_", range(3))
async def test_kill9_loses_nothing_acknowledged(tmp_path, round_):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=os.getcwd())
    acked = []
    try:
        for line in proc.stdout:
            i, off = map(int, line.split())
            acked.append((i, off))
            if len(acked) >= 400 + 300 * round_:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert len(acked) >= 400
    af = await ActiveFile.recover(LocalBlockDevice(str(tmp_path)), "f.act", None)
    for i, off in acked:
        assert await af.read(off, len(payload(i))) == payload(i), (i, off)
    await af.close()
