package io.terrascale.spark.format;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.terrascale.spark.BridgeException;
import io.terrascale.spark.CorruptObjectException;
import io.terrascale.spark.Golden;
import java.io.IOException;
import java.util.Arrays;
import java.util.Base64;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Sealed objects (docs/format/terrafs.md §1, §3) the Python writer wrote: stored, zstd and
 * encrypted objects of the same rows hold the same logical bytes; every damage the format can
 * see is refused with the object, the offset and the check that failed.
 */
class SealedObjectTest {
    static SealedObject open(String name, byte[] raw, Kek kek, byte[] dataKey) throws IOException {
        return new SealedObject(Golden.where(name), new Golden.Bytes(raw), raw.length, kek, dataKey);
    }

    static SealedObject open(String name) throws IOException {
        return open(name, Golden.bytes(name), Kek.load(Golden.kekFile()), null);
    }

    private static byte[] rowsOf(SealedObject o) throws IOException {
        return o.read(0, o.logicalSize() - Segment.FOOTER_LEN); // the segment's footer names its segid: it differs
    }

    @Test
    void storedZstdAndEncryptedObjectsHoldTheSameLogicalBytes() throws IOException {
        byte[] stored;
        try (SealedObject s = open("stored.obj")) {
            stored = rowsOf(s);
        }
        for (String name : new String[] {"zstd.obj", "encrypted.obj"}) {
            try (SealedObject o = open(name)) {
                assertArrayEquals(stored, rowsOf(o), name);
                assertTrue(o.nanos().decompress() > 0, name + ": its blocks are zstd");
            }
        }
        assertTrue(stored.length > 4 * 4096, "the golden rows span several blocks");
    }

    @Test
    void rangesThatStartAndEndInsideBlocksEqualTheWhole() throws IOException {
        try (SealedObject o = open("zstd.obj")) {
            byte[] all = o.read(0, o.logicalSize());
            long[][] ranges = {{0, 1}, {4095, 4097}, {100, 9000}, {8192, 8192}, {o.logicalSize() - 7, o.logicalSize()}};
            for (long[] r : ranges) {
                assertArrayEquals(Arrays.copyOfRange(all, (int) r[0], (int) r[1]), o.read(r[0], r[1]), Arrays.toString(r));
            }
            CorruptObjectException e = assertThrows(CorruptObjectException.class, () -> o.read(10, o.logicalSize() + 1));
            assertTrue(e.getMessage().contains("read past the logical end"), e.getMessage());
        }
    }

    @Test
    void theGoldenCorruptObjectIsRefusedNamingItsBlock() throws IOException {
        JsonNode err = Golden.object("corrupt.obj").get("error");
        try (SealedObject o = open("corrupt.obj")) { // footer, map and the segment's index are intact
            CorruptObjectException e = assertThrows(CorruptObjectException.class, () -> o.read(0, o.logicalSize()));
            assertEquals("corrupt object " + Golden.where("corrupt.obj") + " at offset " + err.get("offset").asLong() + ": "
                    + err.get("what").asText(), e.getMessage());
        }
    }

    /** A copy of stored.obj with {@code raw[at] ^= 0x10}, opened and read whole: the message. */
    private static String damaged(String name, int at, Kek kek) {
        byte[] raw = Golden.bytes(name);
        raw[at < 0 ? raw.length + at : at] ^= 0x10;
        BridgeException e = assertThrows(BridgeException.class, () -> {
            try (SealedObject o = open(name, raw, kek, null)) {
                o.read(0, o.logicalSize());
            }
        });
        return e.getMessage();
    }

    private static long footerLong(byte[] raw, int at) {
        return SealedObject.le(raw).getLong(raw.length - SealedObject.FOOTER_LEN + at);
    }

    @ParameterizedTest
    @ValueSource(ints = {-96, -50, -5})
    void aFlippedFooterByteIsRefused(int at) {
        byte[] raw = Golden.bytes("stored.obj");
        String msg = damaged("stored.obj", at, null);
        long footer = raw.length - SealedObject.FOOTER_LEN;
        String what = at == -96 ? "bad sealed-file magic" : "footer checksum mismatch";
        assertEquals("corrupt object " + Golden.where("stored.obj") + " at offset " + footer + ": " + what, msg);
    }

    @Test
    void aFlippedBlockMapByteIsRefused() {
        byte[] raw = Golden.bytes("stored.obj");
        long mapOff = footerLong(raw, 32);
        assertEquals("corrupt object " + Golden.where("stored.obj") + " at offset " + mapOff + ": block map checksum mismatch",
                damaged("stored.obj", (int) mapOff + 30, null));
    }

