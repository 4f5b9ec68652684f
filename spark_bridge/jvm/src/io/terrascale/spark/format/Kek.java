package io.terrascale.spark.format;

import io.terrascale.spark.BridgeException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.util.HexFormat;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

/**
 * A node's key-encryption key (terrafs/crypto.py): it unwraps the data key a sealed object keeps
 * in its key section (docs/format/terrafs.md §3). Loaded from option {@code key_file}, the node's
 * {@code security.encryption_key_file}.
 */
public final class Kek {
    static final byte[] WRAP_AAD = "TRFS-DEK".getBytes(StandardCharsets.US_ASCII); // part of the format
    static final int NONCE_LEN = 12; // part of the format

    private final byte[] key;
    private final String id;

    public Kek(byte[] key) {
        if (key.length != 32) throw new BridgeException("an encryption key is 32 bytes, not " + key.length);
        this.key = key.clone();
        this.id = keyId(key);
    }

    /** A key file holding 32 raw bytes or 64 hex characters (terrafs/crypto.py ``KeyEncryptionKey.load``). */
    public static Kek load(String path) {
        byte[] raw;
        try {
            raw = Files.readAllBytes(Paths.get(path));
        } catch (IOException e) {
            throw new BridgeException("option key_file: cannot read " + path + ": " + e.getMessage(), e);
        }
        String text = new String(raw, StandardCharsets.ISO_8859_1).trim();
        if (text.matches("[0-9a-fA-F]{64}")) return new Kek(HexFormat.of().parseHex(text));
        if (raw.length == 32) return new Kek(raw);
        throw new BridgeException("option key_file: " + path + " must hold 32 raw bytes or 64 hex chars");
    }

    /** The first 16 hex digits of sha256("terrascale-kek" + key): what a key section names its KEK by. */
    public String id() {
        return id;
    }

    private static String keyId(byte[] key) {
        try {
            MessageDigest d = MessageDigest.getInstance("SHA-256");
            d.update("terrascale-kek".getBytes(StandardCharsets.US_ASCII));
            return HexFormat.of().formatHex(d.digest(key), 0, 8);
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("every JVM has SHA-256", e);
        }
    }

    /** The data key of the object {@code where}: {@code wrapped} = nonce | ciphertext | tag, bound to the inode. */
    SecretKeySpec unwrap(byte[] wrapped, String keyId, int inode, String where) {
        if (!id.equals(keyId)) {
            throw new BridgeException(where + " is encrypted with key id " + keyId + "; option key_file holds key " + id);
        }
        try {
            Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
            c.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(128, wrapped, 0, NONCE_LEN));
            c.updateAAD(WRAP_AAD);
            c.updateAAD(ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN).putInt(0, inode).array());
            return new SecretKeySpec(c.doFinal(wrapped, NONCE_LEN, wrapped.length - NONCE_LEN), "AES");
        } catch (GeneralSecurityException e) {
            throw new BridgeException(where + ": data key does not unwrap with key " + keyId, e);
        }
    }

    @Override
    public String toString() {
        return "Kek[" + id + "]"; // never the key
    }
}
