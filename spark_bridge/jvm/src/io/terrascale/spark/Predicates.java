package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.Serializable;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

/**
 * The exact predicates of a read (rowstore/reads/predicates.py's semantics), as the node typed them in the
 * plan (``predicates``: each term's value in the column's storage domain). Evaluated on row bytes:
 * a null never matches; ranges match when they overlap the term's interval; a bbox holds points
 * inside it and boxes overlapping it, edges inclusive.
 */
final class Predicates implements Serializable {
    static final class Term implements Serializable {
        final int columnId;
        final Types.Kind kind; // the column's kind (RANGE: compare against elem)
        final Types.Kind elem;
        final String op;
        // the value: one of these, by kind
        BigInteger big; // integers (any width, uint64 included), timestamps, dates
        double dbl;
        boolean bool;
        byte[] bytes; // strings (UTF-8), binary, uuid

        Term(int columnId, Types.Kind kind, Types.Kind elem, String op) {
            this.columnId = columnId;
            this.kind = kind;
            this.elem = elem;
            this.op = op;
        }
    }

    final List<Term> terms = new ArrayList<>();
    int bboxColumn = -1;
    boolean bboxIsBox;
    double xmin, ymin, xmax, ymax;

    static Predicates fromPlan(JsonNode p, Types.Schema target) {
        Predicates out = new Predicates();
        if (p == null || p.isNull()) return out;
        for (JsonNode t : p.path("terms")) {
            Types.Col c = target.byId(t.get("column_id").asInt());
            if (c == null) throw new BridgeException("the plan's predicate names column id " + t.get("column_id") + " the schema lacks");
            Term term = new Term(c.id, c.kind, c.elem, t.get("op").asText());
            Types.Kind k = c.kind == Types.Kind.RANGE ? c.elem : c.kind;
            JsonNode v = t.get("value");
            switch (k) {
                case FLOAT32: case FLOAT64: term.dbl = v.asDouble(); break;
                case BOOL: term.bool = v.asBoolean(); break;
                case STRING: term.bytes = v.asText().getBytes(java.nio.charset.StandardCharsets.UTF_8); break;
                case BINARY: case UUID: term.bytes = Base64.getDecoder().decode(v.asText()); break;
                default: term.big = v.bigIntegerValue(); break;
            }
            out.terms.add(term);
        }
        JsonNode b = p.path("bbox");
        if (!b.isMissingNode() && !b.isNull()) {
            Types.Col c = target.byId(b.get("column_id").asInt());
            out.bboxColumn = c.id;
            out.bboxIsBox = c.kind == Types.Kind.BOX;
            out.xmin = b.get("xmin").asDouble();
            out.ymin = b.get("ymin").asDouble();
            out.xmax = b.get("xmax").asDouble();
            out.ymax = b.get("ymax").asDouble();
        }
        return out;
    }

    boolean isEmpty() {
        return terms.isEmpty() && bboxColumn < 0;
    }

    static boolean holds(String op, int cmp) {
        switch (op) {
            case "=": return cmp == 0;
            case "!=": return cmp != 0;
            case "<": return cmp < 0;
            case "<=": return cmp <= 0;
            case ">": return cmp > 0;
            default: return cmp >= 0;
        }
    }

    static boolean holdsDouble(String op, double a, double b) {
        switch (op) { // IEEE: every comparison with NaN is false but !=
            case "=": return a == b;
            case "!=": return a != b;
            case "<": return a < b;
            case "<=": return a <= b;
            case ">": return a > b;
            default: return a >= b;
        }
    }

    /** sign(stored - value) for an integer stored as ``v`` (``unsigned``: as u64). */
    static int compareInt(long v, boolean unsigned, BigInteger value) {
        if (value.bitLength() < 64) {
            long w = value.longValue();
            if (!unsigned) return Long.compare(v, w);
            if (w < 0) return 1;
            return Long.compareUnsigned(v, w);
        }
        if (unsigned && value.signum() > 0 && value.bitLength() == 64) {
            return Long.compareUnsigned(v, value.longValue());
        }
        return -value.signum(); // the value is beyond every stored value
    }

    static int compareBytes(byte[] a, int off, int len, byte[] b) {
        int n = Math.min(len, b.length);
        for (int i = 0; i < n; i++) {
            int x = a[off + i] & 0xff;
            int y = b[i] & 0xff;
            if (x != y) return x < y ? -1 : 1;
        }
        return Integer.compare(len, b.length);
    }

    /** Whether a range [lo, hi] (flags: bounds' inclusiveness and unboundedness) overlaps the term. */
    static boolean rangeOverlaps(Term t, int cmpHiToValue, int cmpLoToValue, int flags) {
        boolean loInc = (flags & 1) != 0, hiInc = (flags & 2) != 0, loUnb = (flags & 4) != 0, hiUnb = (flags & 8) != 0;
        boolean ok = true;
        String op = t.op;
        // the term's interval: '=' [v, v]; '<' (-inf, v); '<=' (-inf, v]; '>' (v, inf); '>=' [v, inf)
        boolean hasLo = op.equals("=") || op.equals(">") || op.equals(">=");
        boolean qLoInc = !op.equals(">");
        boolean hasHi = op.equals("=") || op.equals("<") || op.equals("<=");
        boolean qHiInc = !op.equals("<");
        if (hasLo) ok = hiUnb || cmpHiToValue > 0 || (cmpHiToValue == 0 && hiInc && qLoInc);
        if (ok && hasHi) ok = loUnb || cmpLoToValue < 0 || (cmpLoToValue == 0 && loInc && qHiInc);
        return ok;
    }
}
