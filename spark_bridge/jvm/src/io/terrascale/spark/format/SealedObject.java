package io.terrascale.spark.format;

import com.github.luben.zstd.ZstdDecompressCtx;
import io.terrascale.spark.BridgeException;
import io.terrascale.spark.CorruptObjectException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.util.Arrays;
import java.util.zip.CRC32C;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * A TerrascaleFS sealed file read straight from its object: docs/format/terrafs.md §1 (block
 * records) and §3 (sealed file: blocks, key section, block map, 96-byte footer). Every block's
 * header and payload checksum is verified, then it is decrypted (AES-256-GCM) and decompressed
 * (zstd). Every constant below is part of the file format. One thread reads an object.
 */
public final class SealedObject implements AutoCloseable {
    static final byte[] SEAL_MAGIC = "TRFSSEAL".getBytes(StandardCharsets.US_ASCII);
    static final int FOOTER_LEN = 96;
    static final int MAP_ENTRY = 24;
    static final int BLOCK_MAGIC = 0x4B4C4254; // "TBLK"
    static final int HEADER_LEN = 36;
    static final int AAD_LEN = 28;
    static final int F_ZSTD = 0x01, F_AESGCM = 0x02, F_PAD = 0x08;
    static final int MAX_BLOCK_SIZE = 1 << 20;

    private final String where;
    private final ByteSource src;
    private final int inode;
    private final long logicalSize;
    private final long[] logical;
    private final long[] physical;
    private final int[] recLen;
    private final int[] rawLen;
    private final SecretKeySpec dataKey;
    private final ZstdDecompressCtx zstd = new ZstdDecompressCtx(); // one context per object, not per block
    private final StepNanos nanos = new StepNanos();

    /**
     * Opens the object {@code where} (for messages) of {@code objectSize} bytes: its footer, key
     * section and block map. An encrypted object's data key is {@code dataKey} when the plan gave it,
     * else unwrapped with {@code kek}.
     */
    public SealedObject(String where, ByteSource src, long objectSize, Kek kek, byte[] dataKey) throws IOException {
        this.where = where;
        this.src = src;
        if (objectSize < FOOTER_LEN) throw corrupt(0, "object too short for a sealed-file footer");
        long at = objectSize - FOOTER_LEN;
        ByteBuffer f = le(src.read(at, FOOTER_LEN));
        if (!Arrays.equals(f.array(), 0, 8, SEAL_MAGIC, 0, 8)) throw corrupt(at, "bad sealed-file magic");
        if (crc(f.array(), 0, 92) != f.getInt(92)) throw corrupt(at, "footer checksum mismatch");
        if (f.getShort(8) != 1 || f.getShort(10) != FOOTER_LEN) throw corrupt(at, "unsupported sealed-file version");
        inode = f.getInt(12);
        logicalSize = f.getLong(24);
        long mapOff = f.getLong(32);
        int count = f.getInt(40);
        int mapCrc = f.getInt(44);
        long keyOff = f.getLong(48);
        int keyLen = f.getInt(56);
        int enc = f.get(61);
        if (count < 0 || mapOff + (long) count * MAP_ENTRY != at || (keyLen != 0 && keyOff + keyLen != mapOff)) {
            throw corrupt(at, "footer section offsets are inconsistent");
        }
        long lo = keyLen != 0 ? keyOff : mapOff;
        byte[] tail = src.read(lo, (int) (at - lo));
        if (crc(tail, keyLen, tail.length - keyLen) != mapCrc) throw corrupt(mapOff, "block map checksum mismatch");
        logical = new long[count];
        physical = new long[count];
        recLen = new int[count];
        rawLen = new int[count];
        readMap(le(tail), keyLen, mapOff, lo);
        if (keyLen == 0) {
            this.dataKey = null;
        } else if (enc != 1) {
            throw corrupt(at, "key section on an object not marked encrypted");
        } else {
            this.dataKey = dataKey != null ? new SecretKeySpec(dataKey, "AES") : unwrap(tail, keyLen, keyOff, kek);
        }
    }

