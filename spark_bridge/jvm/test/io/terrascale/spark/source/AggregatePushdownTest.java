package io.terrascale.spark.source;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Schema;
import java.util.List;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.Expressions;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Avg;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.expressions.aggregate.Max;
import org.apache.spark.sql.connector.expressions.aggregate.Min;
import org.apache.spark.sql.connector.expressions.aggregate.Sum;
import org.junit.jupiter.api.Test;

/** Which aggregations the node answers whole, which as per-partition partials Spark merges, and which not at all. */
class AggregatePushdownTest {
    private static final Schema S = Schema.parse("{\"version\": 1, \"primary_key\": 1, \"columns\": ["
            + "{\"id\": 1, \"name\": \"id\", \"type\": \"int64\", \"nullable\": false},"
            + "{\"id\": 2, \"name\": \"g\", \"type\": \"string\", \"nullable\": true},"
            + "{\"id\": 3, \"name\": \"v\", \"type\": \"float64\", \"nullable\": true},"
            + "{\"id\": 4, \"name\": \"f\", \"type\": \"float32\", \"nullable\": true},"
            + "{\"id\": 5, \"name\": \"u\", \"type\": \"uint32\", \"nullable\": true},"
            + "{\"id\": 6, \"name\": \"p\", \"type\": \"point\", \"nullable\": true}]}");

    private static Aggregation agg(List<String> keys, AggregateFunc... fns) {
        return new Aggregation(fns, keys.stream().map(k -> (Expression) Expressions.column(k)).toArray(Expression[]::new));
    }

    private static Expression col(String name) {
        return Expressions.column(name);
    }

    @Test
    void whatTheNodeAnswersAsSparkWouldIsComplete() {
        Aggregation a = agg(List.of("g", "id"), new CountStar(), new Count(col("v"), false), new Count(col("g"), true),
                new Sum(col("v"), false), new Avg(col("id"), false), new Min(col("id")), new Max(col("g")));
        AggregatePushdown.Query q = AggregatePushdown.complete(a, S);
        assertNotNull(q);
        assertFalse(q.partial());
        assertEquals(List.of("g", "id", "count", "count_v", "count_distinct_g", "sum_v", "mean_id", "min_id", "max_g"),
                q.output().stream().map(Column::name).toList());
        assertEquals("float64", q.output().get(5).type());
    }

    @Test
    void floatKeysAndFloatExtremesArePartialOnly() {
        for (Aggregation a : List.of(agg(List.of("v"), new CountStar(), new Sum(col("id"), false)),
                agg(List.of("f", "g"), new Count(col("v"), false), new Min(col("g"))),
                agg(List.of("g"), new Max(col("v")), new Min(col("f"))),
                agg(List.of(), new Max(col("f")), new Sum(col("v"), false), new Count(col("v"), false)))) {
            assertNull(AggregatePushdown.complete(a, S), java.util.Arrays.toString(a.aggregateExpressions()));
            AggregatePushdown.Query q = AggregatePushdown.partial(a, S);
            assertNotNull(q, java.util.Arrays.toString(a.aggregateExpressions()));
            assertTrue(q.partial());
        }
        AggregatePushdown.Query q = AggregatePushdown.partial(agg(List.of("g"), new Max(col("f"))), S);
        assertEquals("float32", q.output().get(1).type()); // a partial max keeps the column's type; Spark merges it
    }

    @Test
    void whatSparkCannotMergeOrTheNodeCannotAnswerIsNotPushed() {
        for (Aggregation a : List.of(agg(List.of("v"), new Count(col("g"), true)), // DISTINCT is never partial
                agg(List.of("v"), new Avg(col("id"), false)), // Spark splits AVG into SUM and COUNT before a partial push
                agg(List.of("g"), new Sum(col("u"), false)), // unsigned sums
                agg(List.of("p"), new CountStar()), // a point is no key
                agg(List.of("g"), new Max(col("p"))))) {
            assertNull(AggregatePushdown.complete(a, S), java.util.Arrays.toString(a.aggregateExpressions()));
            assertNull(AggregatePushdown.partial(a, S), java.util.Arrays.toString(a.aggregateExpressions()));
        }
    }
}
