package io.terrascale.spark.source;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.terrascale.spark.CorruptObjectException;
import io.terrascale.spark.Golden;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kek;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.format.SealedObject;
import io.terrascale.spark.node.Wire;
import java.io.IOException;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.types.BinaryType;
import org.apache.spark.sql.types.BooleanType;
import org.apache.spark.sql.types.ByteType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DateType;
import org.apache.spark.sql.types.DecimalType;
import org.apache.spark.sql.types.DoubleType;
import org.apache.spark.sql.types.FloatType;
import org.apache.spark.sql.types.IntegerType;
import org.apache.spark.sql.types.LongType;
import org.apache.spark.sql.types.ShortType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.types.TimestampType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/**
 * The rows the Python reader finds in the golden objects (the manifest's), found again by the
 * JVM reader's segment path — bitmap, row range, tombstones, schema versions, typed predicates —
 * into Spark column vectors of the Spark types of docs/spark.md "Types", value by value.
 */
class GoldenRowsTest {
    private static final ObjectMapper JSON = new ObjectMapper();

    @TestFactory
    Stream<DynamicTest> everyReadOfTheManifestFindsItsRows() {
        List<DynamicTest> tests = new ArrayList<>();
        List<Map.Entry<String, JsonNode>> objects = new ArrayList<>();
        Golden.manifest().get("objects").properties().forEach(objects::add);
        Golden.manifest().get("columnar_objects").properties().forEach(objects::add); // version 2: the same rows
        for (Map.Entry<String, JsonNode> e : objects) {
            for (JsonNode read : e.getValue().path("reads")) {
                tests.add(DynamicTest.dynamicTest(e.getKey() + ": " + read.get("name").asText(), () -> check(e.getKey(), e.getValue(), read)));
            }
        }
        assertTrue(tests.size() >= 30, "the manifest has " + tests.size() + " reads");
        return tests.stream();
    }

    private static void check(String name, JsonNode entry, JsonNode read) throws IOException {
        List<String> want = new ArrayList<>();
        for (JsonNode row : read.get("rows")) want.add(Golden.canonical(row));
        List<String> got = new ArrayList<>();
        for (JsonNode row : rows(name, entry, read, Kek.load(Golden.kekFile()), null)) got.add(Golden.canonical(row));
        assertEquals(want.size(), got.size(), "rows");
        for (int i = 0; i < want.size(); i++) assertEquals(want.get(i), got.get(i), "row " + i);
    }

    /** The rows of {@code read} through the segment path (either format), each as a JSON array in the target's column order. */
    static List<JsonNode> rows(String name, JsonNode entry, JsonNode read, Kek kek, byte[] dataKey) throws IOException {
        Schema target = Schema.parse(entry.get("schema").asText());
        List<Schema> versions = new ArrayList<>();
        for (JsonNode v : entry.get("versions")) versions.add(Schema.parse(v.asText()));
        Predicates preds = read.has("predicates") ? Wire.predicates(read.get("predicates"), target) : Predicates.NONE;
        byte[] raw = Golden.bytes(name);
        StructType schema = SparkTypes.sparkSchema(target.columns());
        List<JsonNode> out = new ArrayList<>();
        try (SealedObject obj = new SealedObject(Golden.where(name), new Golden.Bytes(raw), raw.length, kek, dataKey)) {
            SegmentSource rows = SegmentSource.open(obj, target.columns(), versions, preds,
                    Base64.getDecoder().decode(read.get("visible").asText()), read.path("first_row").asLong(0),
                    read.has("end_row") ? read.get("end_row").asLong() : Long.MAX_VALUE);
            OnHeapColumnVector[] vectors = OnHeapColumnVector.allocateColumns(16, schema); // small: many batches
            while (rows.more()) {
                for (OnHeapColumnVector v : vectors) v.reset();
                int n = rows.fill(vectors, 16);
                for (int i = 0; i < n; i++) {
                    List<JsonNode> row = new ArrayList<>();
                    for (int j = 0; j < vectors.length; j++) row.add(value(vectors[j], schema.fields()[j].dataType(), i));
                    out.add(JSON.valueToTree(row));
                }
            }
        }
        return out;
    }

    /** A Spark vector's value as the manifest writes it (golden.py: µs, days, base64, uuid text, structs as objects). */
    static JsonNode value(ColumnVector v, DataType t, int i) {
        JsonNodeFactory f = JsonNodeFactory.instance;
        if (v.isNullAt(i)) return f.nullNode();
        if (t instanceof ByteType) return f.numberNode(v.getByte(i));
        if (t instanceof ShortType) return f.numberNode(v.getShort(i));
        if (t instanceof IntegerType || t instanceof DateType) return f.numberNode(v.getInt(i));
        if (t instanceof LongType || t instanceof TimestampType) return f.numberNode(v.getLong(i));
        if (t instanceof DecimalType d) {
            BigInteger u = v.getDecimal(i, d.precision(), d.scale()).toJavaBigDecimal().toBigIntegerExact();
            return f.numberNode(u);
        }
        if (t instanceof FloatType) return f.numberNode((double) v.getFloat(i));
        if (t instanceof DoubleType) return f.numberNode(v.getDouble(i));
        if (t instanceof BooleanType) return f.booleanNode(v.getBoolean(i));
        if (t instanceof StringType) return f.textNode(v.getUTF8String(i).toString());
        if (t instanceof BinaryType) return f.textNode(Base64.getEncoder().encodeToString(v.getBinary(i)));
        StructType s = (StructType) t;
        ObjectNode o = f.objectNode();
        StructField[] fs = s.fields();
        for (int k = 0; k < fs.length; k++) o.set(fs[k].name(), value(v.getChild(k), fs[k].dataType(), i));
        return o;
    }

