package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kind;
import io.terrascale.spark.format.Schema;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.MetadataBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** Column types as Spark types (docs/spark.md, "Types": the same mapping as spark_bridge/types.py). */
final class SparkTypes {
    private SparkTypes() {}

    static DataType scalar(Kind k) {
        switch (k) {
            case INT8: return DataTypes.ByteType;
            case INT16: case UINT8: return DataTypes.ShortType;
            case INT32: case UINT16: return DataTypes.IntegerType;
            case INT64: case UINT32: return DataTypes.LongType;
            case UINT64: return DataTypes.createDecimalType(20, 0);
            case FLOAT32: return DataTypes.FloatType;
            case FLOAT64: return DataTypes.DoubleType;
            case BOOL: return DataTypes.BooleanType;
            case STRING: case UUID: case JSON: return DataTypes.StringType;
            case BINARY: return DataTypes.BinaryType;
            case TIMESTAMP: return DataTypes.TimestampType;
            case DATE: return DataTypes.DateType;
            default: throw new IllegalArgumentException(k.toString());
        }
    }

    static DataType sparkType(Column c) {
        switch (c.kind()) {
            case POINT:
                return new StructType().add("x", DataTypes.DoubleType).add("y", DataTypes.DoubleType);
            case BOX:
                return new StructType().add("xmin", DataTypes.DoubleType).add("ymin", DataTypes.DoubleType)
                        .add("xmax", DataTypes.DoubleType).add("ymax", DataTypes.DoubleType);
            case RANGE: {
                DataType e = scalar(c.elem());
                return new StructType().add("lower", e).add("upper", e)
                        .add("lower_inclusive", DataTypes.BooleanType).add("upper_inclusive", DataTypes.BooleanType);
            }
            default:
                return scalar(c.kind());
        }
    }

    static StructType sparkSchema(List<Column> cols) {
        StructField[] fs = new StructField[cols.size()];
        for (int i = 0; i < fs.length; i++) {
            Column c = cols.get(i);
            Metadata meta = new MetadataBuilder().putString("terrascale.type", c.type()).build();
            fs[i] = new StructField(c.name(), sparkType(c), c.nullable(), meta);
        }
        return new StructType(fs);
    }

    /** The columns {@code names} of {@code s} (case-insensitive, in that order), or all of them for null. */
    static List<Column> select(Schema s, List<String> names, String table) {
        if (names == null) return s.columns();
        List<Column> out = new ArrayList<>();
        for (String n : names) {
            Column c = s.byNameIgnoreCase(n);
            if (c == null) {
                List<String> all = new ArrayList<>();
                for (Column x : s.columns()) all.add(x.name());
                throw new BridgeException("option columns: table '" + table + "' has no column '" + n
                        + "' at this snapshot (its columns: " + String.join(", ", all) + ")");
            }
            out.add(c);
        }
        return List.copyOf(out);
    }
}
