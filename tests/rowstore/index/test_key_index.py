"""Partition index: levels, checkpoints, merges with purge, reopen — against a model of versions."""
import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.abc import Put
from catalog.memory import MemoryCatalog
from rowstore.index.key_memtable import Run
from rowstore.rowids import TOMBSTONE
from rowstore.tables.keys import KeyRange, decode_keys, encode_keys
from rowstore.index.key_index import PartitionIndex
from rowstore.index.key_purge import dropped_rowids, purge, purged
from terrafs.backends.memory import MemoryBlockDevice, MemoryObjectStore
from terrafs.failpoints import FailPointCrash, armed
from terrafs.fs import FsConfig, TerrascaleFS


def enc(keys):
    return encode_keys(pa.array(keys, pa.int64()), "int64")


class Model:
    def __init__(self):
        self.v = {}

    def add(self, keys, ts, rowids):
        for k, r in zip(keys, rowids):
            self.v.setdefault(k, []).append((ts, int(r)))

    def at(self, k, t):
        vs = [x for x in self.v.get(k, []) if x[0] <= t]
        if not vs:
            return 0
        r = max(vs)[1]
        return 0 if r == int(TOMBSTONE) else r


async def world():
    cat = MemoryCatalog()
    fs = TerrascaleFS(cat, MemoryBlockDevice(), MemoryBlockDevice(durable=False), MemoryObjectStore(),
                      config=FsConfig(sealed_block_size=4096))
    await fs.open()
    return fs


async def fill(idx, model, rng, batches, ts0):
    ts = ts0
    for _ in range(batches):
        ts += rng.randint(1, 5)
        keys = rng.sample(range(-200, 200), rng.randint(1, 60))
        rowids = np.array([int(TOMBSTONE) if rng.random() < 0.15 else rng.randrange(1 << 32, 1 << 40)
                           for _ in keys], np.uint64)
        idx.insert(enc(keys), ts, rowids)
        model.add(keys, ts, rowids)
    return ts


async def check(idx, model, times, keys=range(-205, 205, 7)):
    for t in times:
        for k in keys:
            assert await idx.get(int(enc([k])[0]), t) == model.at(k, t), (k, t)
        run = await idx.scan(t)
        want = sorted((k, model.at(k, t)) for k in model.v if model.at(k, t))
        assert list(zip(decode_keys(run.keys, "int64"), run.rowids.tolist())) == want
        assert (await idx.visible_rowids(t)).tolist() == sorted(r for _, r in want)


async def test_levels_checkpoints_merges_and_reopen():
    fs, rng, model = await world(), random.Random(4), Model()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    ts = 1000
    for round_ in range(7):
        ts = await fill(idx, model, rng, 5, ts)
        await idx.checkpoint((1, round_))
        if round_ == 2:
            await check(idx, model, [1000, 1010, ts])
        await idx.maybe_merge(horizon=0)
    levels = [lv for lv, _ in idx.runs]
    assert max(levels) >= 1 and levels.count(0) <= 4 and levels == sorted(levels)
    ts = await fill(idx, model, rng, 3, ts)  # still in the memtable
    await check(idx, model, [1005, 1020, ts - 2, ts])
    # reopen: runs come back from the manifest; the memtable is replayed by the caller
    again = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    m = await again.open()
    assert m.mark == [1, 6] and len(again.runs) == len(idx.runs)
    again.mem = idx.mem
    await check(again, model, [1015, ts])
    assert m.garbage == [] and len(await fs.list()) == len(idx.runs)  # replaced runs deleted


async def test_merges_rewrite_a_history_a_bounded_number_of_times():
    """Checkpoints of fresh keys, each followed by the merge it calls for: the entries merges
    write stay a small multiple of the history (L2 is rewritten once L1 holds a tenth of it).
    The bound once followed L0's run size; L0 just merged away, every L1 went into L2 and each
    merge rewrote the whole history: 41 times it at 40,000 entries, against 11 now."""
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    written, publish = [], idx._publish

    async def counted(run, level, *a, **kw):
        if level > 0:
            written.append(len(run))
        return await publish(run, level, *a, **kw)
    idx._publish = counted
    n, per = 0, 100
    for i in range(400):
        keys = np.arange(n, n + per)
        idx.insert(enc(keys.tolist()), 1000 + i, (keys + (1 << 32)).astype(np.uint64))
        n += per
        await idx.checkpoint((1, i))
        while await idx.maybe_merge(horizon=0):
            pass
    assert sum(written) <= 16 * n, (sum(written), n)
    assert len(await idx.scan(2000)) == n


