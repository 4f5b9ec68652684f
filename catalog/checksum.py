"""CRC-32C that keeps the GIL.

The crc32c package releases the GIL for inputs of 32 KiB and more, but the
hardware instruction checksums 64 KiB in ~2.5 µs — far less than getting the
GIL back can cost a thread when another holds it (up to the interpreter's
5 ms switch interval). Every checksum of the project goes through here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from crc32c import crc32c as _crc32c

if TYPE_CHECKING:
    from typing_extensions import Buffer


def crc32c(data: Buffer, value: int = 0) -> int:
    return _crc32c(data, value, 0)  # gil_release_mode 0: never release
