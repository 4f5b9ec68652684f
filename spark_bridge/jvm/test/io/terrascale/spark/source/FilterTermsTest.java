package io.terrascale.spark.source;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import io.terrascale.spark.format.Op;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.node.WhereTerm;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.time.Instant;
import java.time.LocalDate;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.IsNull;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.junit.jupiter.api.Test;

/** Which Spark filters become where terms, with values in the node's domain; the rest stay Spark's alone. */
class FilterTermsTest {
    private static final Schema S = Schema.parse("{\"version\": 1, \"primary_key\": 1, \"columns\": ["
            + "{\"id\": 1, \"name\": \"id\", \"type\": \"int64\", \"nullable\": false},"
            + "{\"id\": 2, \"name\": \"u\", \"type\": \"uint64\", \"nullable\": true},"
            + "{\"id\": 3, \"name\": \"f\", \"type\": \"float64\", \"nullable\": true},"
            + "{\"id\": 4, \"name\": \"ts\", \"type\": \"timestamp\", \"nullable\": true},"
            + "{\"id\": 5, \"name\": \"d\", \"type\": \"date\", \"nullable\": true},"
            + "{\"id\": 6, \"name\": \"bin\", \"type\": \"binary\", \"nullable\": true},"
            + "{\"id\": 7, \"name\": \"g\", \"type\": \"uuid\", \"nullable\": true}]}");

    @Test
    void comparisonsOnColumnsWithTheEnginesSemanticsArePushed() {
        assertEquals(WhereTerm.integer("id", Op.GT, 5), FilterTerms.of(new GreaterThan("id", 5), S));
        assertEquals(new WhereTerm("u", Op.EQ, new WhereTerm.Int(new BigInteger("18446744073709551615"))),
                FilterTerms.of(new EqualTo("u", new BigDecimal("18446744073709551615")), S));
        assertEquals(WhereTerm.integer("ts", Op.LT, 1_500_000), FilterTerms.of(new LessThan("ts", Instant.ofEpochSecond(1, 500_000_000)), S));
        assertEquals(WhereTerm.integer("d", Op.LE, 3), FilterTerms.of(new LessThanOrEqual("d", LocalDate.ofEpochDay(3)), S));
        assertEquals(WhereTerm.text("bin", Op.EQ, "AAE="), FilterTerms.of(new EqualTo("bin", new byte[] {0, 1}), S));
    }

    @Test
    void theRestIsLeftToSpark() {
        assertNull(FilterTerms.of(new GreaterThan("f", 1.5), S)); // Spark orders NaN above every number
        assertNull(FilterTerms.of(new EqualTo("g", "00000000-0000-0000-0000-000000000000"), S)); // text to Spark, bytes here
        assertNull(FilterTerms.of(new IsNull("id"), S));
        assertNull(FilterTerms.of(new EqualTo("missing", 1), S));
        assertNull(FilterTerms.of(new EqualTo("u", new BigDecimal("1.5")), S));
    }
}
