"""Replication of a partition's active segments to its followers (docs/rfcs/0010-replication.md
§5, docs/format/replication.md): the log position, a follower's copies, the leader's shipping."""
