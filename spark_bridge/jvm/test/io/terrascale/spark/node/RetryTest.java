package io.terrascale.spark.node;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/** The retry helper: full-jitter backoff within the policy; only what the caller accepts is retried. */
class RetryTest {
    private final List<Long> waits = new ArrayList<>();
    private final Retry upperEdge = new Retry(waits::add, () -> 0.999_999); // the top of each jitter window

    @Test
    void waitsGrowExponentiallyUpToTheCapWithFullJitter() {
        Retry.Policy p = new Retry.Policy(10, 200, 1_000);
        assertEquals(List.of(199L, 399L, 799L, 999L, 999L), List.of(p.delayMillis(1, 0.999), p.delayMillis(2, 0.999),
                p.delayMillis(3, 0.999), p.delayMillis(4, 0.999), p.delayMillis(60, 0.999)));
        assertEquals(0L, p.delayMillis(3, 0.0)); // the window starts at zero: clients that failed together spread out
        assertEquals(100L, p.delayMillis(1, 0.5));
    }

    @Test
    void aRetryableFailureIsRetriedUntilTheAttemptsRunOut() {
        AtomicInteger calls = new AtomicInteger();
        IOException last = new IOException("third");
        IOException e = assertThrows(IOException.class, () -> upperEdge.call(new Retry.Policy(3, 10, 1_000), () -> {
            calls.incrementAndGet();
            throw calls.get() == 3 ? last : new IOException("again");
        }, x -> true));
        assertSame(last, e); // the last failure, as it is
        assertEquals(3, calls.get());
        assertEquals(List.of(9L, 19L), waits);
    }

    @Test
    void aSuccessAfterFailuresIsReturned() throws IOException {
        AtomicInteger calls = new AtomicInteger();
        String out = upperEdge.call(new Retry.Policy(5, 10, 1_000), () -> {
            if (calls.incrementAndGet() < 3) throw new IOException("not yet");
            return "ok";
        }, x -> true);
        assertEquals("ok", out);
        assertEquals(2, waits.size());
    }

    @Test
    void whatTheCallerRefusesRunsOnce() {
        AtomicInteger calls = new AtomicInteger();
        ApiError refused = new ApiError("POST /x", 400, "bad_request", "no");
        ApiError e = assertThrows(ApiError.class, () -> upperEdge.call(new Retry.Policy(5, 10, 1_000), () -> {
            calls.incrementAndGet();
            throw refused;
        }, NodeClient::unavailable));
        assertSame(refused, e);
        assertEquals(1, calls.get());
        assertTrue(waits.isEmpty());
    }

    @Test
    void anInterruptedThreadGivesUp() {
        Thread.currentThread().interrupt();
        try {
            AtomicInteger calls = new AtomicInteger();
            assertThrows(IOException.class, () -> upperEdge.call(new Retry.Policy(5, 10, 1_000), () -> {
                calls.incrementAndGet();
                throw new IOException("down");
            }, x -> true));
            assertEquals(1, calls.get());
        } finally {
            Thread.interrupted();
        }
        Retry interrupting = new Retry(ms -> {
            throw new InterruptedException();
        }, () -> 0.5);
        assertThrows(InterruptedIOException.class, () -> interrupting.call(new Retry.Policy(5, 10, 1_000), () -> {
            throw new IOException("down");
        }, x -> true));
        assertTrue(Thread.interrupted(), "the interrupt is kept for the caller");
    }
}
