"""Ids and random draws come from the ``Entropy`` a node is given: seeded, a run's ids replay
draw for draw with nothing patched (the simulation); the system's, they differ every time."""
import uuid

from catalog.abc import Check, Put
from catalog.memory import MemoryCatalog
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.catalog_ops import commit
from terrafs.entropy import SYSTEM, Entropy
from terrafs.fs import FsConfig, TerrascaleFS
from terrafs.records import FileTier


def test_a_seeded_entropy_replays_its_draws_and_the_system_one_does_not():
    a, b = Entropy("7/n1"), Entropy("7/n1")
    draws = [(a.bits(62), a.token(8), a.uuid_hex(), a.jitter().random()) for _ in range(5)]
    assert draws == [(b.bits(62), b.token(8), b.uuid_hex(), b.jitter().random()) for _ in range(5)]
    assert draws != [(e.bits(62), e.token(8), e.uuid_hex(), e.jitter().random())
                     for e in [Entropy("7/n2")] for _ in range(5)]
    assert SYSTEM.uuid_hex() != SYSTEM.uuid_hex() and SYSTEM.bits(64) != SYSTEM.bits(64)
    for e in (a, SYSTEM):  # the shapes the callers store: 62 bits, 2n hex digits, a v4 UUID
        assert 0 <= e.bits(62) < 1 << 62 and len(e.token(8)) == 16
        u = uuid.UUID(hex=e.uuid_hex())
        assert u.version == 4 and u.hex == str(u).replace("-", "")


async def test_a_run_given_the_same_seed_names_its_files_and_requests_the_same():
    async def run(seed: str) -> tuple[list, list]:
        ids = Entropy(seed + "/catalog")
        catalog = MemoryCatalog(request_ids=ids.uuid_hex)
        seen: list[str] = []
        txn = catalog.txn

        async def recording(checks=(), ops=(), *, request_id=None):
            seen.append(request_id)
            return await txn(checks, ops, request_id=request_id)
        catalog.txn = recording  # type: ignore[method-assign]
        fs = TerrascaleFS(catalog, MemoryBlockDevice(), MemoryBlockDevice(durable=False), MemoryObjectStore(),
                          config=FsConfig(node_id="n1"), entropy=Entropy(seed))
        await fs.open()
        files = []
        for _ in range(3):
            rec = await fs.stat((await fs.create()).inode)
            files.append((rec.inode, rec.gen, rec.location, rec.tier == FileTier.BLOCK))
        await commit(catalog, [Check("k", 0)], [Put("k", b"v")])
        return files, seen
    one, two = await run("3"), await run("3")
    assert one == two and len(one[1]) >= 4 and all(one[1])
    assert await run("4") != one
