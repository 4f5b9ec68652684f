"""The node's Prometheus metrics (one registry per node, so tests can run several)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LAT = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("terrascale_http_requests_total", "HTTP requests by route and status",
                                ["method", "route", "status"], registry=r)
        self.latency = Histogram("terrascale_http_request_seconds", "HTTP request latency by route",
                                 ["method", "route"], buckets=_LAT, registry=r)
        self.in_flight = Gauge("terrascale_http_requests_in_flight", "HTTP requests being served", registry=r)
        self.forwarded = Counter("terrascale_http_forwarded_total", "Requests forwarded to the owning node",
                                 ["owner"], registry=r)
        self.rows_written = Counter("terrascale_rows_written_total", "Rows upserted or deleted", ["op"],
                                    registry=r)
        self.write_wait = Histogram("terrascale_write_commit_seconds",
                                    "Time from a batch's arrival in the engine to durable and visible "
                                    "(encode + group-commit flush wait)", buckets=_LAT, registry=r)
        self.batch_rows = Histogram("terrascale_write_batch_rows", "Rows per write batch",
                                    buckets=(1, 10, 100, 1000, 10_000, 100_000, 1_000_000), registry=r)
        self.write_path = Counter("terrascale_write_requests_total", "Row writes (upserts and deletes) by path: "
                                  "coalesced (fast encoder, merged with concurrent requests) or full",
                                  ["path"], registry=r)
        self.group_requests = Histogram("terrascale_write_group_requests", "Requests per coalesced write group",
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=r)
        self.queue_seconds = Counter("terrascale_write_queue_seconds_total", "Coalesced requests' total wait "
                                     "for their group to start", registry=r)
        self.write_stage = Counter("terrascale_write_stage_seconds_total", "Time spent in each stage of the "
                                   "coalesced write path (parse: JSON body; encode: checks and row bytes, per "
                                   "request; commit: a group's engine write until durable and visible)",
                                   ["stage"], registry=r)
        self.flushes = Gauge("terrascale_flushes", "Group-commit flushes of this node's open active files",
                             registry=r)
        self.flushed_bytes = Gauge("terrascale_flushed_bytes", "Bytes flushed (fdatasync'd) by this node's "
                                   "open active files", registry=r)
        self.flush_appends = Gauge("terrascale_flush_appends", "Appends gathered into those flushes",
                                   registry=r)
        self.flush_seconds = Gauge("terrascale_flush_seconds", "Time spent writing and fdatasyncing flush "
                                   "groups (open active files)", registry=r)
        self.device_syncs = Gauge("terrascale_device_fdatasyncs", "fdatasyncs of the durable block device's "
                                  "log device, each making every active file's writes before it durable "
                                  "(RFC 0011)", registry=r)
        self.device_rounds = Gauge("terrascale_device_rounds", "Device rounds: the write groups of every active "
                                   "file that arrived together, written and flushed in one I/O-thread hop "
                                   "(RFC 0011)", registry=r)
        self.device_round_groups = Gauge("terrascale_device_round_groups", "Write groups those device rounds "
                                         "carried", registry=r)
        self.flush_wait_seconds = Gauge("terrascale_flush_wait_seconds", "Appenders' total wait for their "
                                        "group commit (open active files)", registry=r)
        self.device_allocated = Gauge("terrascale_device_allocated_bytes", "Bytes the log device's file holds on "
                                      "its host file system (extents given back after offload are not)",
                                      registry=r)
        self.device_used = Gauge("terrascale_device_used_bytes", "Bytes of the log device's extents that active "
                                 "files use", registry=r)
        self.segments = Gauge("terrascale_segments", "Segments by state", ["state"], registry=r)
        self.files = Gauge("terrascale_files", "TerrascaleFS files by state and tier", ["state", "tier"],
                           registry=r)
        self.cache_ratio = Gauge("terrascale_block_cache_hit_ratio", "Sealed-block cache hit ratio", registry=r)
        self.cache_events = Gauge("terrascale_block_cache_events", "Sealed-block cache lookups by outcome",
                                  ["outcome"], registry=r)
        self.memtable_bytes = Gauge("terrascale_memtable_bytes", "Key and column memtables, all partitions",
                                    registry=r)
        self.write_stalls = Gauge("terrascale_write_stalls_total",
                                  "Writes that waited for a checkpoint: memtables at 4x tables.memtable_bytes",
                                  registry=r)
        self.column_cache_bytes = Gauge("terrascale_column_cache_bytes",
                                        "Built column-index runs held in memory (tables.column_cache_bytes)",
                                        registry=r)
        self.closed_ts = Gauge("terrascale_closed_timestamp", "The closed timestamp (reads see up to it)",
                               registry=r)
        self.job_seconds = Histogram("terrascale_job_seconds", "Background job duration", ["job"],
                                     buckets=_LAT, registry=r)
        self.job_runs = Counter("terrascale_job_runs_total", "Background job runs by outcome",
                                ["job", "trigger", "outcome"], registry=r)
        self.refused = Counter("terrascale_connections_refused_total",
                               "Connections refused or closed before authenticating, by port (http, raft) "
                               "and reason (pending_cap, handshake_timeout, handshake, accept_<errno>)",
                               ["port", "reason"], registry=r)
        self.pending = Gauge("terrascale_connections_pending", "Open connections that have not sent a "
                             "request head (http) yet", ["port"], registry=r)
        self.raft_write_retries = Gauge("terrascale_raft_write_retries",
                                        "Raft meta/journal file writes retried after a transient error",
                                        registry=r)
        self.partitions_led = Gauge("terrascale_partitions_led", "Partitions this node serves (leads), by table "
                                    "(RFC 0010)", ["table"], registry=r)
        self.partition_epoch = Gauge("terrascale_partition_epoch", "Epoch of each partition this node leads",
                                     ["table", "partition"], registry=r)
        self.replica_lag_bytes = Gauge("terrascale_partition_replica_lag_bytes",
                                       "Bytes a follower lacks of a partition this node leads (-1: unreachable)",
                                       ["table", "partition", "replica"], registry=r)
        self.replica_lag_seconds = Gauge("terrascale_partition_replica_lag_seconds",
                                         "Seconds since a follower of a partition led here last answered",
                                         ["table", "partition", "replica"], registry=r)
        self.under_replicated = Gauge("terrascale_partitions_under_replicated",
                                      "Partitions led here with a follower that is unreachable or more than one "
                                      "catch-up message behind", registry=r)
        self.elections = Gauge("terrascale_partition_elections_total", "Elections this node ran, by outcome",
                               ["outcome"], registry=r)
        self.txn_across = Counter("terrascale_txn_across_nodes_total", "Batches spanning nodes this node "
                                  "coordinated, by outcome (committed, failed)", ["outcome"], registry=r)
        self.txn_held = Gauge("terrascale_txn_held", "Shares of batches coordinated elsewhere that this "
                                  "node holds reserved or prepared now", registry=r)
        self.gc_runs = Gauge("terrascale_gc_runs_total", "Garbage-collection passes run", registry=r)
        self.gc_rows_copied = Gauge("terrascale_gc_rows_copied_total", "Live rows copied forward by GC", registry=r)
        self.gc_bytes_reclaimed = Gauge("terrascale_gc_bytes_reclaimed_total", "Bytes of retired segments minus "
                                        "their copies (freed once deleted)", registry=r)
        self.gc_seconds = Gauge("terrascale_gc_run_seconds_total", "Time spent in GC passes", registry=r)
        self.gc_deleted = Gauge("terrascale_gc_segments_deleted_total", "Retired segments deleted", registry=r)
        self.retention_segments = Gauge("terrascale_retention_segments_dropped_total", "Segments retired "
                                        "unread because a table's retention left no row of them live", registry=r)
        self.retention_bytes = Gauge("terrascale_retention_bytes_dropped_total", "Bytes of those segments",
                                     registry=r)
        self.gc_garbage_ratio = Gauge("terrascale_gc_garbage_ratio", "1 - live bytes / bytes over sealed, "
                                      "offloaded and retired segments", registry=r)
        self.ready = Gauge("terrascale_ready", "1 once recovery finished and the node serves", registry=r)
        self.subscriptions = Gauge("terrascale_subscriptions", "Subscriptions open on this node (RFC 0015)",
                                   registry=r)
        self.subscription_frames = Counter("terrascale_subscription_frames_total", "Frames sent to subscribers, "
                                           "by kind (changes, closed, error)", ["kind"], registry=r)
        self.subscription_changes = Counter("terrascale_subscription_changes_total", "Changes sent to "
                                            "subscribers", registry=r)
        self.subscription_bytes = Counter("terrascale_subscription_bytes_total", "Bytes of frames sent to "
                                          "subscribers", registry=r)
        self.subscription_drops = Counter("terrascale_subscription_drops_total", "Subscriptions the node ended, by "
                                          "reason (slow_subscriber, schema_changed, table_dropped, stopping, "
                                          "unavailable) or refused (too_many)", ["reason"], registry=r)
