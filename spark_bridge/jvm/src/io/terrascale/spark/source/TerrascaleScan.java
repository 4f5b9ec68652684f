package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.node.ApiError;
import io.terrascale.spark.node.LeaseExpiredException;
import io.terrascale.spark.node.NodeClient;
import io.terrascale.spark.node.PlanRequest;
import io.terrascale.spark.node.ReadPlan;
import io.terrascale.spark.node.Snapshot;
import io.terrascale.spark.node.WhereTerm;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.roaringbitmap.RoaringBitmap;

/**
 * Batch reads in the JVM (docs/spark.md, "Readers"), planned on the driver from the node's read
 * plan at the DataFrame's pinned timestamp: one input partition per offloaded segment (or a
 * range of its rows), read by the executor straight from the object store, plus one per table
 * partition's unsealed tail (fetched from the node as Arrow). A pushed aggregation (docs/spark.md,
 * "Aggregates") is one partition holding the node's whole answer, or one per table partition, each
 * asking the node for that partition's partial at T, which Spark merges.
 */
final class TerrascaleScan implements Scan, Batch {
    static final StructType COUNT_SCHEMA = new StructType().add("count(*)", DataTypes.LongType, false);

    /** A DataFrame's plans are kept by what the node plans differently for. */
    record PlanKey(boolean sealedOnly, List<WhereTerm> where) {}

    private final Options opts;
    private final Snapshot snap;
    private final List<Column> output;
    private final List<WhereTerm> where;
    private final boolean countOnly;
    private final AggregatePushdown.Query aggregate; // answered whole by the node, or null
    private final Map<PlanKey, ReadPlan> plans;
    private final StructType readSchema;
    private ReaderFactory factory; // both set by plan(), under this object's lock
    private InputPartition[] parts;

    TerrascaleScan(Options opts, Snapshot snap, List<Column> output, List<WhereTerm> where, boolean countOnly,
                   AggregatePushdown.Query aggregate, Map<PlanKey, ReadPlan> plans) {
        this.opts = opts;
        this.snap = snap;
        this.output = List.copyOf(output);
        this.where = List.copyOf(where);
        this.countOnly = countOnly;
        this.aggregate = aggregate;
        this.plans = plans;
        this.readSchema = countOnly ? COUNT_SCHEMA : SparkTypes.sparkSchema(aggregate != null ? aggregate.output() : output);
    }

    @Override
    public StructType readSchema() {
        return readSchema;
    }

    @Override
    public String description() {
        return "terrascale table=" + opts.table() + " as_of=" + snap.asOf() + " where=" + where.size() + " terms"
                + (aggregate == null ? "" : " aggregate=" + aggregate.output().size() + " columns (node"
                        + (aggregate.partial() ? ", partial per partition: merged by Spark)" : ")"));
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpoint) {
        throw new BridgeException("a streaming read of a Terrascale table is its change feed: add "
                + ".option('change_feed', 'true') (the rows then carry commit_ts and op)");
    }

    @Override
    public InputPartition[] planInputPartitions() {
        plan();
        return parts;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        plan();
        return factory;
    }

    /** The node's plan for these predicates at T: made once per DataFrame (like the Python reader's), so
     * later actions do not make the node plan again. A reused plan's lease is renewed first; if it expired,
     * the plan is made again — at the same T, so the DataFrame still reads one snapshot. */
    private ReadPlan nodePlan() {
        PlanKey key = new PlanKey(opts.sealedOnly(), where);
        NodeClient node = new NodeClient(opts.node(), opts.table());
        ReadPlan p = plans.get(key);
        if (p != null) {
            try {
                node.renew(p.lease(), opts.leaseS());
                return p;
            } catch (ApiError e) {
                if (e.status() != 409) throw e;
            } catch (LeaseExpiredException e) {
                // expired (or released): plan again below
            }
        }
        p = node.plan(new PlanRequest(snap.asOf(), opts.sealedOnly(), opts.leaseS(), opts.objects() == null,
                opts.keyFile() == null, where, opts.bbox()));
        plans.put(key, p);
        return p;
    }

    private synchronized void plan() {
        if (parts != null) return;
        if (aggregate != null) {
            planAggregate();
            return;
        }
        ReadPlan p = nodePlan();
        if (p.schema().version() != snap.schema().version()) {
            throw new BridgeException("table '" + opts.table() + "': the plan's schema at " + snap.asOf() + " is not the one load() saw");
        }
        boolean keyless = p.sealed().stream().anyMatch(s -> s.dataKey() == null);
        if (p.encrypted() && keyless && opts.keyFile() == null) {
            throw new BridgeException("table '" + opts.table() + "' is encrypted at rest: give option key_file (the node's "
                    + "security.encryption_key_file, readable on every executor)");
        }
        if (!where.isEmpty() && p.predicates().isEmpty()) {
            throw new BridgeException("the node's plan has no typed predicates (an older node?): use reader python");
        }
        List<InputPartition> out = new ArrayList<>();
        long[] segids = new long[p.sealed().size()];
        int i = 0;
        for (ReadPlan.Sealed s : p.sealed()) {
            segids[i++] = s.segid();
            if (countOnly) out.add(new Partitions.Count(cardinality(s.visible())));
            else out.addAll(split(s));
        }
        for (int t : p.tail()) out.add(new Partitions.Tail(t));
        if (out.isEmpty()) out.add(new Partitions.Tail(-1));
        String objects = opts.objects() != null ? opts.objects() : p.objects();
        factory = new ReaderFactory(new ReadSpec(opts, snap.asOf(), p.lease(), objects, p.versions(), snap.schema(), output,
                p.predicates().orElse(Predicates.NONE), where, segids, countOnly));
        parts = out.toArray(new InputPartition[0]);
    }

    /** The node's whole answer at T, fetched here once: one small partition that only converts it; or, for a
     * partial push, one partition per table partition, each asking the node for its partition's partial at T (in
     * parallel, on the executors). */
    private void planAggregate() {
        NodeClient node = new NodeClient(opts.node(), opts.table());
        factory = new ReaderFactory(new ReadSpec(opts, snap.asOf(), null, null, List.of(), snap.schema(),
                aggregate.output(), Predicates.NONE, where, new long[0], false));
        if (aggregate.partial()) {
            int n = node.partitions(snap.asOf());
            parts = new InputPartition[n];
            for (int p = 0; p < n; p++) parts[p] = new Partitions.Partial(p, aggregate);
            return;
        }
        byte[] answer = node.aggregate(snap.asOf(), where, opts.bbox(), aggregate.groupBy(), aggregate.aggregates());
        parts = new InputPartition[] {new Partitions.Answer(answer)};
    }

    /** A large segment is read by several tasks, each a range of its rows (about split_mib of object each). */
    private List<InputPartition> split(ReadPlan.Sealed s) {
        long k = Math.max(1, Math.min(s.rows(), (s.objectSize() + opts.splitBytes() - 1) / opts.splitBytes()));
        List<InputPartition> out = new ArrayList<>();
        for (long j = 0; j < k; j++) {
            out.add(new Partitions.Segment(s.segid(), s.key(), s.objectSize(), s.visible(), s.url(), s.rows() * j / k,
                    j + 1 == k ? Long.MAX_VALUE : s.rows() * (j + 1) / k, s.dataKey()));
        }
        return out;
    }

    static long cardinality(byte[] portable) {
        RoaringBitmap bm = new RoaringBitmap();
        try {
            bm.deserialize(ByteBuffer.wrap(portable));
        } catch (IOException e) {
            throw new BridgeException("the plan's visible bitmap does not parse: " + e, e);
        }
        return bm.getLongCardinality();
    }
}
