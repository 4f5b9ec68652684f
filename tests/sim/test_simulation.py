"""The seeded fault simulation in ``make test`` (tests/sim/world.py): a fixed set of seeds, each
30 virtual seconds of kill -9, partitions, slow links and nodes, lost and duplicated
messages and clock jumps against three nodes of the real replication code — every invariant
must hold for every seed. A child process with ``PYTHONHASHSEED=0``, so a failing seed
replays exactly with the command it prints. Long mode: ``python -m tests.sim --seeds 0-9999``."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sim(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.sim", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=600)


@pytest.mark.slow
def test_every_invariant_holds_for_every_seed():
    out = sim("--seeds", "0-59")
    print(out.stdout[-2000:])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]


@pytest.mark.slow
def test_it_finds_the_whole_log_discard_when_that_fix_is_reverted():
    """With S1's fix reverted (a diverged follower discards its whole log) a known seed loses
    acknowledged writes; the same seed is clean with the fix (the run above)."""
    out = sim("--seeds", "46", "--revert", "s1")
    assert out.returncode == 1 and "acknowledged batches lost" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]
    assert sim("--seeds", "46").returncode == 0
