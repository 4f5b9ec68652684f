"""Placement of partitions over members (node/cluster/placement.py, RFC 0010 §1): balanced by count,
leaders spread round-robin from the creating node, the record's bytes, and property checks
against a simple model."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.errors import CorruptionError
from node.cluster.placement import Placement, PartitionPlace, counts, plan


def test_an_empty_cluster_gets_leaders_round_robin_from_the_creating_node():
    pl = plan(["n1", "n2", "n3"], 8, 1, {}, {}, first="n2")
    assert pl.leaders() == ["n2", "n3", "n1", "n2", "n3", "n1", "n2", "n3"]
    assert pl.by_node() == {"n2": [0, 3, 6], "n3": [1, 4, 7], "n1": [2, 5]}
    assert pl.led_by("n1") == {2, 5}


def test_existing_load_is_evened_out_first():
    other = plan(["n1", "n2", "n3"], 8, 1, {}, {}, first="n1")  # n1: 3, n2: 3, n3: 2
    led, held = counts([other])
    assert led == {"n1": 3, "n2": 3, "n3": 2}
    pl = plan(["n1", "n2", "n3"], 4, 1, led, held, first="n1")
    assert pl.leaders()[0] == "n3"  # the least loaded takes the first partition
    total = counts([other, pl])[0]
    assert max(total.values()) - min(total.values()) <= 1


def test_replicas_are_distinct_members_leader_first():
    pl = plan(["a", "b", "c", "d"], 6, 3, {}, {}, first="a")
    for p in pl.partitions:
        assert len(set(p.replicas)) == 3 and p.leader == p.replicas[0] and p.epoch == 1
    held = counts([pl])[1]
    assert sorted(held.values()) == [4, 4, 5, 5]  # 18 replicas over 4 members, evenly
    with pytest.raises(ValueError, match="3 replicas need as many members"):
        plan(["a", "b"], 2, 3, {}, {})
    with pytest.raises(ValueError, match="no members"):
        plan([], 2, 1, {}, {})


def test_the_record_round_trips_and_damage_is_corruption():
    pl = Placement((PartitionPlace(("n1", "n2"), 3), PartitionPlace(("n2",), 1)))
    raw = pl.to_bytes()
    assert Placement.from_bytes(raw, "k") == pl
    moved = pl.with_partition(1, PartitionPlace(("n3", "n2"), 4, 3, (7, 4096)))  # after an election
    assert Placement.from_bytes(moved.to_bytes(), "k") == moved and moved.partitions[0] == pl.partitions[0]
    assert b'"base": 3, "start": [7, 4096]' in moved.to_bytes() and b"base" not in raw
    assert pl.json()[0] == {"partition": 0, "leader": "n1", "replicas": ["n1", "n2"], "epoch": 3}
    for bad in (b"", b"{}", b'{"format": 2, "partitions": []}', b'{"format": 1, "partitions": []}',
                b'{"format": 1, "partitions": [{"replicas": [], "epoch": 1}]}', raw[:-3],
                b'{"format": 1, "partitions": [{"replicas": ["a", "a"], "epoch": 1}]}',
                b'{"format": 1, "partitions": [{"replicas": ["a"], "epoch": 1, "start": [1]}]}'):
        with pytest.raises(CorruptionError) as ei:
            Placement.from_bytes(bad, "node/place/t")
        assert ei.value.where == "node/place/t"


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 64), st.data())
def test_leaders_stay_balanced_whatever_the_tables(n_members, partitions, data):
    """Tables placed one after another on a cluster: every member leads within one
    partition of every other, as a model that hands out partitions one by one would."""
    members = [f"n{i}" for i in range(n_members)]
    placed = []
    for _ in range(data.draw(st.integers(1, 5))):
        p = data.draw(st.integers(1, partitions))
        first = data.draw(st.sampled_from(members))
        led, held = counts(placed)
        placed.append(plan(members, p, 1, led, held, first=first))
        total = counts(placed)[0]
        loads = [total.get(m, 0) for m in members]
        assert max(loads) - min(loads) <= 1


def test_replicas_beyond_what_the_cluster_has_are_refused_with_the_reason(tmp_path):
    """R copies need R nodes: the config takes 1..7; a single node (trkv:// catalog) refuses
    R > 1 on table create with the reason, and nothing is created."""
    from bench.node_proc import NodeProc
    from node.config import from_dict
    from node.errors import ConfigError

    assert from_dict({"tables": {"replicas": 3}}).replicas == 3
    for bad in (0, 8, True, "2"):
        with pytest.raises(ConfigError, match="tables.replicas: expected an integer 1..7"):
            from_dict({"tables": {"replicas": bad}})
    assert from_dict({"tables": {"replicas": 1}}).replicas == 1
    node = NodeProc(tmp_path).start()
    try:
        with node.client() as c:
            for bad in (3, 0, "2", True, 8):
                with pytest.raises(Exception) as ei:
                    c.create_table("r", [("id", "int64")], "id", replicas=bad)
                assert ei.value.status == 400 and ei.value.code == "invalid_schema"
            with pytest.raises(Exception, match="need a cluster of at least 2 nodes"):
                c.create_table("r", [("id", "int64")], "id", replicas=2)
            assert c.list_tables()["tables"] == []
            c.create_table("r", [("id", "int64")], "id", replicas=1)
            place = c.describe("r")["placement"]
            assert [p["replicas"] for p in place] == [["n1"]] * 8 and {p["leader"] for p in place} == {"n1"}
    finally:
        node.ensure_stopped()
