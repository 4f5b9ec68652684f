package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Kind;
import io.terrascale.spark.format.Op;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.node.WhereTerm;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.time.Instant;
import java.time.LocalDate;
import java.util.Base64;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;

/**
 * Spark's simple comparisons as where terms, on columns whose Spark semantics are the engine's:
 * integers, strings, binary, booleans, timestamps and dates. Not floats (Spark orders NaN above
 * every number, the engine's comparisons with NaN are false), uuid or json (compared as text by
 * Spark, as bytes or not at all by the engine), nor structs.
 */
final class FilterTerms {
    private FilterTerms() {}

    /** The term for {@code f}, or null when it has none. */
    static WhereTerm of(Filter f, Schema target) {
        Op op;
        String attr;
        Object v;
        if (f instanceof EqualTo e) { op = Op.EQ; attr = e.attribute(); v = e.value(); }
        else if (f instanceof GreaterThan g) { op = Op.GT; attr = g.attribute(); v = g.value(); }
        else if (f instanceof GreaterThanOrEqual g) { op = Op.GE; attr = g.attribute(); v = g.value(); }
        else if (f instanceof LessThan l) { op = Op.LT; attr = l.attribute(); v = l.value(); }
        else if (f instanceof LessThanOrEqual l) { op = Op.LE; attr = l.attribute(); v = l.value(); }
        else return null;
        Column c = target.byName(attr);
        if (c == null || v == null) return null;
        WhereTerm.Value value = value(c.kind(), v);
        return value == null ? null : new WhereTerm(c.name(), op, value);
    }

    /** The filter's value as the node takes it, or null where Spark's and the engine's semantics differ. */
    private static WhereTerm.Value value(Kind k, Object v) {
        switch (k) {
            case INT8: case INT16: case INT32: case INT64: case UINT8: case UINT16: case UINT32:
                return v instanceof Byte || v instanceof Short || v instanceof Integer || v instanceof Long
                        ? new WhereTerm.Int(BigInteger.valueOf(((Number) v).longValue())) : null;
            case UINT64:
                return v instanceof BigDecimal d && d.scale() <= 0 ? new WhereTerm.Int(d.toBigIntegerExact()) : null;
            case STRING: return v instanceof String s ? new WhereTerm.Text(s) : null;
            case BINARY: return v instanceof byte[] b ? new WhereTerm.Text(Base64.getEncoder().encodeToString(b)) : null;
            case BOOL: return v instanceof Boolean b ? new WhereTerm.Bool(b) : null;
            case TIMESTAMP: {
                Instant t = v instanceof java.sql.Timestamp ts ? ts.toInstant() : v instanceof Instant i ? i : null;
                if (t == null) return null;
                long micros = Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L), t.getNano() / 1000);
                return new WhereTerm.Int(BigInteger.valueOf(micros));
            }
            case DATE: {
                LocalDate d = v instanceof java.sql.Date sd ? sd.toLocalDate() : v instanceof LocalDate ld ? ld : null;
                return d == null ? null : new WhereTerm.Int(BigInteger.valueOf(d.toEpochDay()));
            }
            default:
                return null;
        }
    }
}
