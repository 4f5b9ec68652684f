package io.terrascale.spark.format;

import io.terrascale.spark.BridgeException;

/** A comparison of a where term (rowstore/reads/predicates.py ``OPS``), as the node's API spells it. */
public enum Op {
    EQ("="), NE("!="), LT("<"), LE("<="), GT(">"), GE(">=");

    private final String symbol;

    Op(String symbol) {
        this.symbol = symbol;
    }

    public String symbol() {
        return symbol;
    }

    public static Op of(String symbol) {
        for (Op op : values()) {
            if (op.symbol.equals(symbol)) return op;
        }
        throw new BridgeException("'" + symbol + "' is not a comparison (= != < <= > >=)");
    }

    /** Whether {@code sign(stored - value)} satisfies this comparison. */
    public boolean holds(int cmp) {
        switch (this) {
            case EQ: return cmp == 0;
            case NE: return cmp != 0;
            case LT: return cmp < 0;
            case LE: return cmp <= 0;
            case GT: return cmp > 0;
            default: return cmp >= 0;
        }
    }

    /** IEEE comparison: every comparison with NaN is false but {@code !=}. */
    public boolean holds(double a, double b) {
        switch (this) {
            case EQ: return a == b;
            case NE: return a != b;
            case LT: return a < b;
            case LE: return a <= b;
            case GT: return a > b;
            default: return a >= b;
        }
    }

    @Override
    public String toString() {
        return symbol;
    }
}