async def test_a_lone_run_the_purge_leaves_whole_moves_down_unwritten():
    """The first L1 run into an empty L2 keeps its file and column runs (a trivial move: its
    manifest entry alone changes level); one the purge would cut is rewritten."""
    fs, rng, model = await world(), random.Random(3), Model()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    ts = 1000
    for i in range(5):
        ts = await fill(idx, model, rng, 4, ts)
        await idx.checkpoint((1, i))
    await idx.merge(0, horizon=0)  # five L0 runs into one L1 run
    [(level, run)] = idx.runs
    inode, files = idx.manifest.runs[0]["inode"], len(await fs.list())
    assert level == 1 and await idx.maybe_merge(horizon=0)
    assert [lv for lv, _ in idx.runs] == [2] and idx.runs[0][1] is run
    assert idx.manifest.runs[0]["inode"] == inode and len(await fs.list()) == files
    await check(idx, model, [1005, ts])
    again = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    assert [m["level"] for m in (await again.open()).runs] == [2]
    ts = await fill(idx, model, rng, 4, ts)  # keys written again within the run
    await idx.checkpoint((1, 9))
    l0 = idx.manifest.runs[0]["inode"]
    await idx.merge(0, horizon=ts)  # its purge at a horizon past every version cuts the lone L0 run
    assert [lv for lv, _ in idx.runs] == [1, 2] and idx.manifest.runs[0]["inode"] != l0
    await check(idx, model, [ts])


async def test_merge_purge_keeps_reads_after_the_horizon():
    fs, rng, model = await world(), random.Random(9), Model()
    idx = PartitionIndex(fs, "idx/t/1/manifest", "int64")
    await idx.open()
    ts, marks = 5000, []
    for i in range(6):
        ts = await fill(idx, model, rng, 4, ts)
        marks.append(ts)
        await idx.checkpoint((1, i))
    horizon = marks[2]
    before = sum(r.entries for _, r in idx.runs)
    await idx.merge(0, horizon)
    after = sum(r.entries for _, r in idx.runs)
    assert after < before  # superseded versions (and bottom-level tombstones) are gone
    await check(idx, model, [horizon, marks[3], ts])


def test_purge_rule():
    keys = np.array([1, 1, 1, 2, 2, 3], np.uint64)
    ts = np.array([30, 20, 10, 25, 15, 5], np.uint64)
    rowids = np.array([7, int(TOMBSTONE), 5, int(TOMBSTONE), 4, 3], np.uint64)
    run = Run(keys, ts, rowids)
    kept = purge(run, horizon=22, bottom=False)
    assert list(zip(kept.keys.tolist(), kept.ts.tolist())) == [(1, 30), (1, 20), (2, 25), (2, 15), (3, 5)]
    kept = purge(run, horizon=22, bottom=True)  # key 1's newest at the horizon is a tombstone
    assert list(zip(kept.keys.tolist(), kept.ts.tolist())) == [(1, 30), (2, 25), (2, 15), (3, 5)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 40), st.booleans()), max_size=60),
       st.integers(0, 45), st.booleans())
def test_purged_names_what_the_purge_dropped(entries, horizon, bottom):
    """The rowids ``purged`` reports dropped are exactly those the sources named and the kept
    run does not (what a merge once found by a set difference of the whole level)."""
    entries = sorted({(k, t): tomb for k, t, tomb in entries}.items(), key=lambda e: (e[0][0], -e[0][1]))
    rowids = np.array([int(TOMBSTONE) if tomb else 100 + i for i, (_, tomb) in enumerate(entries)], np.uint64)
    run = Run(np.array([k for (k, _), _ in entries], np.uint64), np.array([t for (_, t), _ in entries], np.uint64),
              rowids)
    kept, dropped = purged(run, horizon, bottom)
    want = purge(run, horizon, bottom)
    assert kept.rowids.tolist() == want.rowids.tolist()
    live = rowids[rowids != TOMBSTONE]
    assert sorted(dropped.tolist()) == sorted(set(live.tolist()) - set(kept.rowids.tolist()))
    assert dropped_rowids(dropped, kept).tolist() == sorted(dropped.tolist())


