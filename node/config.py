"""Node configuration: TOML (docs/REFERENCE.md §5) or the embedded defaults under a data dir.

Parsed with the standard library's ``tomllib`` into frozen dataclasses;
every key is checked, and an unknown key or bad value is a ConfigError whose
one-line message names the key.
"""
from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from node.errors import ConfigError
from rowstore.reads.buckets import DURATION, DURATION_S

_SIZE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_UNITS = {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_DUR, _DUR_S = DURATION, DURATION_S  # one grammar with aggregate buckets (rowstore.reads.buckets)


def parse_size(key: str, v: object) -> int:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    m = _SIZE.match(str(v)) if isinstance(v, str) else None
    if not m:
        raise ConfigError(f"{key}: expected a size like 64KiB or 256MiB, got {v!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


def parse_duration(key: str, v: object) -> float:
    m = _DUR.match(v) if isinstance(v, str) else None
    if not m:
        raise ConfigError(f"{key}: expected a duration like 7d, 12h or 30s, got {v!r}")
    return int(m.group(1)) * _DUR_S[m.group(2)]


def parse_listen(key: str, v: object) -> tuple[str, int]:
    host, sep, port = str(v).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected HOST:PORT, got {v!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class NodeConfig:
    node_id: str = "n1"
    listen: tuple[str, int] = ("127.0.0.1", 7400)
    advertise: str | None = None  # HOST:PORT other nodes use to reach this one (default: listen)
    max_body: int = 64 << 20  # request bodies above this are refused with 413
    max_json_depth: int = 64  # JSON bodies nested deeper are refused with 400
    max_query_terms: int = 256  # where terms of one query; more are refused with 413
    shutdown_timeout_s: float = 30.0
    handshake_timeout_s: float = 10.0  # a connection (HTTP or Raft) that has not sent a request head / authenticated
    max_pending_connections: int = 256  # such connections open at once, per port; more are closed at accept
    block: str = "trfs://./data/block"
    volatile: str = "trfs://./data/cache"
    objects: str = "trfs://./data/objects"
    catalog: str = "trkv://./data/catalog"
    catalog_secret_file: str | None = None
    catalog_dir: str | None = None
    seal_bytes: int = 256 << 20
    columnar: bool = True  # offloaded segments columnar (docs/format/segment.md §7, RFC 0014)
    flush_bytes: int = 64 << 10
    flush_ms: float = 2.0
    token: str | None = None
    encryption_key_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    retention_s: float = 7 * 86400
    purge_lag_s: float = 5.0
    partitions: int = 8
    replicas: int = 1
    memtable_bytes: int = 64 << 20
    column_cache_bytes: int = 256 << 20  # built column-index runs kept in memory (all partitions)
    checkpoint_every_s: float = 1.0
    offload_every_s: float = 5.0
    seal_every_s: float = 0.0  # 0: segments seal only when they reach seal_bytes
    gc_interval_s: float = 60.0  # 0: no background garbage-collection pass
    gc_min_garbage: float = 0.5
    gc_grace_s: float = 300.0
    gc_max_bytes_per_run: int = 1 << 30
    heartbeat_s: float = 0.5  # replication: how often a node says it is alive (node/alive/<id>)
    failure_timeout_s: float = 2.0  # a node silent this long is dead; its partitions fail over
    ack_timeout_s: float = 10.0  # a write waiting this long for a majority answers 503
    subscriptions_max: int = 1024  # open subscriptions per node; more are 429 (docs/rfcs/0015-subscriptions.md)
    subscription_buffer_bytes: int = 16 << 20  # changes queued for one subscriber; beyond, it is ended
    subscription_progress_s: float = 1.0  # {"closed": T} at least this often


def _str(key: str, v: object) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{key}: expected a non-empty string, got {v!r}")
    return v


def _flag(key: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{key}: expected true or false, got {v!r}")
    return v


def _num(key: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise ConfigError(f"{key}: expected a non-negative number, got {v!r}")
    return float(v)


def _read_token(key: str, v: object) -> str:
    try:
        with open(_str(key, v)) as f:
            tok = f.read().strip()
    except OSError as e:
        raise ConfigError(f"{key}: cannot read {v}: {e.strerror}") from None
    if not tok:
        raise ConfigError(f"{key}: {v} is empty")
    return tok


def _readable(key: str, v: object) -> str:
    path = _str(key, v)
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{key}: cannot read {path}")
    return path


def _fraction(key: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ConfigError(f"{key}: expected a number from 0 to 1, got {v!r}")
    return float(v)


def _positive(key: str, v: float) -> float:
    if v <= 0:
        raise ConfigError(f"{key}: must be more than 0s")
    return v


def _count(key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
        raise ConfigError(f"{key}: expected an integer 1..1000000, got {v!r}")
    return v


def _int_in(lo: int, hi: int) -> Callable[[str, object], int]:
    def parse(key: str, v: object) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ConfigError(f"{key}: expected an integer {lo}..{hi}, got {v!r}")
        return v
    return parse


def _partitions(key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 256:
        raise ConfigError(f"{key}: expected an integer 1..256, got {v!r}")
    return v


MAX_REPLICAS = 7


def _replicas(key: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_REPLICAS:
        raise ConfigError(f"{key}: expected an integer 1..{MAX_REPLICAS}, got {v!r}")
    return v


# section -> key -> (field name, parser of the TOML value)
_SCHEMA: dict[str, dict[str, tuple[str, Callable[[str, object], object]]]] = {
    "node": {"id": ("node_id", lambda k, v: _str(k, v)), "listen": ("listen", parse_listen),
             "advertise": ("advertise", lambda k, v: "%s:%d" % parse_listen(k, v)),
             "max_body": ("max_body", parse_size),
             "max_json_depth": ("max_json_depth", _int_in(8, 500)),  # rows of points need 4; < recursion limit
             "max_query_terms": ("max_query_terms", _int_in(1, 100_000)),
             "shutdown_timeout": ("shutdown_timeout_s", parse_duration),
             "handshake_timeout": ("handshake_timeout_s", lambda k, v: _positive(k, parse_duration(k, v))),
             "max_pending_connections": ("max_pending_connections", _count)},
    "storage": {"block": ("block", lambda k, v: _str(k, v)), "volatile": ("volatile", lambda k, v: _str(k, v)),
                "objects": ("objects", lambda k, v: _str(k, v))},
    "catalog": {"uri": ("catalog", lambda k, v: _str(k, v)),
                "secret_file": ("catalog_secret_file", lambda k, v: _str(k, v)),
                "dir": ("catalog_dir", lambda k, v: _str(k, v))},
    "segments": {"seal_bytes": ("seal_bytes", parse_size), "flush_bytes": ("flush_bytes", parse_size),
                 "columnar": ("columnar", _flag),
                 "flush_ms": ("flush_ms", lambda k, v: _num(k, v))},
    "security": {"token": ("token", lambda k, v: _str(k, v)), "token_file": ("token", _read_token),
                 "encryption_key_file": ("encryption_key_file", lambda k, v: _str(k, v)),
                 "tls_cert": ("tls_cert", _readable), "tls_key": ("tls_key", _readable)},
    "history": {"retention": ("retention_s", parse_duration), "purge_lag": ("purge_lag_s", parse_duration)},
    "tables": {"partitions": ("partitions", _partitions), "replicas": ("replicas", _replicas),
               "memtable_bytes": ("memtable_bytes", parse_size),
               "column_cache_bytes": ("column_cache_bytes", parse_size)},
    "jobs": {"checkpoint_every": ("checkpoint_every_s", parse_duration),
             "offload_every": ("offload_every_s", parse_duration),
             "seal_every": ("seal_every_s", parse_duration)},
    "cluster": {"heartbeat": ("heartbeat_s", lambda k, v: _positive(k, parse_duration(k, v))),
                "failure_timeout": ("failure_timeout_s", lambda k, v: _positive(k, parse_duration(k, v))),
                "ack_timeout": ("ack_timeout_s", lambda k, v: _positive(k, parse_duration(k, v)))},
    "subscriptions": {"max": ("subscriptions_max", _count),
                      "buffer_bytes": ("subscription_buffer_bytes",
                                       lambda k, v: int(_positive(k, parse_size(k, v)))),
                      "progress_every": ("subscription_progress_s", lambda k, v: _positive(k, parse_duration(k, v)))},
    "gc": {"interval": ("gc_interval_s", parse_duration), "min_garbage": ("gc_min_garbage", _fraction),
           "grace": ("gc_grace_s", parse_duration),
           "max_bytes_per_run": ("gc_max_bytes_per_run", lambda k, v: int(_positive(k, parse_size(k, v))))},
}


def defaults(data_dir: str = "./data") -> NodeConfig:
    """The embedded defaults under ``data_dir`` (docs/REFERENCE.md §1)."""
    d = data_dir.rstrip("/") or "."
    pre = "trfs://" + (d if d.startswith("/") else "./" + d.removeprefix("./"))
    kv = "trkv://" + (d if d.startswith("/") else "./" + d.removeprefix("./"))
    return NodeConfig(block=f"{pre}/block", volatile=f"{pre}/cache", objects=f"{pre}/objects",
                      catalog=f"{kv}/catalog")


def load(path: str) -> NodeConfig:
    """Read and validate a TOML config file."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"--config: cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config: {path} is not valid TOML: {e}") from None
    return from_dict(doc)


def from_dict(doc: dict[str, Any]) -> NodeConfig:
    values: dict[str, Any] = {}
    for section, body in doc.items():
        if section not in _SCHEMA:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(_SCHEMA)})")
        if not isinstance(body, dict):
            raise ConfigError(f"{section}: expected a table")
        for key, v in body.items():
            full = f"{section}.{key}"
            if key not in _SCHEMA[section]:
                raise ConfigError(f"{full}: unknown key")
            name, parse = _SCHEMA[section][key]
            values[name] = parse(full, v)
    cfg = NodeConfig(**values)
    if cfg.catalog.startswith("raft://"):
        _check_raft(cfg)
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise ConfigError("security.tls_cert: tls_cert and tls_key go together")
    if cfg.encryption_key_file and not os.path.exists(cfg.encryption_key_file):
        raise ConfigError(f"security.encryption_key_file: {cfg.encryption_key_file} does not exist")
    return cfg


def _check_raft(cfg: NodeConfig) -> None:
    """raft:// needs a well-formed member list with self=, a readable secret and a dir."""
    from catalog.errors import CatalogConfigError
    from catalog.raft import parse_raft_uri, read_secret

    if not cfg.catalog_secret_file:
        raise ConfigError("catalog.secret_file: required with a raft:// catalog")
    try:
        parse_raft_uri(cfg.catalog)
    except CatalogConfigError as e:
        raise ConfigError(f"catalog.uri: {e}") from None
    if not cfg.catalog_dir:
        raise ConfigError("catalog.dir: required with a raft:// catalog (journal and snapshots)")
    try:
        read_secret(cfg.catalog_secret_file)
    except CatalogConfigError as e:
        raise ConfigError(str(e)) from None
