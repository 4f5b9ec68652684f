"""kill -9 a process that appends batches and seals/offloads segments on local disks;
after restart every acknowledged row reads back by rowid, whatever step was cut."""
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from catalog.local import LocalCatalog
from rowstore.segments.store import SegmentStore
from terrafs.backends.local import LocalBlockDevice, LocalObjectStore
from terrafs.fs import FsConfig, TerrascaleFS
from tests.rowstore.segments.test_segments import KEYS, S1, SCHEMAS

CHILD = textwrap.dedent("""
    import asyncio, sys
    from tests.rowstore.test_kill9 import open_store
    from tests.rowstore.segments.test_segments import KEYS, S1, batch

    async def main(root):
        st, pending = await open_store(root)
        nxt = 0
        while True:
            seg = await st.create("t", 0)
            for _ in range(8):
                ids = await seg.append(batch(nxt, nxt + 50), S1, 1 + nxt)
                print(f"{int(ids[0])} {nxt} 50", flush=True)
                nxt += 50
            await st.seal(seg.segid)
            await st.offload(seg.segid, KEYS)

    asyncio.run(main(sys.argv[1]))
""")


async def open_store(root: str):
    cat = LocalCatalog(os.path.join(root, "catalog"))
    await cat.open()
    fs = TerrascaleFS(cat, LocalBlockDevice(os.path.join(root, "block")),
                      LocalBlockDevice(os.path.join(root, "cache"), durable=False),
                      LocalObjectStore(os.path.join(root, "objects")), config=FsConfig(sealed_block_size=4096))
    await fs.open()
    st = SegmentStore(fs, SCHEMAS.__getitem__)
    return st, await st.open()


@pytest.mark.parametrize("acks", [30, 75, 140])
async def test_kill9_during_appends_and_offloads(tmp_path, acks):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    acked = []
    try:
        for line in proc.stdout:
            acked.append(tuple(map(int, line.split())))
            if len(acked) >= acks:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    st, pending = await open_store(str(tmp_path))
    for segid in pending:  # a seal that was not yet offloaded: finishing it works
        await st.offload(segid, KEYS)
    for first, id0, n in acked:
        rids = np.arange(first, first + n, dtype=np.uint64)
        got = (await st.get(rids, S1)).batch.column("id").to_pylist()
        assert got == list(range(id0, id0 + n)), (first, id0)
    await st.fs.close()
    await st.catalog.close()
