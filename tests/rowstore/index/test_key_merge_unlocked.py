"""A level merge reads and writes without the partition's publish lock: checkpoints publish
while it runs, and a merge of a partition another node took meanwhile publishes nothing."""
import asyncio
import random

from rowstore.index.key_index import PartitionIndex
from terrafs.records import FileState
from tests.rowstore.index.test_key_index import Model, check, fill, world

KEY = "idx/t/0/manifest"


async def _held_merge(monkeypatch, seed: int):
    """An index with five L0 runs and its L0 merge running, held just before it writes its run."""
    fs, rng, model = await world(), random.Random(seed), Model()
    idx = PartitionIndex(fs, KEY, "int64")
    await idx.open()
    ts = 1000
    for i in range(5):
        ts = await fill(idx, model, rng, 4, ts)
        await idx.checkpoint((1, i))
    gate, inside = asyncio.Event(), asyncio.Event()
    build = idx._build

    async def held(run, level):
        if level == 1:  # the merge's run (a checkpoint's is level 0)
            inside.set()
            await gate.wait()
        return await build(run, level)

    monkeypatch.setattr(idx, "_build", held)
    merging = asyncio.ensure_future(idx.maybe_merge(horizon=0))
    await asyncio.wait_for(inside.wait(), 10)
    return fs, rng, model, idx, ts, gate, merging


async def test_a_checkpoint_publishes_while_a_merge_of_its_partition_runs(monkeypatch):
    fs, rng, model, idx, ts, gate, merging = await _held_merge(monkeypatch, 5)
    ts = await fill(idx, model, rng, 4, ts)
    assert not idx.publish_lock.locked()
    assert await asyncio.wait_for(idx.checkpoint((1, 5)), 10)  # not queued behind the merge
    gate.set()
    assert await merging
    assert [lv for lv, _ in idx.runs] == [0, 1]  # the run checkpointed meanwhile stays above the merged one
    await check(idx, model, [1005, 1030, ts])
    again = PartitionIndex(fs, KEY, "int64")
    m = await again.open()
    assert [r["level"] for r in m.runs] == [0, 1] and m.mark == [1, 5] and m.garbage == []
    await check(again, model, [1020, ts])
    assert sorted(r.inode for r in await fs.list()) == sorted(r["inode"] for r in m.runs)


async def test_a_merge_of_a_partition_taken_meanwhile_publishes_nothing_and_leaves_nothing(monkeypatch):
    fs, _, model, idx, ts, gate, merging = await _held_merge(monkeypatch, 6)
    before = list(idx.manifest.runs)
    async with idx.publish_lock:
        idx.moved = True  # as a hand-over sets it: another node serves the partition now
    gate.set()
    assert await merging  # the merge ran, and dropped what it wrote
    assert idx.manifest.runs == before and [lv for lv, _ in idx.runs] == [0] * 5
    files = await fs.list()
    assert all(r.state == FileState.SEALED for r in files)  # its run's file is not left building
    assert sorted(r.inode for r in files) == sorted(m["inode"] for m in before)
    again = PartitionIndex(fs, KEY, "int64")
    assert (await again.open()).runs == before
    await check(again, model, [1010, ts])
