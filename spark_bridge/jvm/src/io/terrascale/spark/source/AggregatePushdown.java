package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kind;
import io.terrascale.spark.format.Schema;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Avg;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.expressions.aggregate.Max;
import org.apache.spark.sql.connector.expressions.aggregate.Min;
import org.apache.spark.sql.connector.expressions.aggregate.Sum;

/**
 * A Spark aggregation answered by the node's {@code POST /v1/tables/{t}/aggregate}
 * (docs/rfcs/0012-aggregates.md, docs/spark.md "Aggregates") at the DataFrame's T, over plain columns.
 *
 * <p><b>Complete</b> ({@link #complete}): the node's answer is Spark's, so Spark takes it as the result:
 * GROUP BY integer, string, binary, bool, time and date columns with COUNT(*), COUNT(col), COUNT(DISTINCT col),
 * SUM and AVG of signed integers and floats, MIN and MAX of integers, strings, times and dates.
 *
 * <p><b>Partial</b> ({@link #partial}): one answer per table partition, each a partial that Spark's own final
 * aggregation merges, where only that merge is Spark's: float group keys (Spark folds -0.0 into 0.0 and every
 * NaN into one group when it merges the partials; the node keeps them apart) and MIN/MAX of floats (the node is
 * asked to order NaN above every number, {@code "nan": "largest"}, as Spark does). Spark offers a partial push
 * only COUNT(*), COUNT, SUM, MIN and MAX without DISTINCT; it splits AVG into SUM and COUNT for it.
 *
 * <p>Anything else (expressions, unsigned sums, DISTINCT beside a float key or float MIN/MAX) is left to Spark.
 */
final class AggregatePushdown {
    private AggregatePushdown() {}

    /**
     * The request and the columns of its answer, in Spark's order (group keys, then aggregates); {@code partial}:
     * asked once per table partition, with NaN largest in MIN/MAX.
     */
    record Query(List<String> groupBy, List<String[]> aggregates, List<Column> output, boolean partial)
            implements Serializable {}

    // Floats are keys and ordered only in a partial push: Spark makes -0.0 and 0.0 one group and NaN the largest
    // value when it merges, the node's grouping (Arrow's) does neither.
    private static final Set<Kind> KEYS = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8,
            Kind.UINT16, Kind.UINT32, Kind.STRING, Kind.BINARY, Kind.BOOL, Kind.TIMESTAMP, Kind.DATE);
    private static final Set<Kind> SIGNED = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64);
    private static final Set<Kind> FLOATS = EnumSet.of(Kind.FLOAT32, Kind.FLOAT64);
    private static final Set<Kind> ORDERED = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8,
            Kind.UINT16, Kind.UINT32, Kind.STRING, Kind.TIMESTAMP, Kind.DATE);

    /** The query for {@code a} answered whole, or null when the node cannot answer all of it exactly as Spark would. */
    static Query complete(Aggregation a, Schema schema) {
        return of(a, schema, false);
    }

    /** The per-partition query for {@code a} whose partials Spark merges into its own answer, or null. */
    static Query partial(Aggregation a, Schema schema) {
        return of(a, schema, true);
    }

    private static Query of(Aggregation a, Schema schema, boolean partial) {
        List<String> groupBy = new ArrayList<>();
        List<String[]> aggs = new ArrayList<>();
        List<Column> out = new ArrayList<>();
        Set<String> names = new HashSet<>();
        for (Expression e : a.groupByExpressions()) {
            Column c = column(e, schema);
            if (c == null || !(KEYS.contains(c.kind()) || partial && FLOATS.contains(c.kind()))) return null;
            groupBy.add(c.name());
            out.add(c);
            names.add(c.name());
        }
        for (AggregateFunc f : a.aggregateExpressions()) {
            String[] spec = spec(f, schema, partial);
            if (spec == null) return null;
            String name = spec[1] == null ? spec[0] : spec[0] + "_" + spec[1];
            if (!names.add(name)) return null; // two answer columns of one name: the node refuses those
            aggs.add(spec);
            out.add(Column.of(-1 - out.size(), name, answerType(spec, schema), true));
        }
        return new Query(List.copyOf(groupBy), List.copyOf(aggs), List.copyOf(out), partial);
    }

    /** {fn, column or null} of one aggregate, or null when it is not one the node answers as Spark does. */
    private static String[] spec(AggregateFunc f, Schema schema, boolean partial) {
        if (f instanceof CountStar) return new String[] {"count", null};
        Column c;
        String fn;
        if (f instanceof Count n) {
            c = column(n.column(), schema);
            fn = n.isDistinct() ? "count_distinct" : "count";
            if (n.isDistinct() && (partial || c != null && !KEYS.contains(c.kind()))) return null;
        } else if (f instanceof Sum s && !s.isDistinct()) {
            c = column(s.column(), schema);
            fn = "sum";
            if (c != null && !SIGNED.contains(c.kind()) && !FLOATS.contains(c.kind())) return null;
        } else if (f instanceof Avg v && !v.isDistinct() && !partial) { // a partial push gets AVG as SUM and COUNT
            c = column(v.column(), schema);
            fn = "mean";
            if (c != null && !SIGNED.contains(c.kind()) && !FLOATS.contains(c.kind())) return null;
        } else if (f instanceof Min m) {
            c = column(m.column(), schema);
            fn = "min";
            if (c != null && !ordered(c, partial)) return null;
        } else if (f instanceof Max m) {
            c = column(m.column(), schema);
            fn = "max";
            if (c != null && !ordered(c, partial)) return null;
        } else {
            return null;
        }
        return c == null ? null : new String[] {fn, c.name()};
    }

    private static boolean ordered(Column c, boolean partial) {
        return ORDERED.contains(c.kind()) || partial && FLOATS.contains(c.kind());
    }

    private static String answerType(String[] spec, Schema schema) {
        switch (spec[0]) {
            case "count": case "count_distinct": return "int64";
            case "mean": return "float64";
            case "sum": return FLOATS.contains(schema.byName(spec[1]).kind()) ? "float64" : "int64";
            default: return schema.byName(spec[1]).type(); // min, max: the column's own type
        }
    }

    private static Column column(Expression e, Schema schema) {
        if (!(e instanceof NamedReference r) || r.fieldNames().length != 1) return null;
        Column c = schema.byName(r.fieldNames()[0]);
        return c != null ? c : schema.byNameIgnoreCase(r.fieldNames()[0]);
    }
}
