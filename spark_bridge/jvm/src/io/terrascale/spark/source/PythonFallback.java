package io.terrascale.spark.source;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * What the JVM reader hands to the Python data source (writes, the change feed, {@code reader=python}),
 * which {@code spark_bridge.register} registers as {@value #NAME}. It is reached through Spark's own
 * {@code PythonDataSourceV2}, a class internal to Spark — the only one this reader uses, and the
 * reason pyproject.toml pins pyspark to one minor version (tests/spark_bridge/test_pyspark_pin.py).
 */
final class PythonFallback {
    static final String NAME = "terrascale_python";

    private PythonDataSourceV2 source; // made on first use: most reads never need it

    private synchronized PythonDataSourceV2 source() {
        if (source == null) {
            PythonDataSourceV2 s = new PythonDataSourceV2();
            s.setShortName(NAME);
            source = s;
        }
        return source;
    }

    StructType inferSchema(CaseInsensitiveStringMap options) {
        return source().inferSchema(options);
    }

    Table table(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return source().getTable(schema, partitioning, properties);
    }
}