async def test_crash_during_checkpoint_changes_nothing():
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/2/manifest", "int64")
    await idx.open()
    idx.insert(enc([1, 2, 3]), 10, np.array([11, 12, 13], np.uint64) + (1 << 32))
    with armed("offload.after_upload"), pytest.raises(FailPointCrash):
        await idx.checkpoint((1, 3))
    fresh = TerrascaleFS(fs.catalog, fs.block, MemoryBlockDevice(durable=False), fs.objects, config=fs.cfg)
    rep = await fresh.open()
    assert len(rep.rolled_back) == 1  # the half-built run file
    again = PartitionIndex(fresh, "idx/t/2/manifest", "int64")
    m = await again.open()
    assert m.runs == [] and m.mark == [0, 0]  # replay from the old mark recovers everything


async def test_merge_with_an_untouched_lower_level():
    """L0 -> L1 while an L2 run exists: the L2 run must stay attached to its manifest entry."""
    fs, rng, model = await world(), random.Random(21), Model()
    idx = PartitionIndex(fs, "idx/t/3/manifest", "int64")
    await idx.open()
    ts = 100
    for i in range(3):
        ts = await fill(idx, model, rng, 3, ts)
        await idx.checkpoint((1, i))
    await idx.merge(0, horizon=0)  # L0+L1 -> L1
    await idx.merge(1, horizon=0)  # L1+L2 -> L2
    for i in range(3, 6):
        ts = await fill(idx, model, rng, 3, ts)
        await idx.checkpoint((1, i))
    await idx.merge(0, horizon=0)  # L0 -> L1, L2 untouched
    assert [lv for lv, _ in idx.runs] == [1, 2]
    assert [m["level"] for m in idx.manifest.runs] == [1, 2]
    assert [r.sf.meta["inode"] for _, r in idx.runs] == [m["inode"] for m in idx.manifest.runs]
    await check(idx, model, [110, ts])
    again = PartitionIndex(fs, "idx/t/3/manifest", "int64")
    await again.open()
    await check(again, model, [105, ts])


async def test_get_many_matches_model_across_levels():
    """The vectorized multi-key lookup equals the model at every timestamp, keys in any level."""
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    m, rng, ts = Model(), random.Random(7), 100
    for rnd in range(7):
        ts = await fill(idx, m, rng, 8, ts)
        await idx.checkpoint((1, rnd))
        await idx.maybe_merge(0)
    ts = await fill(idx, m, rng, 4, ts)
    keys = list(range(-205, 205))
    for t in range(98, ts + 2, 5):
        assert (await idx.get_many(enc(keys), t)).tolist() == [m.at(k, t) for k in keys], t


async def test_checkpoint_failure_keeps_entries_readable():
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    m, rng = Model(), random.Random(3)
    ts = await fill(idx, m, rng, 5, 100)
    with armed("offload.after_upload"), pytest.raises(FailPointCrash):
        await idx.checkpoint((1, 0))
    await check(idx, m, [ts])
    assert await idx.checkpoint((1, 0))
    await check(idx, m, [ts])


