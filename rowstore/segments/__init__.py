"""Segments: the write-ahead framing, active and sealed segments, the segment table,
fetching rows by rowid, and the segment invariants fsck checks."""
