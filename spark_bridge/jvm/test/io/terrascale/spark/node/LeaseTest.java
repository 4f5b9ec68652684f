package io.terrascale.spark.node;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import org.junit.jupiter.api.Test;

/** A task's lease: renewed on start (expired: refused at once), then in the background until closed. */
class LeaseTest {
    private static final String EXPIRED = "{\"error\": {\"code\": \"lease_expired\", \"message\": \"gone\"}}";

    @Test
    void anExpiredLeaseFailsTheTaskBeforeItReads() throws IOException {
        try (FakeNode node = new FakeNode()) {
            node.then(409, EXPIRED);
            NodeClient c = new NodeClient(node.endpoint(null), "t");
            assertThrows(LeaseExpiredException.class, () -> new Lease(c, "L", 0.3));
        }
    }

    @Test
    void aRenewalRefusedInTheBackgroundFailsTheNextCheck() throws Exception {
        try (FakeNode node = new FakeNode()) {
            node.then(200, "{}").always(409, EXPIRED);
            try (Lease lease = new Lease(new NodeClient(node.endpoint(null), "t"), "L", 0.15)) { // renewed every 50 ms
                long deadline = System.nanoTime() + 5_000_000_000L;
                while (true) {
                    try {
                        lease.check();
                    } catch (LeaseExpiredException e) {
                        break;
                    }
                    assertTrue(System.nanoTime() < deadline, "the background renewal never saw the expiry");
                    Thread.sleep(10);
                }
            }
            int after = node.seen().size();
            Thread.sleep(200);
            assertTrue(node.seen().size() == after, "no renewal after the lease was refused");
        }
    }

    @Test
    void closingStopsTheRenewals() throws Exception {
        try (FakeNode node = new FakeNode()) {
            node.always(200, "{}");
            Lease lease = new Lease(new NodeClient(node.endpoint(null), "t"), "L", 0.15);
            Thread.sleep(200);
            lease.close();
            lease.check();
            Thread.sleep(100); // a renewal under way when close() came ends
            int after = node.seen().size();
            Thread.sleep(200);
            assertTrue(after >= 3 && node.seen().size() == after, after + " then " + node.seen().size());
        }
    }
}
