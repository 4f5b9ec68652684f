"""Shared benchmark helpers: timing, result table, JSON output."""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


@dataclass
class Result:
    workload: str
    ours: float
    peer_name: str
    peer: float
    unit: str
    target: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.ours / self.peer if self.peer else float("nan")


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0


def median_time(repeat: int, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s last answer and the median of ``repeat`` timed calls, in seconds."""
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def print_table(title: str, results: list[Result]) -> None:
    print(f"\n## {title}\n")
    print("| workload | ours | peer | peer value | ratio | target |")
    print("| --- | ---: | --- | ---: | ---: | --- |")
    for r in results:
        print(f"| {r.workload} | {_num(r.ours)} {r.unit} | {r.peer_name} | {_num(r.peer)} {r.unit} "
              f"| {r.ratio:.2f}x | {r.target} |")


def _num(v: float) -> str:
    """Thousands separators; decimals only where the value is small enough to need them."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"


def write_json(name: str, results: list[Result]) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w") as f:
        json.dump({"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                   "results": [dict(asdict(r), ratio=r.ratio) for r in results]}, f, indent=2)
    return path
