package io.terrascale.spark.source;

import io.terrascale.spark.format.ColumnData;
import io.terrascale.spark.format.Kind;
import java.nio.charset.StandardCharsets;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;

/** Decoded column values into Spark column vectors of the read's Spark types (docs/spark.md, "Types"), as {@link VectorWriter} does from row bytes. */
final class ColumnWriter {
    private static final byte[] HEX = "0123456789abcdef".getBytes(StandardCharsets.US_ASCII);
    private final byte[] uuid = new byte[36];

    /**
     * Writes rows {@code sel[0..m)} of {@code c} into {@code v} from {@code at} on: the common
     * kinds in one loop each (a run of consecutive rows of a column without nulls in one copy).
     */
    void putMany(ColumnData c, int[] sel, int m, WritableColumnVector v, int at) {
        if (m == 0) return;
        boolean run = sel[m - 1] - sel[0] == m - 1;
        if (c.valid == null) {
            switch (c.kind) {
                case INT64: case TIMESTAMP: case UINT32:
                    if (run) v.putLongs(at, m, c.ints[0], sel[0]);
                    else for (int i = 0; i < m; i++) v.putLong(at + i, c.ints[0][sel[i]]);
                    return;
                case FLOAT64:
                    if (run) v.putDoubles(at, m, c.reals[0], sel[0]);
                    else for (int i = 0; i < m; i++) v.putDouble(at + i, c.reals[0][sel[i]]);
                    return;
                case INT32: case DATE: case UINT16:
                    for (int i = 0; i < m; i++) v.putInt(at + i, (int) c.ints[0][sel[i]]);
                    return;
                case FLOAT32:
                    for (int i = 0; i < m; i++) v.putFloat(at + i, (float) c.reals[0][sel[i]]);
                    return;
                case STRING: case BINARY: case JSON:
                    for (int i = 0; i < m; i++) v.putByteArray(at + i, c.data, c.starts[sel[i]], c.lens[sel[i]]);
                    return;
                default:
                    break;
            }
        }
        for (int i = 0; i < m; i++) put(c, sel[i], v, at + i);
    }

    /** Writes row {@code k} of {@code c} into {@code v} at {@code i}. */
    void put(ColumnData c, int k, WritableColumnVector v, int i) {
        if (c.isNull(k)) {
            v.putNull(i);
            if (c.kind == Kind.POINT || c.kind == Kind.BOX || c.kind == Kind.RANGE) {
                for (int x = 0; x < (c.kind == Kind.POINT ? 2 : 4); x++) v.getChild(x).putNull(i);
            }
            return;
        }
        v.putNotNull(i);
        switch (c.kind) {
            case INT8: v.putByte(i, (byte) c.ints[0][k]); break;
            case INT16: case UINT8: v.putShort(i, (short) c.ints[0][k]); break;
            case INT32: case DATE: case UINT16: v.putInt(i, (int) c.ints[0][k]); break;
            case INT64: case TIMESTAMP: case UINT32: v.putLong(i, c.ints[0][k]); break;
            case UINT64: v.putByteArray(i, VectorWriter.unsignedDecimal(c.ints[0][k])); break;
            case FLOAT32: v.putFloat(i, (float) c.reals[0][k]); break;
            case FLOAT64: v.putDouble(i, c.reals[0][k]); break;
            case BOOL: v.putBoolean(i, c.bools[k]); break;
            case STRING: case BINARY: case JSON: v.putByteArray(i, c.data, c.starts[k], c.lens[k]); break;
            case UUID: v.putByteArray(i, uuidText(c.data, c.starts[k]), 0, 36); break;
            case POINT: case BOX:
                for (int x = 0; x < (c.kind == Kind.POINT ? 2 : 4); x++) v.getChild(x).putDouble(i, c.reals[x][k]);
                break;
            case RANGE: putRange(c, k, v, i); break;
            default: throw new IllegalStateException(c.kind.toString());
        }
    }

    private byte[] uuidText(byte[] arr, int a) {
        int o = 0;
        for (int x = 0; x < 16; x++) {
            if (x == 4 || x == 6 || x == 8 || x == 10) uuid[o++] = '-';
            uuid[o++] = HEX[(arr[a + x] >> 4) & 15];
            uuid[o++] = HEX[arr[a + x] & 15];
        }
        return uuid;
    }

    /** lower | upper | flags: LOWER_INC 1, UPPER_INC 2, LOWER_UNB 4, UPPER_UNB 8 (a null bound). */
    private static void putRange(ColumnData c, int k, WritableColumnVector v, int i) {
        int flags = (int) c.ints[c.ints.length - 1][k];
        for (int x = 0; x < 2; x++) {
            WritableColumnVector e = v.getChild(x);
            if ((flags & (x == 0 ? 4 : 8)) != 0) e.putNull(i);
            else if (c.elem == Kind.FLOAT64) e.putDouble(i, c.reals[x][k]);
            else e.putLong(i, c.ints[x][k]);
        }
        v.getChild(2).putBoolean(i, (flags & 1) != 0);
        v.getChild(3).putBoolean(i, (flags & 2) != 0);
    }
}
