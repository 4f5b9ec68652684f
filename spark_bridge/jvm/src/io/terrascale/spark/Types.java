package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.MetadataBuilder;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The column types (docs/REFERENCE.md §4), their fixed-width row storage
 * (docs/format/segment.md §1) and their Spark types (docs/spark.md, "Types": the same
 * mapping as spark_bridge/types.py).
 */
final class Types {
    private Types() {}

    static final ObjectMapper JSON = com.fasterxml.jackson.databind.json.JsonMapper.builder()
            .enable(com.fasterxml.jackson.core.json.JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS).build();

    enum Kind {
        INT8(1), INT16(2), INT32(4), INT64(8), UINT8(1), UINT16(2), UINT32(4), UINT64(8),
        FLOAT32(4), FLOAT64(8), BOOL(1), STRING(-1), BINARY(-1), TIMESTAMP(8), DATE(4), UUID(16),
        JSON(-1), POINT(16), BOX(32), RANGE(17);

        /** Bytes of the fixed-width storage; -1 for variable-width kinds. Part of the format. */
        final int width;

        Kind(int width) {
            this.width = width;
        }

        boolean variable() {
            return width < 0;
        }
    }

    /** One column of one schema version. */
    static final class Col implements Serializable {
        final int id;
        final String name;
        final String type; // the column type's text, e.g. "range<int64>"
        final Kind kind;
        final Kind elem; // range<elem>, else null
        final boolean nullable;

        Col(int id, String name, String type, boolean nullable) {
            this.id = id;
            this.name = name;
            this.type = type;
            this.nullable = nullable;
            String t = type.trim().toLowerCase(Locale.ROOT);
            if (t.startsWith("range<") && t.endsWith(">")) {
                this.kind = Kind.RANGE;
                this.elem = Kind.valueOf(t.substring(6, t.length() - 1).trim().toUpperCase(Locale.ROOT));
            } else {
                this.kind = Kind.valueOf(t.toUpperCase(Locale.ROOT));
                this.elem = null;
            }
        }
    }

    /** A schema version: its id and its columns in order (rows are laid out in this order). */
    static final class Schema implements Serializable {
        final int version;
        final int primaryKey;
        final List<Col> columns;

        Schema(int version, int primaryKey, List<Col> columns) {
            this.version = version;
            this.primaryKey = primaryKey;
            this.columns = columns;
        }

        static Schema parse(String text) {
            try {
                JsonNode d = JSON.readTree(text);
                List<Col> cols = new ArrayList<>();
                for (JsonNode c : d.get("columns")) {
                    cols.add(new Col(c.get("id").asInt(), c.get("name").asText(), c.get("type").asText(),
                            c.get("nullable").asBoolean()));
                }
                return new Schema(d.get("version").asInt(), d.get("primary_key").asInt(), cols);
            } catch (java.io.IOException e) {
                throw new BridgeException("the node sent a schema that is not JSON: " + e.getMessage(), e);
            }
        }

        Col byId(int id) {
            for (Col c : columns) {
                if (c.id == id) return c;
            }
            return null;
        }

        Col byName(String name) {
            for (Col c : columns) {
                if (c.name.equals(name)) return c;
            }
            return null;
        }

        Col byNameIgnoreCase(String name) {
            for (Col c : columns) {
                if (c.name.equalsIgnoreCase(name)) return c;
            }
            return null;
        }
    }

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

    static DataType sparkType(Col c) {
        switch (c.kind) {
            case POINT:
                return new StructType().add("x", DataTypes.DoubleType).add("y", DataTypes.DoubleType);
            case BOX:
                return new StructType().add("xmin", DataTypes.DoubleType).add("ymin", DataTypes.DoubleType)
                        .add("xmax", DataTypes.DoubleType).add("ymax", DataTypes.DoubleType);
            case RANGE: {
                DataType e = scalar(c.elem);
                return new StructType().add("lower", e).add("upper", e)
                        .add("lower_inclusive", DataTypes.BooleanType).add("upper_inclusive", DataTypes.BooleanType);
            }
            default:
                return scalar(c.kind);
        }
    }

    static StructField field(Col c) {
        Metadata meta = new MetadataBuilder().putString("terrascale.type", c.type).build();
        return new StructField(c.name, sparkType(c), c.nullable, meta);
    }

    static StructType sparkSchema(List<Col> cols) {
        StructField[] fs = new StructField[cols.size()];
        for (int i = 0; i < fs.length; i++) fs[i] = field(cols.get(i));
        return new StructType(fs);
    }

    /** The columns ``names`` (case-insensitive, in that order), or all for null. */
    static List<Col> select(Schema s, List<String> names, String table) {
        if (names == null) return new ArrayList<>(s.columns);
        List<Col> out = new ArrayList<>();
        for (String n : names) {
            Col c = s.byNameIgnoreCase(n);
            if (c == null) {
                StringBuilder all = new StringBuilder();
                for (Col x : s.columns) all.append(all.length() > 0 ? ", " : "").append(x.name);
                throw new BridgeException("option columns: " + table + " has no column '" + n
                        + "' at this snapshot (its columns: " + all + ")");
            }
            out.add(c);
        }
        return out;
    }
}
