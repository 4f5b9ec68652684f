"""The log device's group commit: writes counted as they complete, made durable by one
``fdatasync`` shared by every thread that waits meanwhile, and the rule that a write a failed
flush may have covered is never reported durable (fsyncgate). A piece of its own: it touches
neither the device's extents nor its chains, only its ``fdatasync`` (RFC 0011)."""
from __future__ import annotations

import threading
from typing import Callable

from terrafs.backends.logdev_format import Chain
from terrafs.errors import DeviceError


class GroupCommit:
    """A device's write counter and its flushes: a thread needing its writes durable waits for
    the flush in flight when that one started after them, or starts the next."""

    def __init__(self, path: str, fdatasync: Callable[[], None]):
        self._path = path  # the device's, in errors
        self._fdatasync = fdatasync
        self._cv = threading.Condition()
        self._written = self._synced = 0  # writes completed / covered by a finished flush
        self._syncing = False
        self._failed: BaseException | None = None  # the last failed flush's error
        self._suspect = 0  # writes up to this one were covered by a failed flush (see flush)
        self.flushes = 0  # fdatasyncs of the device (tests and metrics count them)

    def note_written(self, chain: Chain | None = None) -> int:
        """Count a completed write (of ``chain``'s file); its number, for ``flush``."""
        with self._cv:
            self._written += 1
            if chain is not None:
                chain.last_write = self._written
            return self._written

    def flush(self, upto: int | None = None) -> None:
        """Make durable every write up to number ``upto`` (default: every write completed
        before this call): one ``fdatasync`` of the device, shared with every thread that waits
        meanwhile. A write that a failed flush may have covered is never reported durable
        (after a failed fdatasync the kernel may have dropped its pages and a later one
        succeeds: the "fsyncgate" lesson): its file fails, is cut back to its last durable
        group and recovered from the disk (``TerrascaleFS.reopen_failed``); writes made after
        the failure flush normally."""
        with self._cv:
            target = self._written if upto is None else upto
            while True:
                if target <= self._suspect:
                    raise DeviceError(f"{self._path}: a flush of the log device covering this write failed: "
                                      f"{self._failed}")
                if self._synced >= target:
                    return
                if self._syncing:
                    self._cv.wait()
                    continue
                self._syncing, start = True, self._written
                self._cv.release()
                err = None
                try:
                    self._fdatasync()
                except OSError as e:
                    err = e
                self._cv.acquire()
                self._syncing = False
                if err is None:
                    self._synced = max(self._synced, start)
                    self.flushes += 1
                else:
                    self._failed, self._suspect = err, self._written
                self._cv.notify_all()
                if err is not None and target <= self._suspect:
                    raise err