    @Test
    void anEncryptedObjectReadsWithThePlansDataKeyAlone() throws IOException {
        JsonNode entry = Golden.object("encrypted.obj");
        JsonNode read = entry.get("reads").get(0);
        List<JsonNode> rows = rows("encrypted.obj", entry, read, null, Base64.getDecoder().decode(entry.get("data_key").asText()));
        assertEquals(read.get("rows").size(), rows.size());
        assertEquals(Golden.canonical(read.get("rows")), Golden.canonical(JSON.valueToTree(rows)));
    }

    @Test
    void theCorruptObjectFailsTheReadNamingTheObjectAndOffset() {
        JsonNode stored = Golden.object("stored.obj");
        JsonNode err = Golden.object("corrupt.obj").get("error");
        CorruptObjectException e = assertThrows(CorruptObjectException.class,
                () -> rows("corrupt.obj", stored, stored.get("reads").get(0), null, null));
        assertEquals("corrupt object " + Golden.where("corrupt.obj") + " at offset " + err.get("offset").asLong() + ": "
                + err.get("what").asText(), e.getMessage());
    }

    @Test
    void theCorruptColumnarObjectFailsNamingTheSegmentAndColumn() {
        JsonNode stored = Golden.manifest().get("columnar_objects").get("columnar-stored.obj");
        JsonNode err = Golden.manifest().get("columnar_objects").get("columnar-corrupt.obj").get("error");
        CorruptObjectException e = assertThrows(CorruptObjectException.class,
                () -> rows("columnar-corrupt.obj", stored, stored.get("reads").get(0), null, null));
        assertEquals("corrupt object " + Golden.where("columnar-corrupt.obj") + " at offset " + err.get("offset").asLong()
                + ": " + err.get("what").asText() + " (segment " + err.get("segment").asInt() + " column id "
                + err.get("column").asInt() + ")", e.getMessage());
    }

    @Test
    void groupsTheStatisticsRuleOutAreNotRead() throws IOException {
        // columnar-stored.obj: groups of 50 rows; ids 0..49 in group 0, 50..99 in group 1, the rest in group 2
        JsonNode entry = Golden.manifest().get("columnar_objects").get("columnar-stored.obj");
        Schema target = Schema.parse(entry.get("schema").asText());
        JsonNode every = entry.get("reads").get(0);
        Predicates idFrom100 = new Predicates(List.of(new Predicates.Term(target.byName("id"), Op.GE,
                new Predicates.Int(BigInteger.valueOf(100)))), null);
        long want = 0;
        for (JsonNode row : every.get("rows")) if (row.get(0).asLong() >= 100) want++;
        byte[] raw = Golden.bytes("columnar-stored.obj");
        try (SealedObject obj = new SealedObject(Golden.where("columnar-stored.obj"), new Golden.Bytes(raw), raw.length,
                null, null)) {
            ColumnarRows rows = new ColumnarRows(obj, target.columns(), idFrom100,
                    Base64.getDecoder().decode(every.get("visible").asText()), 0, Long.MAX_VALUE);
            OnHeapColumnVector[] vectors = OnHeapColumnVector.allocateColumns(4096, SparkTypes.sparkSchema(target.columns()));
            int n = 0;
            while (rows.more()) n += rows.fill(vectors, 4096);
            assertEquals(want, n);
            assertTrue(want > 0);
            assertEquals(2, rows.skipped()); // groups 0 and 1 hold no id >= 100: never read
        }
    }

    @Test
    void columnarObjectsReadTheirTwinsRows() throws IOException {
        JsonNode columnar = Golden.manifest().get("columnar_objects");
        int twins = 0;
        for (Map.Entry<String, JsonNode> e : columnar.properties()) {
            if (!e.getValue().hasNonNull("twin")) continue;
            JsonNode twin = Golden.object(e.getValue().get("twin").asText());
            JsonNode read = twin.get("reads").get(0);
            List<JsonNode> a = rows(e.getValue().get("twin").asText(), twin, read, Kek.load(Golden.kekFile()), null);
            List<JsonNode> b = rows(e.getKey(), e.getValue(), e.getValue().get("reads").get(0), Kek.load(Golden.kekFile()), null);
            assertEquals(Golden.canonical(JSON.valueToTree(a)), Golden.canonical(JSON.valueToTree(b)), e.getKey());
            twins++;
        }
        assertEquals(4, twins);
    }

    @Test
    void theEvolvedSegmentHoldsRowsOfEveryVersion() {
        JsonNode entry = Golden.object("evolved.obj");
        assertEquals(4, entry.get("versions").size());
        Schema target = Schema.parse(entry.get("schema").asText());
        Column i8 = target.byName("i8");
        assertEquals("string", i8.type()); // re-added under a new id: the int8 values of old rows must not show in it
        for (JsonNode row : entry.get("reads").get(0).get("rows")) {
            JsonNode v = row.get(target.columns().indexOf(i8));
            assertTrue(v.isNull() || v.asText().startsWith("s"), v.toString());
        }
    }
}
