"""The bridge's exceptions (one line each: what went wrong and what to do)."""


class BridgeError(Exception):
    """Raised when a Spark read or write of a Terrascale table cannot go on."""


class OptionError(BridgeError, ValueError):
    """Raised when a data source option is missing or malformed (the message names it)."""


class LeaseExpiredError(BridgeError):
    """Raised when a read's lease expired or was released before an executor renewed it:
    the snapshot's segments may have been garbage-collected, so the read stops."""