async def test_range_scans_read_only_overlapping_pages_and_match_the_model():
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/0/manifest", "int64")
    await idx.open()
    m, rng, ts = Model(), random.Random(11), 100
    for rnd in range(4):
        ts = await fill(idx, m, rng, 12, ts)
        await idx.checkpoint((1, rnd))
    ts = await fill(idx, m, rng, 3, ts)
    for _ in range(40):
        lo, hi = sorted(rng.sample(range(-220, 220), 2))
        t = rng.randrange(100, ts + 2)
        rng_ = KeyRange(int(enc([lo])[0]), True, int(enc([hi])[0]), False)
        got = await idx.scan(t, rng_)
        want = [(k, m.at(k, t)) for k in range(lo, hi) if m.at(k, t)]
        assert list(zip(decode_keys(got.keys, "int64"), got.rowids.tolist())) == want, (lo, hi, t)
        rounds, rest, entries = [], rng_, rng.randrange(1, 40)  # the same range by small rounds (scans)
        while rest is not None:
            vis, nxt = await idx.scan_chunk(rest, t, entries)
            if nxt is not None and not len(vis) and nxt.lo == rest.lo:
                entries *= 2  # one key's versions fill a round
                continue
            rounds += list(zip(decode_keys(vis.keys, "int64"), vis.rowids.tolist()))
            rest = nxt
        assert rounds == want, (lo, hi, t, entries)


async def test_a_stale_server_collects_nothing_once_another_claimed_the_manifest(monkeypatch):
    """A demoted leader's garbage list is stale: the new leader collected those runs already
    and their inodes went back to the free ranges, where a new run can take one. Deleting by
    the stale list deleted that live run, and every later promotion failed on it (the nemesis
    suite, seed 9: a manifest naming a run whose file was gone, a partition led by nobody for
    a minute). A run is deleted only in one transaction with its manifest's version and its
    removal from the garbage list."""
    from rowstore.errors import ConflictError, FencedError
    from rowstore.index.key_manifest import Claim

    fs, rng, model = await world(), random.Random(5), Model()
    key = "idx/t/9/manifest"
    old = PartitionIndex(fs, key, "int64")
    await old.open(Claim("n2", 3))
    ts = 1000
    for i in range(2):
        ts = await fill(old, model, rng, 3, ts)
        await old.checkpoint((1, i))
    real_collect = old._collect

    async def demoted_before_collecting():  # the claim below comes between merge and collect
        old._collect = real_collect
    old._collect = demoted_before_collecting
    await old.merge(0, horizon=0)
    stale = list(old.manifest.garbage)
    assert len(stale) == 2
    new = PartitionIndex(fs, key, "int64")
    await new.open(Claim("n3", 4))  # claims the manifest and collects the garbage: the inodes are free
    assert new.manifest.garbage == []
    monkeypatch.setattr(fs.inodes, "reserve", lambda: _exactly(fs.inodes, stale[0]))
    ts = await fill(new, model, rng, 3, ts)
    await new.checkpoint((1, 2))  # the new leader's next run takes a freed inode
    monkeypatch.undo()
    assert stale[0] in [r["inode"] for r in new.manifest.runs]
    with pytest.raises((ConflictError, FencedError)):
        await old.collect()  # the stale server's collection pass
    await fs.stat(stale[0])  # the live run is still there
    again = PartitionIndex(fs, key, "int64")
    await again.open(Claim("n1", 5))  # the next promotion opens every run
    again.mem = new.mem
    await check(again, model, [ts])


async def _exactly(ranges, ident: int):
    """``RangeAllocator.reserve`` handing out ``ident`` itself (a free id, which a random pick
    reaches when it starts a free range of its own)."""
    from catalog.abc import Check, Delete, Put

    row = next(e for e in await ranges.catalog.scan(f"{ranges.prefix}/free/")
               if ranges._range(e)[0] <= ident < ranges._range(e)[1])
    lo, hi = ranges._range(row)
    ops = [Put(row.key, ranges._val(lo, ident)) if lo < ident else Delete(row.key)]
    if ident + 1 < hi:
        ops.append(Put(ranges._key(ident + 1), ranges._val(ident + 1, hi)))
    return ident, [Check(row.key, row.version)], ops


