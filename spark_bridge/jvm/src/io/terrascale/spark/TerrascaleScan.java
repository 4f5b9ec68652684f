package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.io.IOException;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.time.Instant;
import java.time.LocalDate;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.roaringbitmap.RoaringBitmap;

/**
 * Batch reads in the JVM (docs/spark.md, "Readers"): planning on the driver from the node's read
 * plan at the DataFrame's pinned timestamp; one input partition per offloaded segment, read by
 * the executor straight from the object store, plus one per table partition's unsealed tail
 * (fetched from the node as Arrow).
 */
final class TerrascaleScan {
    private TerrascaleScan() {}

    static final int BATCH_ROWS = 4096;
    static final int PLAN_VERSION = 1; // rowstore/reads/plan.py PLAN_VERSION

    // -- driver: pushdown and planning ---------------------------------------------------

    static final class Builder implements ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns,
            SupportsPushDownAggregates {
        private final Opts opts;
        private final long asOf;
        private final Types.Schema target;
        private List<Types.Col> output;
        private final List<Object[]> pushedTerms = new ArrayList<>();
        private Filter[] pushed = new Filter[0];
        private boolean countOnly;

        private final Map<String, JsonNode> plans;

        Builder(Opts opts, long asOf, Types.Schema target, List<Types.Col> output, Map<String, JsonNode> plans) {
            this.plans = plans;
            this.opts = opts;
            this.asOf = asOf;
            this.target = target;
            this.output = output;
        }

        /** Spark's simple comparisons on columns whose Spark semantics are the engine's become where terms
         * (the node narrows the plan with its column index; the reader applies them exactly). Every filter
         * is also returned to Spark, which evaluates it again after the scan. */
        @Override
        public Filter[] pushFilters(Filter[] filters) {
            List<Filter> took = new ArrayList<>();
            for (Filter f : filters) {
                Object[] term = term(f);
                if (term != null) {
                    pushedTerms.add(term);
                    took.add(f);
                }
            }
            pushed = took.toArray(new Filter[0]);
            return filters;
        }

        @Override
        public Filter[] pushedFilters() {
            return pushed;
        }

        private Object[] term(Filter f) {
            String op;
            String attr;
            Object v;
            if (f instanceof EqualTo) { op = "="; attr = ((EqualTo) f).attribute(); v = ((EqualTo) f).value(); }
            else if (f instanceof GreaterThan) { op = ">"; attr = ((GreaterThan) f).attribute(); v = ((GreaterThan) f).value(); }
            else if (f instanceof GreaterThanOrEqual) { op = ">="; attr = ((GreaterThanOrEqual) f).attribute(); v = ((GreaterThanOrEqual) f).value(); }
            else if (f instanceof LessThan) { op = "<"; attr = ((LessThan) f).attribute(); v = ((LessThan) f).value(); }
            else if (f instanceof LessThanOrEqual) { op = "<="; attr = ((LessThanOrEqual) f).attribute(); v = ((LessThanOrEqual) f).value(); }
            else return null;
            Types.Col c = target.byName(attr);
            if (c == null || v == null) return null;
            Object value = value(c.kind, v);
            return value == null ? null : new Object[] {c.name, op, value};
        }

        /** The filter's value as the node takes it, or null where Spark's and the engine's semantics differ. */
        private static Object value(Types.Kind k, Object v) {
            switch (k) {
                case INT8: case INT16: case INT32: case INT64: case UINT8: case UINT16: case UINT32:
                    return v instanceof Byte || v instanceof Short || v instanceof Integer || v instanceof Long
                            ? ((Number) v).longValue() : null;
                case UINT64:
                    return v instanceof BigDecimal && ((BigDecimal) v).scale() <= 0 ? ((BigDecimal) v).toBigIntegerExact() : null;
                case STRING: return v instanceof String ? v : null;
                case BINARY: return v instanceof byte[] ? Base64.getEncoder().encodeToString((byte[]) v) : null;
                case BOOL: return v instanceof Boolean ? v : null;
                case TIMESTAMP:
                    if (v instanceof java.sql.Timestamp) v = ((java.sql.Timestamp) v).toInstant();
                    if (v instanceof Instant) {
                        Instant t = (Instant) v;
                        return Math.addExact(Math.multiplyExact(t.getEpochSecond(), 1_000_000L), t.getNano() / 1000);
                    }
                    return null;
                case DATE:
                    if (v instanceof java.sql.Date) v = ((java.sql.Date) v).toLocalDate();
                    return v instanceof LocalDate ? ((LocalDate) v).toEpochDay() : null;
                default:
                    return null; // floats (Spark orders NaN above everything), uuid/json text, structs
            }
        }

        @Override
        public void pruneColumns(StructType required) {
            List<Types.Col> keep = new ArrayList<>();
            for (StructField f : required.fields()) {
                for (Types.Col c : output) if (c.name.equals(f.name())) keep.add(c);
            }
            output = keep;
        }

        /** ``count()`` without predicates is answered from the plan: a segment's visible bitmap holds exactly its
         * live rows at T (the key index drops deleted keys), so its count is the bitmap's cardinality; tails are
         * counted from the node's rows. Spark sums the partial counts. */
        @Override
        public boolean pushAggregation(Aggregation a) {
            if (a.groupByExpressions().length != 0 || a.aggregateExpressions().length != 1
                    || !(a.aggregateExpressions()[0] instanceof CountStar)) {
                return false;
            }
            if (!opts.where.isEmpty() || opts.bbox != null || !pushedTerms.isEmpty()) return false;
            countOnly = true;
            return true;
        }

        @Override
        public Scan build() {
            List<Object[]> where = new ArrayList<>(opts.where);
            where.addAll(pushedTerms);
            return new Plan(opts, asOf, target, output, where, countOnly, plans);
        }
    }

