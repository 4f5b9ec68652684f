"""A hook that keeps an invariant is a constructor argument without a default: the
clock floor and the new leader's clock (invariant C of RFC 0010), fencing (a fenced leader steps
down), the HLC present a leader ships. Left out, the class is not made — it never runs with the
check switched off, as ``observe_durably=None`` once silently did."""
from __future__ import annotations

import inspect

import pytest

from rowstore.db.serving.handoff import Handoffs
from rowstore.db.serving.leadership import Leadership
from rowstore.replication.leader import Shipper

REQUIRED = [
    (Leadership, "observe"), (Leadership, "observe_durably"), (Leadership, "present"),
    (Handoffs, "observe"),
    (Shipper, "on_fenced"), (Shipper, "clock"),
]


def _everything_but(cls, hook: str) -> dict:
    """Every parameter of ``cls`` given (a stand-in), except ``hook``."""
    params = list(inspect.signature(cls).parameters.values())
    return {p.name: object() for p in params if p.name != hook and p.default is inspect.Parameter.empty}


@pytest.mark.parametrize(("cls", "hook"), REQUIRED, ids=[f"{c.__name__}.{h}" for c, h in REQUIRED])
def test_a_safety_hook_has_no_default_and_the_class_is_not_made_without_it(cls, hook):
    param = inspect.signature(cls).parameters[hook]
    assert param.default is inspect.Parameter.empty, f"{cls.__name__}({hook}=...) has a default"
    with pytest.raises(TypeError, match=hook):
        cls(**_everything_but(cls, hook))
