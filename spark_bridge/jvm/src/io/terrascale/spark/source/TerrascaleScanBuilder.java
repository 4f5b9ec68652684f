package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.node.ReadPlan;
import io.terrascale.spark.node.Snapshot;
import io.terrascale.spark.node.WhereTerm;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/** One query's pushdown (filters, columns, aggregates) on the driver; Spark uses a builder from one thread. */
final class TerrascaleScanBuilder implements ScanBuilder, SupportsPushDownFilters, SupportsPushDownRequiredColumns,
        SupportsPushDownAggregates {
    private final Options opts;
    private final Snapshot snap;
    private final Map<TerrascaleScan.PlanKey, ReadPlan> plans;
    private final List<WhereTerm> pushedTerms = new ArrayList<>();
    private List<Column> output;
    private Filter[] pushed = new Filter[0];
    private boolean countOnly;
    private AggregatePushdown.Query aggregate;

    TerrascaleScanBuilder(Options opts, Snapshot snap, List<Column> output, Map<TerrascaleScan.PlanKey, ReadPlan> plans) {
        this.opts = opts;
        this.snap = snap;
        this.output = output;
        this.plans = plans;
    }

    /** Filters with a where term (FilterTerms) narrow the node's plan and are applied exactly by the reader;
     * every filter is also returned to Spark, which evaluates it again after the scan. */
    @Override
    public Filter[] pushFilters(Filter[] filters) {
        List<Filter> took = new ArrayList<>();
        for (Filter f : filters) {
            WhereTerm term = FilterTerms.of(f, snap.schema());
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

    @Override
    public void pruneColumns(StructType required) {
        List<Column> keep = new ArrayList<>();
        for (StructField f : required.fields()) {
            for (Column c : output) if (c.name().equals(f.name())) keep.add(c);
        }
        output = keep;
    }

    /** {@code count()} without predicates is answered from the plan: a segment's visible bitmap holds exactly its
     * live rows at T (the key index drops deleted keys), so its count is the bitmap's cardinality; tails are
     * counted from the node's rows. Spark sums the partial counts. Other aggregations the node answers whole
     * ({@link AggregatePushdown#complete}) are one answer from {@code /aggregate} at T; those whose last merge must
     * be Spark's ({@link AggregatePushdown#partial}) one answer per table partition at T, merged by Spark. Spark
     * calls this only after {@link #supportCompletePushDown} with the same aggregation, and only for a partial
     * push it can merge (no DISTINCT, AVG split into SUM and COUNT). */
    @Override
    public boolean pushAggregation(Aggregation a) {
        if (countFromPlan(a)) {
            countOnly = true;
            return true;
        }
        aggregate = whole(a);
        if (aggregate == null && nodeAnswers()) aggregate = AggregatePushdown.partial(a, snap.schema());
        return aggregate != null;
    }

    @Override
    public boolean supportCompletePushDown(Aggregation a) {
        return !countFromPlan(a) && whole(a) != null;
    }

    private boolean countFromPlan(Aggregation a) {
        return a.groupByExpressions().length == 0 && a.aggregateExpressions().length == 1
                && a.aggregateExpressions()[0] instanceof CountStar
                && opts.where().isEmpty() && opts.bbox() == null && pushedTerms.isEmpty();
    }

    /** The node's whole answer, or null. */
    private AggregatePushdown.Query whole(Aggregation a) {
        return nodeAnswers() ? AggregatePushdown.complete(a, snap.schema()) : null;
    }

    /** Whether {@code /aggregate} covers the rows of this read: not when Spark's own filters were pushed (it checks
     * them again after the scan, and an aggregate above such a filter is not offered anyway), nor for sealed_only
     * (the node aggregates every row at T, the memtables' too). */
    private boolean nodeAnswers() {
        return pushedTerms.isEmpty() && !opts.sealedOnly();
    }

    @Override
    public Scan build() {
        List<WhereTerm> where = new ArrayList<>(opts.where());
        where.addAll(pushedTerms);
        return new TerrascaleScan(opts, snap, output, where, countOnly, aggregate, plans);
    }
}
