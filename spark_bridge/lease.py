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
import time

from node.errors import ApiError
from spark_bridge.errors import BridgeError, LeaseExpiredError
from spark_bridge.options import Options
from spark_bridge.remote import Remote


def renew(remote: Remote, lease: str, ttl_s: float) -> None:
    for attempt in range(8):
        try:
            remote.renew(lease, ttl_s)
            return
        except BridgeError as e:
            cause = e.__cause__
            if not isinstance(cause, ApiError) or cause.status != 409:
                raise
            if cause.code == "lease_expired":
                raise LeaseExpiredError(
                    f"the read lease {lease} expired (or was released) before this task renewed it, so the "
                    f"segments of the snapshot may have been garbage-collected; load the DataFrame again "
                    f"(a DataFrame keeps its snapshot and lease; option lease_s sets how long the lease "
                    f"outlives the last read)") from None
            time.sleep(0.01 * (attempt + 1))  # another task of the job renewed it at the same moment
    remote.renew(lease, ttl_s)


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
            renew(r, self.lease, self.opts.lease_s)
        self._thread = threading.Thread(target=self._run, name=f"terrascale-lease-{self.lease}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        with Remote(self.opts) as r:
            while not self._stop.wait(self.every):
                try:
                    renew(r, self.lease, self.opts.lease_s)
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
