"""Route sets beside the data API, one module each: the Spark bridge's, the calls nodes make
on each other (internal, replication, hand-off) and cluster membership."""
