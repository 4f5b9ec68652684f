"""A new leader serves only once a majority holds the log it adopted (``Leadership._held``,
``_serve_once_held``).

Its log's tail, past what a majority held at the election, may hold groups nobody acknowledged;
the next election may drop them. Served at once, their rows were read and checkpointed into the
partition's index manifest, then lost with the epoch: simulation seed 208 with ``--pause 1``
ended with an index entry naming a segment no node held (RFC 0010, invariant LC)."""
import asyncio
from types import SimpleNamespace

from rowstore.db.serving.leadership import Leadership
from rowstore.replication.follower import ReplicaStore
from rowstore.replication.leader import Shipper
from rowstore.segments.active import ActiveSegment
from rowstore.segments.position import Position
from tests.rowstore.replication.test_shipping import NO_STEP_DOWN, S1, TICK, batch, world


async def _nothing(ts: int) -> None:
    """No clock to persist: these tests call the settling step alone."""


async def test_a_new_leader_serves_only_once_a_majority_holds_the_log_it_adopted():
    fss, stores, tr = await world()
    fs = fss["n1"]
    store = SimpleNamespace(shippers={}, not_led=set(), release_local=lambda t, p: [], fs=fs, epochs={}, node="n1",
                            catalog=fs.catalog)
    lead = Leadership(store, ReplicaStore(fs, lease_s=0.3, monotonic=TICK), SimpleNamespace(get=lambda tid: None),
                      decide=None, observe=lambda ts: None, observe_durably=_nothing, present=lambda: 0,
                      hold_present=lambda ts: None, monotonic=TICK)
    af = await fs.create()
    seg = ActiveSegment(7, af, af.where)
    seg.seq = 1
    await seg.append(batch(0, 50), S1, 5)  # written while it led before: on no follower
    end = Position(1, seg.file.durable_size)

    def shipper() -> Shipper:
        sh = Shipper("T", 0, 2, 1, end, ["n2", "n3"], tr, lease_s=0.3, on_fenced=NO_STEP_DOWN, clock=lambda: 0,
                     monotonic=TICK)
        sh.register(1, seg)
        store.shippers[("T", 0)] = sh
        sh.start_links()
        return sh

    served = []

    async def serve(d, sh):  # the partition opened and served (Partition.open: not part of this test)
        served.append(sh)
    lead._serve = serve
    d = SimpleNamespace(table_id="T", name="m")
    tr.down = {"n2", "n3"}
    sh = shipper()
    assert not await lead._held(sh, end, 0.2)  # not yet: promotion returns, the partition unserved
    task = asyncio.ensure_future(lead._serve_once_held(d, sh, end))
    await asyncio.sleep(0.2)
    assert not served and not task.done()
    sh.fence(3)  # a newer election: it never serves
    await asyncio.wait_for(task, 5)
    assert not served
    await sh.close()
    tr.down = {"n2"}  # one follower back: with this node, a majority
    sh = shipper()
    await asyncio.wait_for(lead._serve_once_held(d, sh, end), 10)
    assert served == [sh] and (await stores["n3"].replica("T", 0)).position() == end
    await sh.close()
