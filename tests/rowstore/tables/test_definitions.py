"""Schema history: describe as of T sees the columns and names of T; drop and re-create."""
import asyncio

import pytest

from catalog.memory import MemoryCatalog
from rowstore.errors import ConflictError, SchemaError, TableExistsError, TableNotFoundError
from rowstore.hlc import HybridClock
from rowstore.tables.definitions import TableCatalog


async def tables():
    cat = MemoryCatalog()
    clock = HybridClock(cat, "n1")
    await clock.open()
    return TableCatalog(cat, clock)


def cols(d):
    return [(c.name, str(c.type)) for c in d.schema.columns]


async def test_history_of_a_table():
    tc = await tables()
    t1 = await tc.create("sensors", "id int64 primary key, temp float64, loc point", ["loc"], partitions=4)
    t2 = await tc.alter("sensors", lambda s: s.add_column("hum", "float32"))
    t3 = await tc.alter("sensors", lambda s: s.rename_column("temp", "celsius"))
    t4 = await tc.alter("sensors", lambda s: s.drop_column("loc"))
    assert cols(await tc.describe("sensors", t1.ts)) == [("id", "int64"), ("temp", "float64"), ("loc", "point")]
    assert cols(await tc.describe("sensors", t3.ts - 1)) == cols(t2)
    assert cols(await tc.describe("sensors", t3.ts)) == [("id", "int64"), ("celsius", "float64"),
                                                         ("loc", "point"), ("hum", "float32")]
    now = await tc.describe("sensors")
    assert cols(now) == cols(t4) and now.indexes == () and t1.index_names() == ["loc"]
    with pytest.raises(TableNotFoundError):
        await tc.describe("sensors", t1.ts - 1)
    lookup = await tc.schemas(now)
    assert [lookup(v).version for v in now.history] == [1, 2, 3, 4]


async def test_drop_and_recreate_is_a_new_table():
    tc = await tables()
    a = await tc.create("t", "id int64 primary key, v string")
    d = await tc.drop("t")
    with pytest.raises(TableNotFoundError):
        await tc.describe("t")
    assert (await tc.describe("t", d.ts - 1)).table_id == a.table_id
    b = await tc.create("t", "id string primary key, w int32")
    assert b.table_id != a.table_id and b.history == (1,)
    assert [t.name for t in await tc.list()] == ["t"]
    assert await tc.list(as_of=d.ts) == []
    assert (await tc.schemas(a))(1).by_name("v") is not None
    assert (await tc.schemas(b))(1).by_name("w") is not None


async def test_a_table_created_by_another_node_is_found_after_a_cached_miss():
    """Node 2 cached "t" as dropped (or absent); node 1 (re)creates it without telling node
    2: node 2's next lookup reads the catalog again instead of answering not found."""
    one = await tables()
    two = TableCatalog(one.catalog, HybridClock(one.catalog, "n2"))
    await two.clock.open()
    with pytest.raises(TableNotFoundError):
        await two.describe("t")  # absent, cached
    a = await one.create("t", "id int64 primary key, v string")
    assert (await two.describe("t")).table_id == a.table_id
    await one.drop("t")
    two.forget("t")  # the drop is announced
    with pytest.raises(TableNotFoundError):
        await two.describe("t")  # dropped, cached
    gen = two.generation
    with pytest.raises(TableNotFoundError):
        await two.describe("t")  # a miss that finds nothing new keeps the other tables' caches
    assert two.generation == gen
    b = await one.create("t", "id string primary key, w int32")
    assert (await two.describe("t")).table_id == b.table_id and two.generation > gen


async def test_errors_and_races():
    tc = await tables()
    await tc.create("t", "id int64 primary key")
    with pytest.raises(TableExistsError):
        await tc.create("t", "id int64 primary key")
    with pytest.raises(SchemaError):
        await tc.create("u", "id int64 primary key", ["nope"])
    with pytest.raises(SchemaError):
        await tc.create("bad name", "id int64 primary key")
    results = await asyncio.gather(*(tc.alter("t", lambda s, i=i: s.add_column(f"c{i}", "int8"))
                                     for i in range(5)), return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    assert len(ok) >= 1 and all(isinstance(r, ConflictError) for r in results if isinstance(r, Exception))
    assert len((await tc.describe("t")).schema.columns) == 1 + len(ok)
