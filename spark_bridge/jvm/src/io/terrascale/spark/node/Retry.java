package io.terrascale.spark.node;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.function.DoubleSupplier;
import java.util.function.Predicate;

/**
 * Retries with jittered exponential backoff: the JVM reader's one helper, as catalog/retry.py is
 * the Python side's. A caller says what may be retried; this class says how long to wait and when
 * to give up.
 *
 * <p>Only a call that is safe to repeat may be retried: a read, an idempotent write (a lease
 * renewal sets an expiry), or a call made idempotent first — a read plan carries a request id
 * chosen once before the first attempt, so every attempt of it shares one lease on the node. The
 * {@code retryable} predicate is where a caller draws that line, per failure.
 *
 * <p>The wait after the n-th failed attempt is uniform in [0, min(cap, base * 2^(n-1))] ("full
 * jitter"), so tasks that failed together do not come back together. An interrupted thread gives
 * up at once.
 */
public final class Retry {
    /** At most {@code attempts} attempts, waiting as the class says. */
    public record Policy(int attempts, long baseMillis, long capMillis) {
        public Policy {
            if (attempts < 1 || baseMillis < 0 || capMillis < 0) {
                throw new IllegalArgumentException("attempts >= 1, waits >= 0: not " + attempts + ", " + baseMillis + ", " + capMillis);
            }
        }

        /** The wait after failed attempt {@code attempt} (1-based), for a uniform draw {@code u} in [0, 1). */
        long delayMillis(int attempt, double u) {
            double top = Math.min(capMillis, baseMillis * Math.pow(2, Math.min(attempt - 1, 62)));
            return (long) (top * u);
        }
    }

    /** One attempt: an IOException is a transport failure; a RuntimeException (e.g. {@link ApiError}) an answer. */
    @FunctionalInterface
    public interface Attempt<T> {
        T run() throws IOException;
    }

    @FunctionalInterface
    public interface Sleeper {
        void sleep(long millis) throws InterruptedException;
    }

    /** The real clock and randomness; tests pass their own, so nothing waits. */
    public static final Retry SYSTEM = new Retry(Thread::sleep, () -> ThreadLocalRandom.current().nextDouble());

    private final Sleeper sleeper;
    private final DoubleSupplier rng;

    public Retry(Sleeper sleeper, DoubleSupplier rng) {
        this.sleeper = sleeper;
        this.rng = rng;
    }

    /** {@code attempt}, run again after each failure {@code retryable} accepts, as {@code policy} allows; the
     * last failure is thrown as it is. */
    public <T> T call(Policy policy, Attempt<T> attempt, Predicate<Exception> retryable) throws IOException {
        for (int made = 1; ; made++) {
            try {
                return attempt.run();
            } catch (IOException | RuntimeException e) {
                if (made >= policy.attempts() || Thread.currentThread().isInterrupted() || !retryable.test(e)) throw e;
                pause(policy.delayMillis(made, rng.getAsDouble()));
            }
        }
    }

    private void pause(long millis) throws InterruptedIOException {
        try {
            if (millis > 0) sleeper.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            InterruptedIOException out = new InterruptedIOException("interrupted while waiting to retry");
            out.initCause(e);
            throw out;
        }
    }
}
