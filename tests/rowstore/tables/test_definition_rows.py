"""Table definition rows (docs/format/segment.md §5, ``tbl/<name>/v/<ts>``): a row written
before the retention field existed opens with none; one with it round-trips."""
import json

from rowstore.schema import parse_schema
from rowstore.tables.definitions import Retention, TableDef

SV = parse_schema("id int64 primary key, ts timestamp not null")


def test_a_row_from_before_the_retention_opens_without_one():
    old = {"table_id": "a", "partitions": 2, "indexes": [], "history": [SV.version], "cluster_by": None,
           "schema": SV.to_json()}  # the fields of a version written by the previous release
    d = TableDef.from_entry("r", 7, json.dumps(old).encode())
    assert d.retention is None and d.schema == SV and d.ts == 7


def test_a_retention_round_trips_by_column_id():
    d = TableDef("r", "a", 2, (), SV, 7, (SV.version,), None, Retention(SV.by_name("ts").id, 86_400_000_000))
    raw = json.loads(d.to_bytes())
    assert raw["retention"] == {"column": SV.by_name("ts").id, "keep_us": 86_400_000_000}
    assert TableDef.from_entry("r", 7, d.to_bytes()) == d
