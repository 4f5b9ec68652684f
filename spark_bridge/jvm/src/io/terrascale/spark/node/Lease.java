package io.terrascale.spark.node;

import io.terrascale.spark.BridgeException;

/**
 * Keeps a read's lease alive while a task reads a segment (docs/spark.md, "Leases"): renewed on
 * start (an expired lease fails the task before it reads anything), then every third of its time
 * to live by a daemon thread; {@link #check()} fails the reading thread once a renewal was
 * refused for good.
 */
public final class Lease implements AutoCloseable {
    private final NodeClient client;
    private final String id;
    private final double ttlS;
    private final Thread thread;
    private volatile LeaseExpiredException expired; // written by the renewing thread, read by the task's

    public Lease(NodeClient client, String id, double ttlS) {
        this.client = client;
        this.id = id;
        this.ttlS = ttlS;
        client.renew(id, ttlS);
        thread = new Thread(this::renewUntilClosed, "terrascale-lease-" + id);
        thread.setDaemon(true);
        thread.start();
    }

    private void renewUntilClosed() {
        long every = (long) (ttlS * 1000 / 3);
        while (!Thread.currentThread().isInterrupted()) {
            try {
                Thread.sleep(every);
                client.renew(id, ttlS);
            } catch (InterruptedException e) {
                return; // closed
            } catch (LeaseExpiredException e) {
                expired = e;
                return;
            } catch (BridgeException e) {
                // the node is briefly unreachable or unhappy: the lease still has two thirds to run
            }
        }
    }

    /** Throws once the node refused a renewal: the segments may be gone. */
    public void check() {
        LeaseExpiredException e = expired;
        if (e != null) throw e;
    }

    @Override
    public void close() {
        thread.interrupt();
    }
}
