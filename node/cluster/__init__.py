"""Cluster control: members and calls between nodes (``members``), placement, routing and
the cross-node commit, the placement controller (elections, failover), rebalancing, one-copy
hand-offs and the replication transport. Imports no HTTP route module."""
