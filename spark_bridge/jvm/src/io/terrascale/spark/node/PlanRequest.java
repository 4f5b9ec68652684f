package io.terrascale.spark.node;

import java.util.List;

/**
 * What a read plan is asked for ({@code POST /v1/tables/{t}/plan}, docs/spark.md "The plan for
 * the JVM reader"): the timestamp, the predicates, the lease's life, and whether to add presigned
 * URLs ({@code presign}: the executors have no S3 client) and data keys ({@code keys}: they have no
 * key file). Typed predicates are always asked for.
 */
public record PlanRequest(long asOf, boolean sealedOnly, double leaseS, boolean presign, boolean keys,
                          List<WhereTerm> where, BBoxTerm bbox) {
    public PlanRequest {
        where = List.copyOf(where);
    }
}
