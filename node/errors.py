"""Exceptions of the node layer; the CLI and HTTP edge map them to exit codes and error codes."""


class NodeError(Exception):
    """Raised for any node failure; the base of this package's errors."""


class ConfigError(NodeError):
    """Raised when the config file is unreadable, has an unknown key or a bad value.

    The message is one line naming the key (contract §4)."""


class UsageError(NodeError):
    """Raised for a malformed command-line argument the parser could not catch (exit 2)."""