    static final class Plan implements Scan, Batch {
        private final Opts opts;
        private final long asOf;
        private final Types.Schema target;
        private final List<Types.Col> output;
        private final List<Object[]> where;
        private final StructType readSchema;
        private final boolean countOnly;

        private final Map<String, JsonNode> plans;

        Plan(Opts opts, long asOf, Types.Schema target, List<Types.Col> output, List<Object[]> where, boolean countOnly,
             Map<String, JsonNode> plans) {
            this.plans = plans;
            this.opts = opts;
            this.asOf = asOf;
            this.target = target;
            this.output = output;
            this.where = where;
            this.countOnly = countOnly;
            this.readSchema = countOnly ? COUNT_SCHEMA : Types.sparkSchema(output);
        }

        @Override
        public StructType readSchema() {
            return readSchema;
        }

        @Override
        public String description() {
            return "terrascale table=" + opts.table + " as_of=" + asOf + " where=" + where.size() + " terms";
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public org.apache.spark.sql.connector.read.streaming.MicroBatchStream toMicroBatchStream(String checkpoint) {
            throw new BridgeException("a streaming read of a Terrascale table is its change feed: add "
                    + ".option('change_feed', 'true') (the rows then carry commit_ts and op)");
        }

        private Readers.Factory factory;
        private InputPartition[] parts;

        /** The node's plan for these predicates at T: made once per DataFrame (like the Python reader's), so
         * later actions do not make the node plan again. A reused plan's lease is renewed first; if it expired,
         * the plan is made again — at the same T, so the DataFrame still reads one snapshot. */
        private JsonNode nodePlan() {
            StringBuilder key = new StringBuilder(opts.sealedOnly ? "sealed_only" : "all");
            for (Object[] t : where) key.append('\u0000').append(t[0]).append(t[1]).append(t[2]).append('|').append(t[2].getClass());
            String k = key.toString();
            NodeClient c = new NodeClient(opts);
            JsonNode p = plans.get(k);
            if (p != null) {
                try {
                    c.renew(p.get("lease").asText(), opts.leaseS);
                    return p;
                } catch (NodeClient.ApiError e) {
                    if (e.status != 409) throw e; // expired (or released): plan again below
                }
            }
            p = c.plan(asOf, where, opts.sealedOnly);
            plans.put(k, p);
            return p;
        }

        private void plan() {
            if (parts != null) return;
            JsonNode p = nodePlan();
            if (p.path("version").asInt(1) != PLAN_VERSION) {
                throw new BridgeException("read plan version " + p.get("version") + " is not " + PLAN_VERSION
                        + ": the JVM reader and the node are of different releases");
            }
            Types.Schema at = Types.Schema.parse(p.get("schema").asText());
            if (at.version != target.version) {
                throw new BridgeException("table '" + opts.table + "': the plan's schema at " + asOf + " is not the one load() saw");
            }
            List<Types.Schema> versions = new ArrayList<>();
            for (JsonNode v : p.get("versions")) versions.add(Types.Schema.parse(v.asText()));
            boolean encrypted = p.get("encrypted").asBoolean();
            JsonNode sealed = p.get("sealed");
            boolean keyless = false;
            for (JsonNode s : sealed) keyless |= !s.hasNonNull("data_key");
            if (encrypted && keyless && opts.keyFile == null) {
                throw new BridgeException("table '" + opts.table + "' is encrypted at rest: give option key_file (the node's "
                        + "security.encryption_key_file, readable on every executor)");
            }
            Predicates preds = Predicates.fromPlan(p.get("predicates"), target);
            if (!where.isEmpty() && p.get("predicates") == null) {
                throw new BridgeException("the node's plan has no typed predicates (an older node?): use reader python");
            }
            long[] segids = new long[sealed.size()];
            List<InputPartition> out = new ArrayList<>();
            int i = 0;
            for (JsonNode s : sealed) {
                segids[i++] = s.get("segid").asLong();
                long size = s.get("object_size").asLong();
                long rows = s.get("rows").asLong();
                // a large segment is read by several tasks, each a range of its rows (whole runs of them)
                long k = Math.max(1, Math.min(rows, (size + opts.splitBytes - 1) / opts.splitBytes));
                byte[] visible = Base64.getDecoder().decode(s.get("visible").asText());
                if (countOnly) {
                    out.add(new CountPart(cardinality(visible)));
                    continue;
                }
                byte[] dataKey = s.hasNonNull("data_key") ? Base64.getDecoder().decode(s.get("data_key").asText()) : null;
                for (long j = 0; j < k; j++) {
                    out.add(new SegmentPart(s.get("segid").asLong(), s.get("key").asText(), size, visible,
                            s.hasNonNull("url") ? s.get("url").asText() : null, rows * j / k,
                            j + 1 == k ? Long.MAX_VALUE : rows * (j + 1) / k, dataKey));
                }
            }
            for (JsonNode t : p.get("tail")) out.add(new TailPart(t.asInt()));
            if (out.isEmpty()) out.add(new TailPart(-1));
            String objects = opts.objects != null ? opts.objects : p.get("objects").asText();
            factory = new Readers.Factory(opts, asOf, p.get("lease").asText(), objects, versions, target, output, preds, where, segids,
                    countOnly);
            parts = out.toArray(new InputPartition[0]);
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
    }

    static final class SegmentPart implements InputPartition {
        final long segid;
        final String key;
        final long objectSize;
        final byte[] visible; // portable roaring bitmap of the localids visible at T
        final String url; // presigned GET of the object, or null: read it from the store URI
        final long firstRow; // the localids [firstRow, endRow) this task reads
        final long endRow;
        final byte[] dataKey; // the object's data key, unwrapped by the node (encrypted data, no key_file)

        SegmentPart(long segid, String key, long objectSize, byte[] visible, String url, long firstRow, long endRow,
                    byte[] dataKey) {
            this.dataKey = dataKey;
            this.segid = segid;
            this.key = key;
            this.objectSize = objectSize;
            this.visible = visible;
            this.url = url;
            this.firstRow = firstRow;
            this.endRow = endRow;
        }
    }

    static final StructType COUNT_SCHEMA = new StructType().add("count(*)", org.apache.spark.sql.types.DataTypes.LongType, false);

    static long cardinality(byte[] portable) {
        RoaringBitmap bm = new RoaringBitmap();
        try {
            bm.deserialize(ByteBuffer.wrap(portable));
        } catch (IOException e) {
            throw new BridgeException("the plan's visible bitmap does not parse: " + e, e);
        }
        return bm.getLongCardinality();
    }

    /** ``count()``: the number of visible rows of one offloaded segment, known from the plan. */
    static final class CountPart implements InputPartition {
        final long rows;

        CountPart(long rows) {
            this.rows = rows;
        }
    }

    static ColumnarBatch countBatch(long n) {
        OnHeapColumnVector[] v = OnHeapColumnVector.allocateColumns(1, COUNT_SCHEMA);
        v[0].putLong(0, n);
        return new ColumnarBatch(new ColumnVector[] {v[0]}, 1);
    }

    static final class TailPart implements InputPartition {
        final int partition; // -1: an empty plan (Spark still runs one task)

        TailPart(int partition) {
            this.partition = partition;
        }
    }

}
