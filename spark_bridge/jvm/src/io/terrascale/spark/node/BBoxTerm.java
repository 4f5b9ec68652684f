package io.terrascale.spark.node;

import java.io.Serializable;

/** A {@code bbox} as the node's API takes it: a point or box column and the edges, inclusive. */
public record BBoxTerm(String column, double xmin, double ymin, double xmax, double ymax) implements Serializable {}
