"""Keeping a read's lease alive from the executors (docs/spark.md, "Leases").

The plan's lease (RFC 0006) protects the snapshot's segments from the garbage collector
until it expires. A task that reads a segment from object storage first renews it — which
the node refuses once the lease has expired, because from then on the collector may have
taken the segment — and keeps renewing it every third of its time to live while it reads.
So a segment is never collected under a reading task; a job that dies stops renewing and
its lease runs out ``lease_s`` seconds after the last renewal.
"""
from __future__ import annotations

import threading

from spark_bridge.errors import BridgeError, LeaseExpiredError
from spark_bridge.options import Options
from spark_bridge.remote import Remote


class LeaseKeeper:
    """``with LeaseKeeper(opts, lease):`` — renewed on entry (or :class:`LeaseExpiredError`),
    then in a background thread; :meth:`check` raises in the reading thread once a renewal
    failed for good."""

    def __init__(self, opts: Options, lease: str):
        self.opts, self.lease = opts, lease
        self.every = opts.lease_s / 3
        self._stop = threading.Event()
        self._failed: BaseException | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "LeaseKeeper":
        with Remote(self.opts) as r:
            r.renew(self.lease, self.opts.lease_s)
        self._thread = threading.Thread(target=self._run, name=f"terrascale-lease-{self.lease}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with Remote(self.opts) as r:
            while not self._stop.wait(self.every):
                try:
                    r.renew(self.lease, self.opts.lease_s)
                except LeaseExpiredError as e:
                    self._failed = e
                    return
                except BridgeError:
                    continue  # the node is briefly unreachable: the lease still has two thirds to run

    def check(self) -> None:
        if self._failed is not None:
            raise self._failed

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.opts.timeout_s)
