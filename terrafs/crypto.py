"""At-rest encryption keys: a node's key-encryption key (KEK) and per-file data keys.

Each file gets a random 256-bit data key, stored wrapped (AES-256-GCM under
the KEK) in the file header or sealed footer together with the KEK's id, so
a later key rotation can find which KEK unwraps which file. Layout: see
docs/format/terrafs.md.
"""
from __future__ import annotations

import hashlib
import os
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from terrafs.errors import ConfigurationError, EncryptionKeyError

NONCE_LEN = 12  # part of the format
TAG_LEN = 16  # part of the format
_WRAP_AAD = b"TRFS-DEK"  # part of the format


class KeyEncryptionKey:
    """The node's master key; it only ever encrypts data keys."""

    def __init__(self, key: bytes):
        if len(key) != 32:
            raise ConfigurationError("encryption key must be 32 bytes (raw or 64 hex chars)")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"terrascale-kek" + key).hexdigest()[:16]

    @classmethod
    def load(cls, path: str) -> "KeyEncryptionKey":
        """Read a key file holding 32 raw bytes or 64 hex characters."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as e:
            raise ConfigurationError(f"security.encryption_key_file: cannot read {path}: {e.strerror}") from e
        text = raw.strip()
        if len(text) == 64:
            try:
                return cls(bytes.fromhex(text.decode("ascii")))
            except (ValueError, UnicodeDecodeError):
                pass
        if len(raw) == 32:
            return cls(raw)
        raise ConfigurationError(
            f"security.encryption_key_file: {path} must hold 32 raw bytes or 64 hex chars")

    def wrap(self, data_key: bytes, inode: int) -> bytes:
        nonce = os.urandom(NONCE_LEN)
        return nonce + self._aead.encrypt(nonce, data_key, _WRAP_AAD + struct.pack("<I", inode))

    def unwrap(self, wrapped: bytes, key_id: str, inode: int, where: str) -> bytes:
        if key_id != self.key_id:
            raise EncryptionKeyError(
                f"{where} is encrypted with key id {key_id}; the configured key is {self.key_id}")
        try:
            return self._aead.decrypt(
                wrapped[:NONCE_LEN], wrapped[NONCE_LEN:], _WRAP_AAD + struct.pack("<I", inode))
        except InvalidTag:
            raise EncryptionKeyError(f"{where}: data key does not unwrap with key {key_id}") from None


class DataCipher:
    """AES-256-GCM over block payloads with a random nonce per block."""

    __slots__ = ("_aead",)

    def __init__(self, data_key: bytes):
        self._aead = AESGCM(data_key)

    def encrypt(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_LEN)
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    def decrypt(self, payload: bytes, aad: bytes) -> bytes:
        """Raises InvalidTag when the key is wrong or the payload was altered."""
        return self._aead.decrypt(payload[:NONCE_LEN], payload[NONCE_LEN:], aad)


def new_data_key() -> bytes:
    return os.urandom(32)
