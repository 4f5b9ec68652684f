"""Per-file parameters shared by active and sealed files (docs/format/terrafs.md)."""
from __future__ import annotations

from dataclasses import dataclass

from terrafs.blocks import MAX_BLOCK_SIZE, Codec
from terrafs.crypto import DataCipher, KeyEncryptionKey, new_data_key
from terrafs.errors import ConfigurationError, EncryptionKeyError


@dataclass(frozen=True, slots=True)
class FileParams:
    """What a file's bytes need to be read back: identity, codec, block size, wrapped key."""

    inode: int
    gen: int
    codec: Codec = Codec.NONE
    block_size: int = 64 * 1024
    page_size: int = 0
    key_id: str = ""
    wrapped_key: bytes = b""

    def __post_init__(self) -> None:
        if not 0 < self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigurationError(f"block_size must be in (0, {MAX_BLOCK_SIZE}]")
        if not 0 <= self.inode < 2**32:
            raise ConfigurationError(f"inode {self.inode} out of range")

    @property
    def encrypted(self) -> bool:
        return bool(self.key_id)

    def cipher(self, kek: KeyEncryptionKey | None, where: str) -> DataCipher | None:
        """The data cipher for this file, or None when it is not encrypted."""
        if not self.encrypted:
            return None
        if kek is None:
            raise EncryptionKeyError(f"{where} is encrypted (key id {self.key_id}) and no key is configured")
        return DataCipher(kek.unwrap(self.wrapped_key, self.key_id, self.inode, where))


def new_params(inode: int, gen: int, *, codec: Codec, block_size: int, page_size: int = 0,
               kek: KeyEncryptionKey | None = None) -> FileParams:
    """Parameters for a new file; with a KEK, a fresh wrapped data key."""
    if kek is None:
        return FileParams(inode, gen, codec, block_size, page_size)
    return FileParams(inode, gen, codec, block_size, page_size, kek.key_id,
                      kek.wrap(new_data_key(), inode))