    @Test
    void aFlippedBlockHeaderByteIsRefused() {
        // the first block starts the object; its header's byte 10 is part of its logical offset
        assertEquals("corrupt object " + Golden.where("stored.obj") + " at offset 0: block header checksum mismatch",
                damaged("stored.obj", 10, null));
    }

    @Test
    void aFlippedKeySectionByteIsRefused() {
        byte[] raw = Golden.bytes("encrypted.obj");
        long keyOff = footerLong(raw, 48);
        assertEquals("corrupt object " + Golden.where("encrypted.obj") + " at offset " + keyOff + ": key section checksum mismatch",
                damaged("encrypted.obj", (int) keyOff + 3, Kek.load(Golden.kekFile())));
    }

    @Test
    void aFlippedByteInsideAnEncryptedBlockIsRefusedByItsChecksum() {
        byte[] raw = Golden.bytes("encrypted.obj");
        long third = SealedObject.le(raw).getLong((int) footerLong(raw, 32) + 2 * SealedObject.MAP_ENTRY + 8); // its physical offset
        assertEquals("corrupt object " + Golden.where("encrypted.obj") + " at offset " + third + ": block payload checksum mismatch",
                damaged("encrypted.obj", (int) third + SealedObject.HEADER_LEN + 20, Kek.load(Golden.kekFile())));
    }

    @Test
    void aTruncatedObjectIsRefused() {
        byte[] raw = Arrays.copyOf(Golden.bytes("stored.obj"), 50);
        CorruptObjectException e = assertThrows(CorruptObjectException.class, () -> open("stored.obj", raw, null, null));
        assertEquals("corrupt object " + Golden.where("stored.obj") + " at offset 0: object too short for a sealed-file footer",
                e.getMessage());
    }

    @Test
    void anEncryptedObjectOpensWithTheKekOrWithThePlansDataKey() throws IOException {
        JsonNode entry = Golden.object("encrypted.obj");
        byte[] raw = Golden.bytes("encrypted.obj");
        byte[] viaKek;
        try (SealedObject o = open("encrypted.obj", raw, Kek.load(Golden.kekFile()), null)) {
            viaKek = rowsOf(o);
        }
        try (SealedObject o = open("encrypted.obj", raw, null, Base64.getDecoder().decode(entry.get("data_key").asText()))) {
            assertArrayEquals(viaKek, rowsOf(o));
        }
        assertEquals(entry.get("key_id").asText(), Kek.load(Golden.kekFile()).id());
    }

    @Test
    void aMissingOrWrongKeyIsNamed() {
        byte[] raw = Golden.bytes("encrypted.obj");
        String keyId = Golden.object("encrypted.obj").get("key_id").asText();
        BridgeException none = assertThrows(BridgeException.class, () -> open("encrypted.obj", raw, null, null));
        assertEquals(Golden.where("encrypted.obj") + " is encrypted (key id " + keyId + "): give option key_file (the node's "
                + "security.encryption_key_file, readable on every executor)", none.getMessage());
        Kek other = new Kek(new byte[32]);
        BridgeException wrong = assertThrows(BridgeException.class, () -> open("encrypted.obj", raw, other, null));
        assertEquals(Golden.where("encrypted.obj") + " is encrypted with key id " + keyId + "; option key_file holds key "
                + other.id(), wrong.getMessage());
        BridgeException badKey = assertThrows(BridgeException.class, () -> {
            try (SealedObject o = open("encrypted.obj", raw, null, new byte[32])) {
                o.read(0, o.logicalSize());
            }
        });
        assertTrue(badKey.getMessage().endsWith("does not decrypt (wrong key or block moved)"), badKey.getMessage());
    }

    @Test
    void theKeyFileHoldsHexOrRawBytes() throws IOException {
        java.nio.file.Path raw = java.nio.file.Files.createTempFile("kek", ".bin");
        try {
            byte[] key = new byte[32];
            Arrays.fill(key, (byte) 7);
            java.nio.file.Files.write(raw, key);
            assertEquals(new Kek(key).id(), Kek.load(raw.toString()).id());
            java.nio.file.Files.writeString(raw, "abc");
            BridgeException e = assertThrows(BridgeException.class, () -> Kek.load(raw.toString()));
            assertTrue(e.getMessage().endsWith("must hold 32 raw bytes or 64 hex chars"), e.getMessage());
        } finally {
            java.nio.file.Files.delete(raw);
        }
    }
}
