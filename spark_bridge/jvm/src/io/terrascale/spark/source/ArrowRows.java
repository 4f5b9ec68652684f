package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kind;
import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVector;
import org.apache.arrow.vector.DateDayVector;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.FixedSizeBinaryVector;
import org.apache.arrow.vector.Float4Vector;
import org.apache.arrow.vector.Float8Vector;
import org.apache.arrow.vector.IntVector;
import org.apache.arrow.vector.LargeVarBinaryVector;
import org.apache.arrow.vector.LargeVarCharVector;
import org.apache.arrow.vector.SmallIntVector;
import org.apache.arrow.vector.TimeStampVector;
import org.apache.arrow.vector.TinyIntVector;
import org.apache.arrow.vector.UInt1Vector;
import org.apache.arrow.vector.UInt2Vector;
import org.apache.arrow.vector.UInt4Vector;
import org.apache.arrow.vector.UInt8Vector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.complex.StructVector;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A tail ({@code POST /v1/tables/{t}/tail}: an Arrow IPC stream in the engine's Arrow types) as
 * Spark column batches of the read's Spark types. Tails are the small, unsealed part of a
 * snapshot; values are copied one by one.
 */
final class ArrowRows {
    private ArrowRows() {}

    static List<ColumnarBatch> read(byte[] stream, List<Column> cols, StructType schema) throws IOException {
        List<ColumnarBatch> out = new ArrayList<>();
        try (BufferAllocator alloc = new RootAllocator(Long.MAX_VALUE);
             ArrowStreamReader r = new ArrowStreamReader(new ByteArrayInputStream(stream), alloc)) {
            VectorSchemaRoot root = r.getVectorSchemaRoot();
            while (r.loadNextBatch()) {
                int n = root.getRowCount();
                if (n == 0) continue;
                OnHeapColumnVector[] vs = OnHeapColumnVector.allocateColumns(n, schema);
                for (int j = 0; j < cols.size(); j++) {
                    FieldVector src = root.getVector(cols.get(j).name());
                    if (src == null) throw new BridgeException("the node's tail has no column " + cols.get(j).name());
                    for (int i = 0; i < n; i++) copy(src, cols.get(j), vs[j], i);
                }
                out.add(new ColumnarBatch(Arrays.copyOf(vs, vs.length, ColumnVector[].class), n));
            }
        }
        return out;
    }

    /** The rows of a tail stream. */
    static long count(byte[] stream) throws IOException {
        long n = 0;
        try (BufferAllocator alloc = new RootAllocator(Long.MAX_VALUE);
             ArrowStreamReader r = new ArrowStreamReader(new ByteArrayInputStream(stream), alloc)) {
            while (r.loadNextBatch()) n += r.getVectorSchemaRoot().getRowCount();
        }
        return n;
    }

    private static void copy(FieldVector src, Column c, WritableColumnVector v, int i) {
        if (src.isNull(i)) {
            v.putNull(i);
            if (src instanceof StructVector) {
                for (int k = 0; k < ((StructVector) src).size(); k++) v.getChild(k).putNull(i);
            }
            return;
        }
        switch (c.kind()) {
            case INT8: v.putByte(i, ((TinyIntVector) src).get(i)); break;
            case INT16: v.putShort(i, ((SmallIntVector) src).get(i)); break;
            case INT32: v.putInt(i, ((IntVector) src).get(i)); break;
            case INT64: v.putLong(i, ((BigIntVector) src).get(i)); break;
            case UINT8: v.putShort(i, (short) (((UInt1Vector) src).get(i) & 0xff)); break;
            case UINT16: v.putInt(i, ((UInt2Vector) src).get(i)); break;
            case UINT32: v.putLong(i, ((UInt4Vector) src).get(i) & 0xffffffffL); break;
            case UINT64: v.putByteArray(i, VectorWriter.unsignedDecimal(((UInt8Vector) src).get(i))); break;
            case FLOAT32: v.putFloat(i, ((Float4Vector) src).get(i)); break;
            case FLOAT64: v.putDouble(i, ((Float8Vector) src).get(i)); break;
            case BOOL: v.putBoolean(i, ((BitVector) src).get(i) != 0); break;
            case TIMESTAMP: v.putLong(i, ((TimeStampVector) src).get(i)); break;
            case DATE: v.putInt(i, ((DateDayVector) src).get(i)); break;
            case STRING: case JSON: case BINARY: {
                byte[] b = src instanceof VarCharVector ? ((VarCharVector) src).get(i)
                        : src instanceof VarBinaryVector ? ((VarBinaryVector) src).get(i)
                        : src instanceof LargeVarCharVector ? ((LargeVarCharVector) src).get(i)
                        : ((LargeVarBinaryVector) src).get(i);
                v.putByteArray(i, b);
                break;
            }
            case UUID: {
                byte[] b = ((FixedSizeBinaryVector) src).get(i);
                v.putByteArray(i, uuidText(b));
                break;
            }
            case POINT: case BOX: {
                StructVector s = (StructVector) src;
                for (int k = 0; k < s.size(); k++) {
                    Float8Vector f = (Float8Vector) s.getChildByOrdinal(k);
                    if (f.isNull(i)) v.getChild(k).putNull(i); else v.getChild(k).putDouble(i, f.get(i));
                }
                break;
            }
            case RANGE: {
                StructVector s = (StructVector) src;
                for (int k = 0; k < 2; k++) {
                    FieldVector e = (FieldVector) s.getChildByOrdinal(k);
                    WritableColumnVector d = v.getChild(k);
                    if (e.isNull(i)) d.putNull(i);
                    else if (c.elem() == Kind.FLOAT64) d.putDouble(i, ((Float8Vector) e).get(i));
                    else if (c.elem() == Kind.TIMESTAMP) d.putLong(i, ((TimeStampVector) e).get(i));
                    else d.putLong(i, ((BigIntVector) e).get(i));
                }
                for (int k = 2; k < 4; k++) {
                    BitVector e = (BitVector) s.getChildByOrdinal(k);
                    if (e.isNull(i)) v.getChild(k).putNull(i); else v.getChild(k).putBoolean(i, e.get(i) != 0);
                }
                break;
            }
            default: throw new IllegalStateException(c.kind().toString());
        }
    }

    static byte[] uuidText(byte[] b) {
        String h = String.format("%032x", new BigInteger(1, b));
        return (h.substring(0, 8) + "-" + h.substring(8, 12) + "-" + h.substring(12, 16) + "-" + h.substring(16, 20) + "-"
                + h.substring(20)).getBytes(java.nio.charset.StandardCharsets.US_ASCII);
    }
}
