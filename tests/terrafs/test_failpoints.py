"""The network fault files of ``TERRASCALE_FAILPOINT_CUT_DIR`` (terrafs/failpoints.py): a file
named after a node cuts this node's requests to it, ``slow-<node>`` holding a number of ms
delays them; both set and lifted while the process runs."""
import os

import pytest

from terrafs import failpoints
from terrafs.failpoints import cut_to, slow_to


@pytest.fixture
def cut_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(failpoints, "CUT_DIR", str(tmp_path))
    return tmp_path


def put(path, text: str) -> None:
    """Written whole, as the docstring asks: a temporary name, then rename."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_nothing_without_a_folder(monkeypatch):
    monkeypatch.setattr(failpoints, "CUT_DIR", None)
    assert not cut_to("n2") and slow_to("n2") == 0.0


def test_an_empty_file_cuts_and_delays_nothing(cut_dir):
    assert not cut_to("n2")
    (cut_dir / "n2").touch()
    assert cut_to("n2") and not cut_to("n3")
    assert slow_to("n2") == 0.0
    (cut_dir / "n2").unlink()
    (cut_dir / "all").touch()
    assert cut_to("n3")


def test_a_slow_file_delays_that_node_only_and_follows_its_changes(cut_dir):
    assert slow_to("n2") == 0.0
    put(cut_dir / "slow-n2", "250")
    assert slow_to("n2") == 0.25 and slow_to("n3") == 0.0
    assert not cut_to("n2")  # a slow link is not a cut
    put(cut_dir / "slow-n2", "400\n")  # changed while the process runs: read again
    assert slow_to("n2") == 0.4
    put(cut_dir / "slow-all", "100")
    assert slow_to("n3") == 0.1 and slow_to("n2") == 0.4  # the larger of the two
    (cut_dir / "slow-n2").unlink()
    (cut_dir / "slow-all").unlink()
    assert slow_to("n2") == 0.0 and slow_to("n3") == 0.0


@pytest.mark.parametrize("text", ["", "abc", "-5", "nan", "inf", "\xff"])
def test_content_that_is_not_a_delay_delays_nothing(cut_dir, text):
    (cut_dir / "slow-n2").write_bytes(text.encode("latin-1"))
    assert slow_to("n2") == 0.0
