"""Which replica an election names (node/cluster/controller.py, ``choose_leader``): the longest
log among the promises; a node whose block device is full only when the others do not make
a majority without it (then the longest of theirs still holds every acknowledged write)."""
from node.cluster.election import choose_leader


def a(last, seq, off, writable=True):
    return {"last": last, "pos": [seq, off], "writable": writable}


def test_the_longest_log_wins_and_ties_go_to_the_preferred_then_the_old_leader():
    got = {"n1": a(2, 1, 100), "n2": a(2, 1, 300), "n3": a(1, 1, 900)}
    assert choose_leader(got, 2, None, "n1") == "n2"
    tie = {"n1": a(2, 1, 300), "n2": a(2, 1, 300)}
    assert choose_leader(tie, 2, None, "n1") == "n1"
    assert choose_leader(tie, 2, "n2", "n1") == "n2"


def test_a_full_node_is_passed_over_while_the_others_make_a_majority():
    got = {"n1": a(2, 1, 500, writable=False), "n2": a(2, 1, 300), "n3": a(2, 1, 200)}
    assert choose_leader(got, 2, None, "n1") == "n2"  # n1's longer tail was never acknowledged
    two = {"n1": a(2, 1, 500, writable=False), "n2": a(2, 1, 300)}
    assert choose_leader(two, 2, None, "n1") == "n1"  # without n1 no majority: only the longest is safe
    old = {"n1": {"last": 2, "pos": [1, 500]}, "n2": a(2, 1, 300)}  # an answer without the field
    assert choose_leader(old, 2, None, "n2") == "n1"
