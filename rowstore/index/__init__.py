"""Indexes over rowids: the primary-key LSM (memtable, runs, levels) and the column index."""
