package io.terrascale.spark;

import com.fasterxml.jackson.databind.JsonNode;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * ``spark.read.format("terrascale")`` in the JVM (docs/spark.md, "Readers"). Spark finds this
 * class by its short name (META-INF/services) before it looks at Python data sources, so with
 * the jar on the classpath it serves the name. Batch reads are native; writes, the change feed
 * and ``option("reader", "python")`` go to the Python data source, which ``spark_bridge.register``
 * also registers as ``terrascale_python``.
 *
 * <p>Like the Python source, ``load()`` pins the snapshot: {@link #inferSchema} takes the node's
 * closed timestamp (or ``as_of``) and the schema at it, and every scan of that DataFrame reads at
 * that timestamp.
 */
public final class TerrascaleProvider implements TableProvider, DataSourceRegister {
    static final String PYTHON_NAME = "terrascale_python";

    private Long pinnedAsOf;
    private String pinnedSchema;
    private PythonDataSourceV2 python;

    @Override
    public String shortName() {
        return "terrascale";
    }

    /** Writes aside, what the Python data source serves: the change feed, ``reader=python``, and (with
     * ``reader=auto``) reads whose option ``objects`` names an S3 store with its own credentials or endpoint:
     * the JVM reader holds no S3 client, it reads S3 objects through the URLs the node presigns. */
    static boolean toPython(Opts o) {
        if (o.changeFeed || o.reader.equals("python")) return true;
        boolean s3 = o.objects != null && !o.objects.startsWith("trfs:");
        if (s3 && o.reader.equals("jvm")) {
            throw new BridgeException("option objects: the JVM reader reads S3 objects through the URLs the node "
                    + "presigns in the plan; leave option objects out, or use option reader=python");
        }
        return s3;
    }

    private PythonDataSourceV2 python() {
        if (python == null) {
            python = new PythonDataSourceV2();
            python.setShortName(PYTHON_NAME);
        }
        return python;
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        Opts o = Opts.parse(options);
        if (toPython(o)) return python().inferSchema(options);
        JsonNode snap = new NodeClient(o).snapshot(o.asOf);
        pinnedAsOf = snap.get("as_of").asLong();
        pinnedSchema = snap.get("schema").asText();
        Types.Schema s = Types.Schema.parse(pinnedSchema);
        return Types.sparkSchema(Types.select(s, o.columns, "table '" + o.table + "'"));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        Opts o = Opts.parse(properties);
        if (toPython(o)) return python().getTable(schema, partitioning, properties);
        return new TerrascaleTable(this, o, schema, partitioning, properties);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    /** Reads natively; writes through the Python data source (the node's ingest endpoint). */
    static final class TerrascaleTable implements SupportsRead, SupportsWrite {
        private final TerrascaleProvider provider;
        private final Opts opts;
        private final StructType schema;
        private final Transform[] partitioning;
        private final Map<String, String> properties;
        /** The node's read plans of this DataFrame, by predicates (see TerrascaleScan.Plan#nodePlan). */
        private final Map<String, com.fasterxml.jackson.databind.JsonNode> plans = new java.util.concurrent.ConcurrentHashMap<>();

        TerrascaleTable(TerrascaleProvider provider, Opts opts, StructType schema, Transform[] partitioning,
                        Map<String, String> properties) {
            this.provider = provider;
            this.opts = opts;
            this.schema = schema;
            this.partitioning = partitioning;
            this.properties = properties;
        }

        @Override
        public String name() {
            return "terrascale:" + opts.table;
        }

        @Override
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
            long asOf;
            Types.Schema target;
            if (provider.pinnedSchema != null) {
                asOf = provider.pinnedAsOf;
                target = Types.Schema.parse(provider.pinnedSchema);
            } else { // a schema given with .schema(...): it must be the table's at the snapshot
                JsonNode snap = new NodeClient(opts).snapshot(opts.asOf);
                asOf = snap.get("as_of").asLong();
                target = Types.Schema.parse(snap.get("schema").asText());
                StructType derived = Types.sparkSchema(Types.select(target, opts.columns, "table '" + opts.table + "'"));
                if (!derived.equals(schema)) {
                    throw new BridgeException("the schema given with .schema(...) is not table '" + opts.table
                            + "''s schema at " + asOf + "; leave it out (the bridge derives it)");
                }
                provider.pinnedAsOf = asOf;
                provider.pinnedSchema = snap.get("schema").asText();
            }
            List<Types.Col> output = Types.select(target, opts.columns, "table '" + opts.table + "'");
            return new TerrascaleScan.Builder(opts, asOf, target, output, plans);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            Table py = provider.python().getTable(schema, partitioning, properties);
            return ((SupportsWrite) py).newWriteBuilder(info);
        }
    }
}
