"""systemd's readiness protocol (sd_notify(3)), spoken directly: one datagram to $NOTIFY_SOCKET.

``Type=notify`` units wait for ``READY=1``; ``WATCHDOG=1`` keeps a unit with
``WatchdogSec=`` alive; ``STOPPING=1`` says shutdown has begun. Outside systemd
(no $NOTIFY_SOCKET) every call is a no-op. A path starting with ``@`` is an
abstract socket (a leading NUL byte).
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("terrascale.node")


def notify(state: str, env: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1\\nSTATUS=serving"``); True if a socket was there."""
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode())
    except OSError as e:
        log.warning("event=sd_notify_failed socket=%s error=%r", path, e)
        return False
    return True


def watchdog_interval(env: Mapping[str, str] | None = None) -> float | None:
    """Half the watchdog timeout systemd set for this process (seconds), or None."""
    env = env if env is not None else os.environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
