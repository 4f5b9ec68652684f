package io.terrascale.spark.node;

import io.terrascale.spark.format.Schema;

/** {@code GET /v1/tables/{t}/snapshot}: the read timestamp T and the table's schema at T. */
public record Snapshot(long asOf, Schema schema) {}