    /** The block map: entries of {@code logical u64 | physical u64 | record_len u32 | raw_len u32}. */
    private void readMap(ByteBuffer m, int base, long mapOff, long blocksEnd) {
        long expect = 0;
        for (int i = 0; i < logical.length; i++) {
            int p = base + i * MAP_ENTRY;
            logical[i] = m.getLong(p);
            physical[i] = m.getLong(p + 8);
            recLen[i] = m.getInt(p + 16);
            rawLen[i] = m.getInt(p + 20);
            if (logical[i] != expect || physical[i] < 0 || recLen[i] < HEADER_LEN || physical[i] + recLen[i] > blocksEnd) {
                throw corrupt(mapOff + (long) i * MAP_ENTRY, "block map entry " + i + " is inconsistent");
            }
            expect += rawLen[i];
        }
        if (expect != logicalSize) throw corrupt(mapOff, "block map does not add up to the logical size");
    }

    /** The key section ({@code key_id_len u16 | key_id | wrapped_len u16 | wrapped | crc32c}) unwrapped with the KEK. */
    private SecretKeySpec unwrap(byte[] sec, int len, long keyOff, Kek kek) {
        if (len < 8 || crc(sec, 0, len - 4) != le(sec).getInt(len - 4)) throw corrupt(keyOff, "key section checksum mismatch");
        ByteBuffer b = le(sec);
        int klen = b.getShort(0) & 0xffff;
        int wlen = 4 + klen <= len ? b.getShort(2 + klen) & 0xffff : -1;
        if (wlen < 0 || 4 + klen + wlen > len - 4) throw corrupt(keyOff, "key section lengths are inconsistent");
        String keyId = new String(sec, 2, klen, StandardCharsets.US_ASCII);
        if (kek == null) {
            throw new BridgeException(where + " is encrypted (key id " + keyId + "): give option key_file (the node's "
                    + "security.encryption_key_file, readable on every executor)");
        }
        return kek.unwrap(Arrays.copyOfRange(sec, 4 + klen, 4 + klen + wlen), keyId, inode, where);
    }

    public String where() {
        return where;
    }

    public long logicalSize() {
        return logicalSize;
    }

    public StepNanos nanos() {
        return nanos;
    }

    /** Logical bytes {@code [lo, hi)}: one ranged read of the blocks they touch, each verified and decoded. */
    public byte[] read(long lo, long hi) throws IOException {
        if (lo < 0 || hi > logicalSize || lo > hi) throw corrupt(lo, "read past the logical end " + logicalSize);
        byte[] out = new byte[(int) (hi - lo)];
        if (hi == lo) return out;
        int first = block(lo);
        int last = block(hi - 1);
        long start = physical[first];
        long t0 = System.nanoTime();
        byte[] raw = src.read(start, (int) (physical[last] + recLen[last] - start));
        nanos.fetch += System.nanoTime() - t0;
        for (int i = first; i <= last; i++) {
            long bLo = logical[i];
            if (bLo >= lo && bLo + rawLen[i] <= hi) { // a whole block: decoded straight into place
                decode(raw, (int) (physical[i] - start), i, out, (int) (bLo - lo));
                continue;
            }
            byte[] data = decode(raw, (int) (physical[i] - start), i, null, 0);
            int from = (int) Math.max(lo - bLo, 0);
            int to = (int) Math.min(hi - bLo, data.length);
            System.arraycopy(data, from, out, (int) (bLo + from - lo), to - from);
        }
        return out;
    }

    private int block(long off) {
        int i = Arrays.binarySearch(logical, off);
        if (i < 0) i = -i - 2;
        while (i + 1 < logical.length && logical[i + 1] <= off && rawLen[i] == 0) i++;
        return i;
    }

