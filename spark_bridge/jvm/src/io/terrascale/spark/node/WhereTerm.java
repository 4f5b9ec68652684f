package io.terrascale.spark.node;

import io.terrascale.spark.format.Op;
import java.io.Serializable;
import java.math.BigInteger;

/**
 * A {@code where} term as the node's API takes it ({@code [column, op, value]}, docs/openapi.yaml):
 * text the node converts to the column's type (the {@code where} option's values, strings, binary
 * as base64), or an integer (timestamps as µs, dates as days) or a boolean pushed down from Spark.
 */
public record WhereTerm(String column, Op op, Value value) implements Serializable {
    public sealed interface Value extends Serializable permits Text, Int, Bool {}

    public record Text(String v) implements Value {}

    public record Int(BigInteger v) implements Value {}

    public record Bool(boolean v) implements Value {}

    public static WhereTerm text(String column, Op op, String v) {
        return new WhereTerm(column, op, new Text(v));
    }

    public static WhereTerm integer(String column, Op op, long v) {
        return new WhereTerm(column, op, new Int(BigInteger.valueOf(v)));
    }
}
