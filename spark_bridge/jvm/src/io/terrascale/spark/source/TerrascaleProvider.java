package io.terrascale.spark.source;

import io.terrascale.spark.BridgeException;
import io.terrascale.spark.node.NodeClient;
import io.terrascale.spark.node.Snapshot;
import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("terrascale")} in the JVM (docs/spark.md, "Readers"). Spark finds this
 * class by its short name (META-INF/services) before it looks at Python data sources, so with the
 * jar on the classpath it serves the name. Batch reads are native; writes, the change feed and
 * {@code option("reader", "python")} go to the Python data source ({@link PythonFallback}).
 *
 * <p>Like the Python source, {@code load()} pins the snapshot: {@link #inferSchema} takes the node's
 * closed timestamp (or {@code as_of}) and the schema at it, and every scan of that DataFrame reads
 * at that timestamp. Spark makes a provider per {@code load()}; its state is final or atomic.
 */
public final class TerrascaleProvider implements TableProvider, DataSourceRegister {
    private final SnapshotPin pin = new SnapshotPin();
    private final PythonFallback python = new PythonFallback();

    @Override
    public String shortName() {
        return "terrascale";
    }

    /** Writes aside, what the Python data source serves: the change feed, {@code reader=python}, and (with
     * {@code reader=auto}) reads whose option {@code objects} names an S3 store with its own credentials or
     * endpoint: the JVM reader holds no S3 client, it reads S3 objects through the URLs the node presigns. */
    static boolean toPython(Options o) {
        if (o.changeFeed() || o.reader().equals("python")) return true;
        boolean s3 = o.objects() != null && !o.objects().startsWith("trfs:");
        if (s3 && o.reader().equals("jvm")) {
            throw new BridgeException("option objects: the JVM reader reads S3 objects through the URLs the node "
                    + "presigns in the plan; leave option objects out, or use option reader=python");
        }
        return s3;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        Options o = Options.parse(options);
        if (toPython(o)) return python.inferSchema(options);
        Snapshot snap = new NodeClient(o.node(), o.table()).snapshot(o.asOf());
        pin.set(snap);
        return SparkTypes.sparkSchema(SparkTypes.select(snap.schema(), o.columns(), o.table()));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        Options o = Options.parse(properties);
        if (toPython(o)) return python.table(schema, partitioning, properties);
        return new TerrascaleTable(o, schema, partitioning, properties, pin, python);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }
}
