"""Where ids and random draws come from: file generations, staging names, catalog request
ids, transaction ids, table ids, lease names and backoff jitter.

The system's by default (``SYSTEM``); a seeded one in the simulation (``Entropy(seed)``), so a
seed replays its run draw for draw — passed in to what draws, never patched over a module.
Key material and nonces (``terrafs.crypto``) always come from ``os.urandom``: they are secrets,
not ids, and no replay needs them equal."""
from __future__ import annotations

import random
import secrets
import uuid


class Entropy:
    """Random bits and ids: from ``secrets`` (``seed`` None) or from one seeded generator."""

    def __init__(self, seed: int | str | None = None):
        self._rng = None if seed is None else random.Random(seed)

    def bits(self, k: int) -> int:
        """A non-negative integer of ``k`` random bits."""
        return secrets.randbits(k) if self._rng is None else self._rng.getrandbits(k)

    def token(self, nbytes: int = 16) -> str:
        """``nbytes`` random bytes as hex (names of leases, staged files)."""
        return secrets.token_hex(nbytes) if self._rng is None else self._rng.randbytes(nbytes).hex()

    def uuid_hex(self) -> str:
        """A version-4 UUID as 32 hex digits (table ids, catalog request ids)."""
        return uuid.uuid4().hex if self._rng is None else uuid.UUID(int=self.bits(128), version=4).hex

    def jitter(self) -> random.Random:
        """A generator of its own for backoff delays (drawn from this one when seeded)."""
        return random.Random() if self._rng is None else random.Random(self.bits(64))


SYSTEM = Entropy()
