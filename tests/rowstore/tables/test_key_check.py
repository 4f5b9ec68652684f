"""Primary keys: one check against the key column's type before any encoding; the encoders
never wrap; every read and write path refuses a key outside its type and changes nothing."""
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from rowstore.errors import InvalidKeyError, RowValidationError
from rowstore.tables.key_check import INT64_MAX, INT64_MIN, MAX_KEY_BYTES, check_key, check_keys, show
from rowstore.tables.keys import encode_keys, encode_one, string_keys
from rowstore.schema import Column
from rowstore.types import ColumnType
from tests.rowstore.tables_world import TablesWorld

I64, STR, UU = (Column(1, "id", ColumnType.parse(t), False) for t in ("int64", "string", "uuid"))
U = "12345678-1234-5678-1234-567812345678"



def _id(v) -> str:
    return str(v.type) if isinstance(v, Column) else show(v)[:30]


GOOD = [
    (I64, INT64_MIN, INT64_MIN), (I64, INT64_MAX, INT64_MAX), (I64, 0, 0), (I64, np.int64(-3), -3),
    (I64, "-9223372036854775808", INT64_MIN), (I64, "9223372036854775807", INT64_MAX), (I64, "+5", 5),
    (I64, "0007", 7),
    (STR, "", ""), (STR, "héllo ✓", "héllo ✓"), (STR, "x" * MAX_KEY_BYTES, "x" * MAX_KEY_BYTES),
    (STR, "é" * (MAX_KEY_BYTES // 2), "é" * (MAX_KEY_BYTES // 2)), (STR, "a/b?c#d%", "a/b?c#d%"),
    (UU, U, uuid.UUID(U).bytes), (UU, U.upper(), uuid.UUID(U).bytes), (UU, uuid.UUID(U).bytes, uuid.UUID(U).bytes),
]
BAD = [
    (I64, INT64_MAX + 1), (I64, INT64_MIN - 1), (I64, 2**64 + 5), (I64, -(2**64) - 5), (I64, 10**5000),
    (I64, "9223372036854775808"), (I64, "-9223372036854775809"), (I64, "18446744073709551621"), (I64, "9" * 5000),
    (I64, True), (I64, False), (I64, np.bool_(True)), (I64, 5.0), (I64, 5.5), (I64, float("nan")),
    (I64, float("inf")), (I64, "5.0"), (I64, "1e3"), (I64, " 5"), (I64, "5 "), (I64, "1_000"), (I64, "٥"),
    (I64, "５"), (I64, "²"), (I64, ""), (I64, "-"), (I64, "0x10"), (I64, [5]), (I64, {"id": 5}), (I64, b"5"),
    (STR, "x" * (MAX_KEY_BYTES + 1)), (STR, "é" * (MAX_KEY_BYTES // 2 + 1)), (STR, "x" * 10_000_000),
    (STR, "a\0b"), (STR, "\ud800"), (STR, 5), (STR, True), (STR, b"abc"), (STR, ["a"]),
    (UU, "{" + U + "}"), (UU, "urn:uuid:" + U), (UU, U.replace("-", "")), (UU, U[:-1]), (UU, U + "0"),
    (UU, U[:-1] + "g"), (UU, " " + U), (UU, U[:8] + "_" + U[9:]), (UU, U.replace("1", "١")), (UU, ""),
    (UU, b"\x01" * 15), (UU, b"\x01" * 17), (UU, 5), (UU, uuid.UUID(U)),
]


@pytest.mark.parametrize("col,value,want", GOOD, ids=lambda v: _id(v))
def test_keys_of_the_type_are_taken_as_their_canonical_value(col, value, want):
    assert check_key(value, col) == want
    assert check_keys([value], col).to_pylist() == [want]


@pytest.mark.parametrize("col,value", BAD, ids=lambda v: _id(v))
def test_keys_outside_the_type_are_refused_naming_the_key(col, value):
    with pytest.raises(InvalidKeyError) as e:
        check_key(value, col)
    msg = str(e.value)
    assert "'id'" in msg and len(msg) < 400  # names the column, quotes the key, cut to a readable length
    with pytest.raises(InvalidKeyError, match=r"^keys\[1\]: "):
        check_keys([check_key(GOOD_OF[col], col), value], col)


GOOD_OF = {I64: 1, STR: "a", UU: U}


def test_text_is_a_key_only_where_keys_come_as_text():
    assert check_key("5", I64) == 5
    with pytest.raises(InvalidKeyError):
        check_key("5", I64, text=False)


def test_arrow_keys_are_checked_vectorized():
    assert check_keys(pa.array([1, 2], pa.int32()), I64).type == pa.int64()
    assert check_keys(pa.array([2**63 - 1], pa.uint64()), I64).to_pylist() == [2**63 - 1]
    for arr, col in [(pa.array([0, 2**64 - 1], pa.uint64()), I64), (pa.array([1.0]), I64),
                     (pa.array(["1"]), I64), (pa.array(["a", "x" * (MAX_KEY_BYTES + 1)]), STR),
                     (pa.array(["a", "b\0"]), STR), (pa.array([1]), STR), (pa.array([U, "nope"]), UU),
                     (pa.array([b"\x01" * 15], pa.binary()), UU), (pa.array([1]), UU)]:
        with pytest.raises(InvalidKeyError):
            check_keys(arr, col)
    with pytest.raises(RowValidationError):  # a row without a key: not a key error, still refused
        check_keys(pa.array([1, None], pa.int64()), I64)


def test_invalid_utf8_in_an_arrow_string_key_is_refused():
    good = pa.array(["ab"])
    bad = pa.Array.from_buffers(pa.string(), 1, [None, good.buffers()[1], pa.py_buffer(b"\xff\xfe")])
    with pytest.raises(InvalidKeyError):
        check_keys(bad, STR)


@given(st.integers(min_value=-(2**70), max_value=2**70))
@settings(max_examples=300, deadline=None)
def test_int64_keys_are_taken_exactly_when_in_range(v):
    ok = INT64_MIN <= v <= INT64_MAX
    for value in (v, str(v)):
        if ok:
            assert check_key(value, I64) == v
            assert encode_one(v, "int64") == encode_keys(pa.array([v], pa.int64()), "int64")[0]
        else:
            with pytest.raises(InvalidKeyError):
                check_key(value, I64)
            with pytest.raises(InvalidKeyError):
                encode_one(v, "int64")  # the encoder refuses too: it never wraps


@given(st.lists(st.integers(min_value=INT64_MIN, max_value=INT64_MAX), min_size=2, max_size=20, unique=True))
@settings(max_examples=100, deadline=None)
def test_int64_encoding_preserves_order_across_the_whole_range(vs):
    enc = [encode_one(v, "int64") for v in vs]
    assert sorted(range(len(vs)), key=lambda i: vs[i]) == sorted(range(len(vs)), key=lambda i: enc[i])
    assert all(0 <= e < 2**64 for e in enc)


@given(st.text(max_size=600))
@settings(max_examples=200, deadline=None)
def test_string_keys_are_taken_exactly_when_they_fit(s):
    try:
        n = len(s.encode())
    except UnicodeEncodeError:
        n = None
    if n is not None and n <= MAX_KEY_BYTES and "\0" not in s:
        assert check_key(s, STR) == s and encode_one(s, "string") == s.encode()
    else:
        with pytest.raises(InvalidKeyError):
            check_key(s, STR)


def test_encoders_never_wrap_or_truncate():
    for v in (INT64_MAX + 1, INT64_MIN - 1, 2**64 + 5, -(2**64)):
        with pytest.raises(InvalidKeyError):
            encode_one(v, "int64")
    with pytest.raises(InvalidKeyError):
        encode_keys(pa.array([2**64 - 1], pa.uint64()), "int64")  # not silently reinterpreted
    with pytest.raises(InvalidKeyError):
        encode_keys(pa.array([1.0]), "int64")
    for b in (b"\x01", b"\x01" * 17):
        with pytest.raises(InvalidKeyError):
            encode_one(b, "uuid")
    with pytest.raises(InvalidKeyError):
        encode_keys(pa.array([b"\x01"], pa.binary()), "uuid")
    with pytest.raises(InvalidKeyError):
        encode_one("x" * (MAX_KEY_BYTES + 1), "string")
    with pytest.raises(InvalidKeyError):  # never allocates n x a huge key
        string_keys(pa.array(["a"] * 1000 + ["x" * 50_000_000]))


# -- every path of a real table -------------------------------------------------------------------


async def _tables():
    w = TablesWorld(4)
    db = await w.start()
    await db.create_table("ki", "id int64 primary key, v string")
    await db.create_table("ks", "id string primary key, v string")
    await db.create_table("ku", "id uuid primary key, v string")
    await db.upsert("ki", pa.table({"id": pa.array([5, INT64_MIN, INT64_MAX, -5], pa.int64()),
                                    "v": ["five", "min", "max", "minus five"]}))
    await db.upsert("ks", pa.table({"id": ["a", "x" * MAX_KEY_BYTES], "v": ["a", "long"]}))
    await db.upsert("ku", pa.table({"id": pa.array([uuid.UUID(U).bytes], pa.binary(16)), "v": ["u"]}))
    return db


async def _state(db):
    return [(await db.read_all(t))[0] for t in ("ki", "ks", "ku")]


async def test_boundary_keys_are_their_own_rows():
    db = await _tables()
    assert (await db.get("ki", INT64_MIN))["v"] == "min" and (await db.get("ki", INT64_MAX))["v"] == "max"
    assert (await db.get("ki", "9223372036854775807"))["v"] == "max"
    assert (await db.get("ks", "x" * MAX_KEY_BYTES))["v"] == "long"
    assert (await db.get("ku", U.upper()))["v"] == "u"
    t = await db.get_many("ki", [INT64_MAX, INT64_MIN, 5])
    assert sorted(t.column("v").to_pylist()) == ["five", "max", "min"]
    t, _ = await db.query("ki", where=[["id", ">=", INT64_MAX]])
    assert t.column("v").to_pylist() == ["max"]
    t, _ = await db.query("ki", where=[["id", "<=", str(INT64_MIN)]])
    assert t.column("v").to_pylist() == ["min"]


BAD_BY_TABLE = {
    "ki": [2**64 + 5, 2**64 - 5, INT64_MAX + 1, INT64_MIN - 1, "18446744073709551621", "٥", 5.0, 5.5, True,
           "5.0", 10**400],
    "ks": ["x" * (MAX_KEY_BYTES + 1), "a\0", "\udc80", 5, b"a"],
    "ku": ["{" + U + "}", U.replace("-", ""), "urn:uuid:" + U, b"\x01" * 15, "nope", 5],
}


@pytest.mark.parametrize("table", sorted(BAD_BY_TABLE))
async def test_every_path_refuses_a_key_outside_its_type_and_changes_nothing(table):
    db = await _tables()
    before = await _state(db)
    for k in BAD_BY_TABLE[table]:
        for call in (lambda k=k: db.get(table, k), lambda k=k: db.get_many(table, [k]),
                     lambda k=k: db.delete(table, [k]), lambda k=k: db.read_all(table, start=[k]),
                     lambda k=k: db.query(table, where=[["id", "=", k]])):
            with pytest.raises(InvalidKeyError):
                await call()
        try:
            batch = pa.table({"id": [k], "v": ["overwritten"]})
        except (pa.ArrowException, OverflowError, UnicodeError):
            continue  # not even an Arrow column: no upsert to try
        with pytest.raises(InvalidKeyError):
            await db.upsert(table, batch)
    assert [a.equals(b) for a, b in zip(before, await _state(db))] == [True] * 3
    assert (await db.get("ki", 5))["v"] == "five"