@pytest.mark.parametrize("seed", range(6))
async def test_visible_rowids_follow_writes_checkpoints_and_merges(seed):
    """The visible set kept across writes (the runs' part reused, the memtables laid over it)
    equals the model after every step, at the present and in the past, asked twice in a row."""
    fs, rng, model = await world(), random.Random(seed), Model()
    idx = PartitionIndex(fs, f"idx/t/{seed}/manifest", "int64")
    await idx.open()
    ts, stamps, floor = 100, [100], 0  # reads below a merge's horizon are not kept
    for step in range(40):
        op = rng.random()
        if op < 0.55:
            ts = await fill(idx, model, rng, 1, ts)
            stamps.append(ts)
        elif op < 0.7:
            await idx.checkpoint((1, step))
        elif op < 0.8:
            floor = max(floor, rng.choice(stamps[: max(len(stamps) // 2, 1)]))
            await idx.maybe_merge(horizon=floor)
        elif op < 0.9 and idx.mem.entries:
            token = idx.begin_checkpoint()  # a frozen memtable is read beside the new one
            ts = await fill(idx, model, rng, 1, ts)
            stamps.append(ts)
            await idx.finish_checkpoint(token, (1, step))
        for t in {ts, ts + 10, rng.choice([x for x in stamps if x >= floor])}:
            want = sorted(r for k in model.v if (r := model.at(k, t)))
            assert (await idx.visible_rowids(t)).tolist() == want, (step, t)
            assert (await idx.visible_rowids(t)).tolist() == want, (step, t)



@pytest.mark.parametrize("inline", [1024, 8])
async def test_small_memtable_merges_run_inline_and_a_big_one_is_left_for_the_thread(monkeypatch, inline):
    """Point writes add a one-entry run per group; merging those in a worker thread cost more
    than the merge (a thread hop per group). ``merge_small`` merges what is due while it is
    small and says whether a bigger merge is left; the answers never change."""
    from rowstore.index import key_memtable

    monkeypatch.setattr(key_memtable, "INLINE_MERGE", inline)
    fs = await world()
    idx = PartitionIndex(fs, "idx/t/9/manifest", "int64")
    await idx.open()
    model, rng, ts, left = Model(), random.Random(inline), 10, []
    for _ in range(300):
        ts += 1
        k = rng.randrange(-200, 200)
        rowids = np.array([rng.randrange(1 << 32, 1 << 40)], np.uint64)
        idx.insert(enc([k]), ts, rowids)
        model.add([k], ts, rowids)
        if idx.merge_due:
            left.append(idx.merge_small())
    runs = len(idx.mem._runs)
    if inline >= 300:
        assert not any(left) and runs <= 9  # a binary counter of 300 entries: at most 9 runs
    else:
        assert any(left) and runs > 9  # merges above 8 entries were left to merge_memtable
        await idx.merge_memtable()
        assert len(idx.mem._runs) <= 9
    await check(idx, model, [10, 100, 200, ts])


async def _unpublished_run(fs, key: str) -> int:
    """A column-run file written for a checkpoint that crashed before publishing it."""
    async def body():
        yield b"a column run"
    rec = await fs.create_sealed(body(), extra=lambda r: ([], [Put(f"{key}/pending/{r.inode:08x}", b"")]))
    return rec.inode


async def test_an_unpublished_run_the_store_cannot_delete_now_is_kept_for_the_next_open(monkeypatch):
    """A failed delete is not "gone already": the pending row stays with its file (dropping it
    would leave the file with nothing naming it), and the next open deletes both."""
    from terrafs.errors import TransientStorageError

    fs = await world()
    key = "idx/t/5/manifest"
    inode = await _unpublished_run(fs, key)

    async def unavailable(*a, **kw):
        raise TransientStorageError("the object store does not answer")
    with monkeypatch.context() as m:
        m.setattr(fs, "delete", unavailable)
        await PartitionIndex(fs, key, "int64").open()
    assert [e.key for e in await fs.catalog.scan(f"{key}/pending/")] == [f"{key}/pending/{inode:08x}"]
    assert (await fs.stat(inode)) is not None
    await PartitionIndex(fs, key, "int64").open()
    assert await fs.catalog.scan(f"{key}/pending/") == []
    assert inode not in {r.inode for r in await fs.list()}


async def test_an_unpublished_run_whose_file_is_gone_leaves_only_its_row_to_drop():
    fs = await world()
    key = "idx/t/6/manifest"
    inode = await _unpublished_run(fs, key)
    await fs.delete(inode)  # a crash after the file's delete, before the row's
    await PartitionIndex(fs, key, "int64").open()
    assert await fs.catalog.scan(f"{key}/pending/") == []
