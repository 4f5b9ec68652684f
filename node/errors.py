"""Exceptions of the node layer; the CLI and HTTP edge map them to exit codes and error codes."""


class NodeError(Exception):
    """Raised for any node failure; the base of this package's errors."""


class ConfigError(NodeError):
    """Raised when the config file is unreadable, has an unknown key or a bad value.

    The message is one line naming the key (docs/REFERENCE.md §5)."""


class UsageError(NodeError):
    """Raised for a malformed command-line argument the parser could not catch (exit 2)."""


class ApiError(NodeError):
    """One error answer of the HTTP API (``status``, ``code``, ``message``): raised by a
    handler to answer with it, and by the clients when a node answered with it."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message = status, code, message
