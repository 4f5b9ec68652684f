"""The histogram's JSON writer against ``json.dumps`` of the same counts."""
import json

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from node.http.grid_json import counts_json


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.int64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=12),
                  elements=st.integers(0, 2**63 - 1) | st.integers(0, 12)))
def test_counts_json_is_json_dumps(counts):
    assert json.loads(counts_json(counts)) == counts.tolist()
    assert counts_json(counts) == json.dumps(counts.tolist(), separators=(",", ":"))


def test_negative_counts_are_refused():
    with pytest.raises(ValueError):
        counts_json(np.array([[1, -1]]))
