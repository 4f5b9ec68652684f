"""Block codec: round trips (hypothesis), every flipped byte detected, encryption binding."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from terrafs.blocks import HEADER_LEN, Codec, Flags, decode_block, encode_block, encode_pad, parse_header
from terrafs.crypto import DataCipher, KeyEncryptionKey, new_data_key
from terrafs.errors import ConfigurationError, FileCorruptionError, EncryptionKeyError

KEY = new_data_key()


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), loff=st.integers(0, 2**62), group=st.integers(0, 2**32 - 1),
       end=st.booleans(), codec=st.sampled_from(list(Codec)), enc=st.booleans(),
       inode=st.integers(0, 2**32 - 1))
def test_round_trip(data, loff, group, end, codec, enc, inode):
    cipher = DataCipher(KEY) if enc else None
    out = bytearray(b"prefix")
    encode_block(out, data, logical_off=loff, group=group, end=end, codec=codec, cipher=cipher, inode=inode)
    h, got = decode_block(out, 6, cipher=cipher, inode=inode)
    assert got == data
    assert (h.logical_off, h.group, h.raw_len) == (loff, group, len(data))
    assert bool(h.flags & Flags.END) == end
    assert h.record_len == len(out) - 6


def test_compression_only_when_it_shrinks():
    out = bytearray()
    encode_block(out, os.urandom(4000), logical_off=0, group=0, end=True, codec=Codec.ZSTD)
    assert not parse_header(out, 0, "t").flags & Flags.ZSTD
    out = bytearray()
    encode_block(out, b"a" * 4000, logical_off=0, group=0, end=True, codec=Codec.ZSTD)
    h = parse_header(out, 0, "t")
    assert h.flags & Flags.ZSTD and h.stored_len < 100


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("enc", [False, True])
def test_every_flipped_byte_is_detected(codec, enc):
    cipher = DataCipher(KEY) if enc else None
    out = bytearray()
    encode_block(out, b"measurement " * 40, logical_off=77, group=3, end=True, codec=codec,
                 cipher=cipher, inode=9)
    for i in range(len(out)):
        bad = bytearray(out)
        bad[i] ^= 0x01
        with pytest.raises(FileCorruptionError) as ei:
            decode_block(bad, 0, cipher=cipher, inode=9, where="obj")
        assert ei.value.where == "obj" and ei.value.offset == 0


def test_encrypted_block_bound_to_inode_and_key():
    cipher = DataCipher(KEY)
    out = bytearray()
    encode_block(out, b"secret row value", logical_off=0, group=1, end=True, cipher=cipher, inode=5)
    assert b"secret row value" not in out
    with pytest.raises(EncryptionKeyError):
        decode_block(out, 0, cipher=cipher, inode=6)  # moved to another file
    with pytest.raises(EncryptionKeyError):
        decode_block(out, 0, cipher=DataCipher(new_data_key()), inode=5)
    with pytest.raises(EncryptionKeyError):
        decode_block(out, 0, cipher=None, inode=5)


def test_pad_block():
    out = bytearray()
    encode_pad(out, logical_off=10, group=2, pad_len=HEADER_LEN + 100)
    h, data = decode_block(out, 0)
    assert len(out) == HEADER_LEN + 100 and data == b"" and h.flags & Flags.PAD and h.flags & Flags.END


def test_truncated_header_and_payload():
    out = bytearray()
    encode_block(out, b"x" * 100, logical_off=0, group=0, end=True)
    with pytest.raises(FileCorruptionError, match="truncated block header"):
        decode_block(out[:20], 0)
    with pytest.raises(FileCorruptionError, match="truncated block payload"):
        decode_block(out[:-1], 0)


def test_kek_wrap_and_load(tmp_path):
    kek = KeyEncryptionKey(os.urandom(32))
    dk = new_data_key()
    w = kek.wrap(dk, 12)
    assert kek.unwrap(w, kek.key_id, 12, "f") == dk
    with pytest.raises(EncryptionKeyError):
        kek.unwrap(w, kek.key_id, 13, "f")
    other = KeyEncryptionKey(os.urandom(32))
    with pytest.raises(EncryptionKeyError, match="key id"):
        other.unwrap(w, kek.key_id, 12, "f")
    raw = tmp_path / "raw"
    raw.write_bytes(b"k" * 32)
    hexf = tmp_path / "hex"
    hexf.write_text("ab" * 32 + "\n")
    assert KeyEncryptionKey.load(str(raw)).key_id == KeyEncryptionKey(b"k" * 32).key_id
    assert KeyEncryptionKey.load(str(hexf)).key_id == KeyEncryptionKey(bytes.fromhex("ab" * 32)).key_id
    bad = tmp_path / "bad"
    bad.write_text("short")
    with pytest.raises(ConfigurationError, match="32 raw bytes"):
        KeyEncryptionKey.load(str(bad))
