"""The floor of the retention's mark pass (docs/rfcs/0016-time-series-aggregates.md §5): the
lowest cutoff any read at or after the horizon applies, over every definition valid since it."""
from rowstore.db.background.aging import floor_of
from rowstore.hlc import ts_from_ms
from rowstore.reads.retention import DAY_US
from rowstore.schema import parse_schema
from rowstore.tables.definitions import Retention, TableDef

SV = parse_schema("id int64 primary key, ts timestamp not null, day date not null, t2 timestamp not null")
TS, DAY, T2 = (SV.by_name(n).id for n in ("ts", "day", "t2"))
H = ts_from_ms(1_000_000_000)
S = 1_000_000  # µs


def _def(at_ms: int, retention: Retention | None, table_id: str = "a") -> TableDef:
    return TableDef("r", table_id, 1, (), SV, ts_from_ms(at_ms), (SV.version,), None, retention)


def test_one_definition_ages_from_the_horizons_wall_time():
    f = floor_of([_def(0, Retention(TS, 60 * S))], _def(0, Retention(TS, 60 * S)), H)
    assert f is not None and f.column.name == "ts" and f.value == 1_000_000_000 * 1000 - 60 * S


def test_a_definition_without_retention_since_the_horizon_keeps_every_row():
    cur = _def(1_000_000_500, Retention(TS, 60 * S))
    assert floor_of([_def(0, None), cur], cur, H) is None  # reads at H use the old, retention-less one
    assert floor_of([_def(0, Retention(TS, 60 * S)), _def(1_000_000_400, None), cur], cur, H) is None
    assert floor_of([_def(0, None), _def(999_000_000, Retention(TS, 60 * S))], cur, H) is not None  # before H


def test_the_lowest_cutoff_wins_a_lengthened_keep_lowers_the_floor():
    short, long_ = _def(0, Retention(TS, 60 * S)), _def(1_000_000_500, Retention(TS, 3600 * S))
    f = floor_of([short, long_], long_, H)
    assert f is not None and f.value == 1_000_000_500 * 1000 - 3600 * S  # the later, longer one's, at its ts


def test_a_retention_moved_to_another_column_ages_nothing_and_other_table_ids_do_not_count():
    a, b = _def(0, Retention(TS, 60 * S)), _def(1_000_000_500, Retention(T2, 60 * S))
    assert floor_of([a, b], b, H) is None
    other = _def(1_000_000_500, None, table_id="old")  # a dropped and re-created name's definitions
    assert floor_of([other, a], a, H) is not None


def test_a_date_column_ages_whole_days():
    d = _def(0, Retention(DAY, 2 * 86_400 * S))
    f = floor_of([d], d, H)
    assert f is not None and f.value == (1_000_000_000 * 1000 - 2 * DAY_US) // DAY_US
