package io.terrascale.spark.node;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/** The plan as JSON: read into records, predicate values typed by their column, lacks named. */
class WireTest {
    private static final String TYPES = "{\"version\": 1, \"primary_key\": 1, \"next_column_id\": 7, \"columns\": ["
            + "{\"id\": 1, \"name\": \"id\", \"type\": \"int64\", \"nullable\": false},"
            + "{\"id\": 2, \"name\": \"u\", \"type\": \"uint64\", \"nullable\": true},"
            + "{\"id\": 3, \"name\": \"f\", \"type\": \"float32\", \"nullable\": true},"
            + "{\"id\": 4, \"name\": \"s\", \"type\": \"string\", \"nullable\": true},"
            + "{\"id\": 5, \"name\": \"g\", \"type\": \"uuid\", \"nullable\": true},"
            + "{\"id\": 6, \"name\": \"r\", \"type\": \"range<float64>\", \"nullable\": true},"
            + "{\"id\": 7, \"name\": \"bx\", \"type\": \"box\", \"nullable\": true}]}";

    private static ReadPlan parse(String json) {
        return Wire.plan(Wire.parse(json.getBytes(StandardCharsets.UTF_8), "plan"));
    }

    @Test
    void predicateValuesAreTypedByTheirColumn() {
        Schema s = Schema.parse(TYPES);
        String p = "{\"terms\": [{\"column_id\": 2, \"column\": \"u\", \"op\": \">=\", \"value\": 18446744073709551615},"
                + "{\"column_id\": 3, \"column\": \"f\", \"op\": \"<\", \"value\": NaN},"
                + "{\"column_id\": 4, \"column\": \"s\", \"op\": \"=\", \"value\": \"ü\"},"
                + "{\"column_id\": 5, \"column\": \"g\", \"op\": \"!=\", \"value\": \"AAEC\"},"
                + "{\"column_id\": 6, \"column\": \"r\", \"op\": \">\", \"value\": 1.5}],"
                + " \"bbox\": {\"column_id\": 7, \"column\": \"bx\", \"xmin\": 0, \"ymin\": 1, \"xmax\": 2, \"ymax\": 3}}";
        Predicates preds = Wire.predicates(Wire.parse(p.getBytes(StandardCharsets.UTF_8), "plan"), s);
        assertEquals(new Predicates.Int(BigInteger.ONE.shiftLeft(64).subtract(BigInteger.ONE)), preds.terms().get(0).value());
        assertEquals(Op.GE, preds.terms().get(0).op());
        assertTrue(Double.isNaN(((Predicates.Real) preds.terms().get(1).value()).v()));
        assertArrayEquals("ü".getBytes(StandardCharsets.UTF_8), ((Predicates.Bytes) preds.terms().get(2).value()).v());
        assertArrayEquals(new byte[] {0, 1, 2}, ((Predicates.Bytes) preds.terms().get(3).value()).v());
        assertEquals(new Predicates.Real(1.5), preds.terms().get(4).value()); // a range compares its element kind
        assertEquals(new Predicates.BBox(s.byId(7), 0, 1, 2, 3), preds.bbox());
    }

    @Test
    void aPlanOfAnotherFormatVersionIsRefused() {
        BridgeException e = assertThrows(BridgeException.class, () -> parse("{\"version\": 2}"));
        assertEquals("read plan version 2 is not 1: the JVM reader and the node are of different releases", e.getMessage());
    }

    @Test
    void aFieldThePlanLacksIsNamed() {
        String noRows = NodeClientTest.plan("").replace("\"rows\": 10, ", "");
        BridgeException e = assertThrows(BridgeException.class, () -> parse(noRows));
        assertEquals("the node's plan sealed[0] has no 'rows' (a node of another release?)", e.getMessage());
        BridgeException lease = assertThrows(BridgeException.class, () -> parse(NodeClientTest.plan("").replace(", \"lease\": \"L1\"", "")));
        assertEquals("the node's plan has no 'lease' (a node of another release?)", lease.getMessage());
    }

    @Test
    void aPredicateOnAColumnTheSchemaLacksIsRefused() {
        String p = ", \"predicates\": {\"terms\": [{\"column_id\": 99, \"column\": \"gone\", \"op\": \"=\", \"value\": 1}], \"bbox\": null}";
        BridgeException e = assertThrows(BridgeException.class, () -> parse(NodeClientTest.plan(p)));
        assertEquals("the plan's predicate names column id 99 the schema lacks", e.getMessage());
        ReadPlan none = parse(NodeClientTest.plan(", \"predicates\": {\"terms\": [], \"bbox\": null}"));
        assertTrue(none.predicates().isPresent() && none.predicates().get().isEmpty());
    }

    @Test
    void anUnknownColumnTypeIsNamed() {
        BridgeException e = assertThrows(BridgeException.class, () -> Schema.parse(TYPES.replace("\"box\"", "\"polygon\"")));
        assertEquals("column 'bx' has type 'polygon', which this reader does not know (a newer node?)", e.getMessage());
    }
}
