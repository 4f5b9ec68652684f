package io.terrascale.spark.format;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.terrascale.spark.BridgeException;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/** The comparisons of rowstore/reads/predicates.py, on the storage domain: unsigned integers, bytes, NaN, ranges. */
class PredicatesTest {
    private static final BigInteger TWO_63 = BigInteger.ONE.shiftLeft(63);

    @Test
    void integersCompareByValueWhateverTheirWidthOrSign() {
        assertEquals(-1, Predicates.compareInt(-5, false, BigInteger.valueOf(3)));
        assertEquals(1, Predicates.compareInt(-1, true, BigInteger.valueOf(3))); // u64 max > 3
        assertEquals(1, Predicates.compareInt(0, true, BigInteger.valueOf(-1))); // every unsigned value > -1
        assertEquals(0, Predicates.compareInt(Long.MIN_VALUE, true, TWO_63)); // 2^63 stored as u64
        assertEquals(-1, Predicates.compareInt(Long.MAX_VALUE, true, TWO_63));
        assertEquals(-1, Predicates.compareInt(Long.MAX_VALUE, false, TWO_63)); // beyond every int64
        assertEquals(1, Predicates.compareInt(Long.MIN_VALUE, false, TWO_63.negate().subtract(BigInteger.ONE)));
        assertEquals(-1, Predicates.compareInt(-1, true, BigInteger.ONE.shiftLeft(64))); // beyond every u64
    }

    @Test
    void bytesCompareUnsignedThenByLength() {
        byte[] row = "xxabcxx".getBytes(StandardCharsets.UTF_8);
        assertEquals(0, Predicates.compareBytes(row, 2, 3, "abc".getBytes(StandardCharsets.UTF_8)));
        assertEquals(-1, Predicates.compareBytes(row, 2, 2, "abc".getBytes(StandardCharsets.UTF_8)));
        assertEquals(1, Predicates.compareBytes(new byte[] {(byte) 0xff}, 0, 1, new byte[] {0x7f}));
    }

    @Test
    void comparisonsWithNanAreFalseButNotEqual() {
        for (Op op : Op.values()) assertEquals(op == Op.NE, op.holds(Double.NaN, 1.0), op.symbol());
        assertTrue(Op.LE.holds(0) && Op.GE.holds(0) && !Op.LT.holds(0) && Op.NE.holds(-3));
    }

    @Test
    void opsAreTheApisSymbols() {
        for (Op op : Op.values()) assertEquals(op, Op.of(op.symbol()));
        BridgeException e = assertThrows(BridgeException.class, () -> Op.of("=="));
        assertEquals("'==' is not a comparison (= != < <= > >=)", e.getMessage());
    }

    @Test
    void rangesMatchWhenTheyOverlapTheTermsInterval() {
        int closed = Predicates.LOWER_INC | Predicates.UPPER_INC;
        // [1, 10] against = 10, < 1, <= 1, > 10, >= 10 (cmpHi = sign(10 - v), cmpLo = sign(1 - v))
        assertTrue(Predicates.rangeOverlaps(Op.EQ, 0, -1, closed));
        assertFalse(Predicates.rangeOverlaps(Op.EQ, 0, -1, Predicates.LOWER_INC)); // [1, 10) misses 10
        assertFalse(Predicates.rangeOverlaps(Op.LT, 1, 0, closed));
        assertTrue(Predicates.rangeOverlaps(Op.LE, 1, 0, closed));
        assertFalse(Predicates.rangeOverlaps(Op.GT, 0, -1, closed));
        assertTrue(Predicates.rangeOverlaps(Op.GE, 0, -1, closed));
        assertTrue(Predicates.rangeOverlaps(Op.GT, -1, -1, Predicates.UPPER_UNB)); // unbounded above
        assertTrue(Predicates.rangeOverlaps(Op.LT, 1, 1, Predicates.LOWER_UNB)); // unbounded below
    }
}
