package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kind;
import io.terrascale.spark.format.RowDecoder;
import io.terrascale.spark.format.RowLayout;
import java.math.BigInteger;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/** Row fields into Spark column vectors of the read's Spark types (docs/spark.md, "Types"). One per reading thread. */
final class VectorWriter {
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);
    private static final BigInteger TWO_64 = BigInteger.ONE.shiftLeft(64);

    private final RowDecoder dec;
    private final byte[] uuid = new byte[36];

    VectorWriter(RowDecoder dec) {
        this.dec = dec;
    }

    /** Writes decoded column {@code j} of the row at {@code r} into {@code v} at {@code i}. */
    void put(ByteBuffer b, int r, RowLayout l, int j, WritableColumnVector v, int i) {
        Column c = dec.want().get(j);
        if (dec.isNull(b, r, l, j)) {
            v.putNull(i);
            if (c.kind() == Kind.POINT || c.kind() == Kind.BOX || c.kind() == Kind.RANGE) {
                for (int k = 0; k < (c.kind() == Kind.POINT ? 2 : 4); k++) v.getChild(k).putNull(i);
            }
            return;
        }
        v.putNotNull(i);
        int a = dec.at(r, l, j);
        switch (c.kind()) {
            case INT8: v.putByte(i, b.get(a)); break;
            case INT16: v.putShort(i, b.getShort(a)); break;
            case INT32: case DATE: v.putInt(i, b.getInt(a)); break;
            case INT64: case TIMESTAMP: v.putLong(i, b.getLong(a)); break;
            case UINT8: v.putShort(i, (short) (b.get(a) & 0xff)); break;
            case UINT16: v.putInt(i, b.getShort(a) & 0xffff); break;
            case UINT32: v.putLong(i, b.getInt(a) & 0xffffffffL); break;
            case UINT64: v.putByteArray(i, unsignedDecimal(b.getLong(a))); break;
            case FLOAT32: v.putFloat(i, b.getFloat(a)); break;
            case FLOAT64: v.putDouble(i, b.getDouble(a)); break;
            case BOOL: v.putBoolean(i, b.get(a) != 0); break;
            case STRING: case BINARY: case JSON: v.putByteArray(i, b.array(), dec.varStart(b, r, l, j), dec.varLen(b, r, l, j)); break;
            case UUID: v.putByteArray(i, uuidText(b.array(), a), 0, 36); break;
            case POINT: case BOX:
                for (int k = 0; k < (c.kind() == Kind.POINT ? 2 : 4); k++) v.getChild(k).putDouble(i, b.getDouble(a + 8 * k));
                break;
            case RANGE: putRange(b, a, c.elem(), v, i); break;
            default: throw new IllegalStateException(c.kind().toString());
        }
    }

    /** decimal(20, 0): the unscaled value's two's complement bytes. */
    static byte[] unsignedDecimal(long u) {
        BigInteger bi = BigInteger.valueOf(u);
        return (u < 0 ? bi.add(TWO_64) : bi).toByteArray();
    }

    /** Canonical lowercase 8-4-4-4-12 text of the 16 bytes at {@code a}, into a reused buffer. */
    private byte[] uuidText(byte[] arr, int a) {
        int o = 0;
        for (int k = 0; k < 16; k++) {
            if (k == 4 || k == 6 || k == 8 || k == 10) uuid[o++] = '-';
            uuid[o++] = HEX[(arr[a + k] >> 4) & 15];
            uuid[o++] = HEX[arr[a + k] & 15];
        }
        return uuid;
    }

    /** lower | upper (8 bytes each) | flags: LOWER_INC 1, UPPER_INC 2, LOWER_UNB 4, UPPER_UNB 8 (a null bound). */
    private static void putRange(ByteBuffer b, int a, Kind elem, WritableColumnVector v, int i) {
        int flags = b.get(a + 16);
        for (int k = 0; k < 2; k++) {
            WritableColumnVector e = v.getChild(k);
            if ((flags & (k == 0 ? 4 : 8)) != 0) e.putNull(i);
            else if (elem == Kind.FLOAT64) e.putDouble(i, b.getDouble(a + 8 * k));
            else e.putLong(i, b.getLong(a + 8 * k));
        }
        v.getChild(2).putBoolean(i, (flags & 1) != 0);
        v.getChild(3).putBoolean(i, (flags & 2) != 0);
    }
}