    /** One block record at {@code raw[pos:]}, checked against map entry {@code i}: its logical bytes, or
     * (with {@code dst}) written to {@code dst[dstOff:]} and null. */
    private byte[] decode(byte[] raw, int pos, int i, byte[] dst, int dstOff) {
        long phys = physical[i];
        long t0 = System.nanoTime();
        if (pos + HEADER_LEN > raw.length) throw corrupt(phys, "truncated block header");
        ByteBuffer h = ByteBuffer.wrap(raw, pos, HEADER_LEN).slice().order(ByteOrder.LITTLE_ENDIAN);
        if (h.getInt(0) != BLOCK_MAGIC) throw corrupt(phys, String.format("bad block magic %#010x", h.getInt(0)));
        if (crc(raw, pos, 32) != h.getInt(32)) throw corrupt(phys, "block header checksum mismatch");
        if (h.get(4) != 1) throw corrupt(phys, "unsupported block version " + h.get(4));
        int flags = h.get(5) & 0xff;
        if ((flags & ~0x0F) != 0) throw corrupt(phys, String.format("unknown block flags %#04x", flags));
        int slen = h.getInt(20);
        int rlen = h.getInt(24);
        if (rlen < 0 || rlen > MAX_BLOCK_SIZE || slen < 0 || slen > MAX_BLOCK_SIZE + 1024) {
            throw corrupt(phys, "block length out of range (" + slen + "/" + rlen + ")");
        }
        if (HEADER_LEN + slen != recLen[i] || pos + recLen[i] > raw.length) throw corrupt(phys, "truncated block payload");
        int p0 = pos + HEADER_LEN;
        if (crc(raw, p0, slen) != h.getInt(28)) throw corrupt(phys, "block payload checksum mismatch");
        if (h.getLong(8) != logical[i] || rlen != rawLen[i]) throw corrupt(phys, "block does not match the block map");
        long t1 = System.nanoTime();
        nanos.verify += t1 - t0;
        if ((flags & F_PAD) != 0) return dst != null ? null : new byte[0];
        byte[] data = raw;
        int off = p0;
        int len = slen;
        if ((flags & F_AESGCM) != 0) {
            data = decrypt(raw, pos, slen, phys);
            off = 0;
            len = data.length;
        }
        long t2 = System.nanoTime();
        nanos.decrypt += t2 - t1;
        if ((flags & F_ZSTD) != 0) {
            byte[] out = dst != null ? dst : new byte[rlen];
            long n;
            try {
                n = zstd.decompressByteArray(out, dst != null ? dstOff : 0, rlen, data, off, len);
            } catch (RuntimeException e) {
                throw corrupt(phys, "zstd: " + e.getMessage());
            }
            if (n != rlen) throw corrupt(phys, "block holds " + n + " bytes, header says " + rlen);
            nanos.decompress += System.nanoTime() - t2;
            return dst != null ? null : out;
        }
        if (len != rlen) throw corrupt(phys, "block holds " + len + " bytes, header says " + rlen);
        if (dst != null) {
            System.arraycopy(data, off, dst, dstOff, len);
            return null;
        }
        return data == raw ? Arrays.copyOfRange(raw, p0, p0 + slen) : data;
    }

    /** payload = nonce (12) | ciphertext | tag (16); associated data = header bytes 0..27 | inode u32. */
    private byte[] decrypt(byte[] raw, int pos, int slen, long phys) {
        if (dataKey == null) {
            throw new BridgeException(where + ": block at offset " + phys + " is encrypted and the object has no key section");
        }
        try {
            Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
            int p0 = pos + HEADER_LEN;
            c.init(Cipher.DECRYPT_MODE, dataKey, new GCMParameterSpec(128, raw, p0, Kek.NONCE_LEN));
            c.updateAAD(raw, pos, AAD_LEN);
            c.updateAAD(le(new byte[4]).putInt(0, inode).array());
            return c.doFinal(raw, p0 + Kek.NONCE_LEN, slen - Kek.NONCE_LEN);
        } catch (GeneralSecurityException e) {
            throw new BridgeException(where + ": block at offset " + phys + " does not decrypt (wrong key or block moved)", e);
        }
    }

    CorruptObjectException corrupt(long offset, String what) {
        return new CorruptObjectException(where, offset, what);
    }

    public static ByteBuffer le(byte[] b) {
        return ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
    }

    static int crc(byte[] b, int off, int len) {
        CRC32C c = new CRC32C();
        c.update(b, off, len);
        return (int) c.getValue();
    }

    @Override
    public void close() throws IOException {
        zstd.close();
        src.close();
    }
}
