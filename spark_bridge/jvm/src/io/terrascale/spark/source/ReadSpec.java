package io.terrascale.spark.source;

import io.terrascale.spark.format.Column;
import io.terrascale.spark.format.Predicates;
import io.terrascale.spark.format.Schema;
import io.terrascale.spark.node.WhereTerm;
import java.io.Serializable;
import java.util.List;

/**
 * What every task of one scan needs, planned on the driver and shipped with the reader factory:
 * the timestamp and lease, the object store, the schema versions rows may have, the columns to
 * output, the predicates (typed, for segments; as the API takes them, for tails) and the
 * segments the plan reads from objects (a tail leaves exactly those out).
 */
record ReadSpec(Options opts, long asOf, String lease, String objects, List<Schema> versions, Schema target,
                List<Column> output, Predicates preds, List<WhereTerm> where, long[] sealed, boolean countOnly)
        implements Serializable {
    ReadSpec {
        versions = List.copyOf(versions);
        output = List.copyOf(output);
        where = List.copyOf(where);
        sealed = sealed.clone();
    }
}
