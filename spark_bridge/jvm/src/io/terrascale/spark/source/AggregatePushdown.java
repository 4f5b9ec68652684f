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
 * A Spark aggregation answered whole by the node's {@code POST /v1/tables/{t}/aggregate}
 * (docs/rfcs/0012-aggregates.md) at the DataFrame's T: GROUP BY plain columns with COUNT(*),
 * COUNT(col), COUNT(DISTINCT col), SUM, MIN, MAX and AVG of plain columns whose answer types are
 * Spark's own. Anything else (expressions, unsigned sums, unordered minima) is left to Spark.
 */
final class AggregatePushdown {
    private AggregatePushdown() {}

    /** The request and the columns of its answer, in Spark's order (group keys, then aggregates). */
    record Query(List<String> groupBy, List<String[]> aggregates, List<Column> output) implements Serializable {}

    // Floats are not keys, counted distinct nor ordered here: Spark makes -0.0 and 0.0 one group and NaN the
    // largest value, Arrow does neither.
    private static final Set<Kind> KEYS = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8,
            Kind.UINT16, Kind.UINT32, Kind.STRING, Kind.BINARY, Kind.BOOL, Kind.TIMESTAMP, Kind.DATE);
    private static final Set<Kind> SIGNED = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64);
    private static final Set<Kind> FLOATS = EnumSet.of(Kind.FLOAT32, Kind.FLOAT64);
    private static final Set<Kind> ORDERED = EnumSet.of(Kind.INT8, Kind.INT16, Kind.INT32, Kind.INT64, Kind.UINT8,
            Kind.UINT16, Kind.UINT32, Kind.STRING, Kind.TIMESTAMP, Kind.DATE);

    /** The query for {@code a}, or null when the node cannot answer all of it exactly as Spark would. */
    static Query of(Aggregation a, Schema schema) {
        List<String> groupBy = new ArrayList<>();
        List<String[]> aggs = new ArrayList<>();
        List<Column> out = new ArrayList<>();
        Set<String> names = new HashSet<>();
        for (Expression e : a.groupByExpressions()) {
            Column c = column(e, schema);
            if (c == null || !KEYS.contains(c.kind())) return null;
            groupBy.add(c.name());
            out.add(c);
            names.add(c.name());
        }
        for (AggregateFunc f : a.aggregateExpressions()) {
            String[] spec = spec(f, schema);
            if (spec == null) return null;
            String name = spec[1] == null ? spec[0] : spec[0] + "_" + spec[1];
            if (!names.add(name)) return null; // two answer columns of one name: the node refuses those
            aggs.add(spec);
            out.add(Column.of(-1 - out.size(), name, answerType(spec, schema), true));
        }
        return new Query(List.copyOf(groupBy), List.copyOf(aggs), List.copyOf(out));
    }

    /** {fn, column or null} of one aggregate, or null when it is not one the node answers as Spark does. */
    private static String[] spec(AggregateFunc f, Schema schema) {
        if (f instanceof CountStar) return new String[] {"count", null};
        Column c;
        String fn;
        if (f instanceof Count n) {
            c = column(n.column(), schema);
            fn = n.isDistinct() ? "count_distinct" : "count";
            if (c != null && n.isDistinct() && !KEYS.contains(c.kind())) return null;
        } else if (f instanceof Sum s && !s.isDistinct()) {
            c = column(s.column(), schema);
            fn = "sum";
            if (c != null && !SIGNED.contains(c.kind()) && !FLOATS.contains(c.kind())) return null;
        } else if (f instanceof Avg v && !v.isDistinct()) {
            c = column(v.column(), schema);
            fn = "mean";
            if (c != null && !SIGNED.contains(c.kind()) && !FLOATS.contains(c.kind())) return null;
        } else if (f instanceof Min m) {
            c = column(m.column(), schema);
            fn = "min";
            if (c != null && !ORDERED.contains(c.kind())) return null;
        } else if (f instanceof Max m) {
            c = column(m.column(), schema);
            fn = "max";
            if (c != null && !ORDERED.contains(c.kind())) return null;
        } else {
            return null;
        }
        return c == null ? null : new String[] {fn, c.name()};
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
