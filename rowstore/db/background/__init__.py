"""Background work on the partitions served here: checkpoints, merges, seal, offload and
watermarks (maintenance), and copy-forward garbage collection (RFC 0009)."""
