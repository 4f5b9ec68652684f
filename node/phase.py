"""The node's phase (docs/REFERENCE.md §3, ``/readyz``): moved forward by the daemon only
(``node/daemon/lifecycle.py``), read by the HTTP edge and the router, which answer 503
``not_ready`` outside ``READY``."""
from __future__ import annotations

import enum


class Phase(enum.Enum):
    STARTING = "starting"  # listening (/healthz answers); stores opening, recovery running
    READY = "ready"  # recovered and serving
    STOPPING = "stopping"  # stop asked: in-flight requests finish, the stores close in reverse


class Readiness:
    """One node's phase; it only moves forward: STARTING -> READY -> STOPPING."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING

    @property
    def ready(self) -> bool:
        return self.phase is Phase.READY

    @property
    def stopping(self) -> bool:
        return self.phase is Phase.STOPPING

    def serve(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY

    def stop(self) -> None:
        self.phase = Phase.STOPPING
