package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.format.Column;
import io.terrascale.spark.node.NodeClient;
import io.terrascale.spark.node.ReadPlan;
import io.terrascale.spark.node.Snapshot;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/** A Terrascale table as Spark sees it: read natively, written through the Python data source (the node's ingest endpoint). */
final class TerrascaleTable implements SupportsRead, SupportsWrite {
    private final Options opts;
    private final StructType schema;
    private final Transform[] partitioning;
    private final Map<String, String> properties;
    private final SnapshotPin pin;
    private final PythonFallback python;
    /** The node's read plans of this DataFrame, by predicates (see TerrascaleScan#nodePlan). */
    private final Map<TerrascaleScan.PlanKey, ReadPlan> plans = new ConcurrentHashMap<>();

    TerrascaleTable(Options opts, StructType schema, Transform[] partitioning, Map<String, String> properties,
                    SnapshotPin pin, PythonFallback python) {
        this.opts = opts;
        this.schema = schema;
        this.partitioning = partitioning;
        this.properties = properties;
        this.pin = pin;
        this.python = python;
    }

    @Override
    public String name() {
        return "terrascale:" + opts.table();
    }

    // Spark 4 deprecates schema() for columns(), whose default only converts schema(): the StructType promised at
    // load() is the exact contract (field metadata included), so it is given as it is.
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.BATCH_WRITE, TableCapability.TRUNCATE,
                TableCapability.MICRO_BATCH_READ); // a stream without change_feed is refused with the reason
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        Snapshot snap = pin.get();
        if (snap == null) snap = pin.pinIfUnset(givenSchemaSnapshot());
        List<Column> output = SparkTypes.select(snap.schema(), opts.columns(), opts.table());
        return new TerrascaleScanBuilder(opts, snap, output, plans);
    }

    /** A schema given with .schema(...) (no inferSchema): it must be the table's at the snapshot. */
    private Snapshot givenSchemaSnapshot() {
        Snapshot snap = new NodeClient(opts.node(), opts.table()).snapshot(opts.asOf());
        StructType derived = SparkTypes.sparkSchema(SparkTypes.select(snap.schema(), opts.columns(), opts.table()));
        if (!derived.equals(schema)) {
            throw new BridgeException("the schema given with .schema(...) is not table '" + opts.table()
                    + "''s schema at " + snap.asOf() + "; leave it out (the bridge derives it)");
        }
        return snap;
    }

    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        Table py = python.table(schema, partitioning, properties);
        return ((SupportsWrite) py).newWriteBuilder(info);
    }
}
