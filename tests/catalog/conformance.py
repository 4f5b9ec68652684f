"""Conformance suite every Catalog backend runs (memory, trkv://, later raft://).

A subclass provides an async fixture ``make`` yielding an opened catalog, and
for durable backends ``reopen(cat)`` returning a fresh instance on the same store.
"""
from __future__ import annotations

import asyncio

import pytest

from catalog.abc import MAX_KEY_BYTES, MAX_TXN_OPS, MAX_VALUE_BYTES, Check, Delete, Put
from catalog.errors import InvalidTransactionError


class CatalogSuite:
    durable = False

    async def test_put_get_versions(self, make):
        c = make
        assert await c.revision() == 0 and await c.get("a") is None
        r = await c.txn(ops=[Put("a", b"1"), Put("b", b"2")])
        assert r.committed and r.revision == 1
        e = await c.get("a")
        assert (e.value, e.version) == (b"1", 1)
        r = await c.txn(ops=[Put("a", b"3")])
        assert (await c.get("a")).version == 2 and (await c.get("b")).version == 1
        await c.txn(ops=[Delete("a"), Delete("zzz")])
        assert await c.get("a") is None and await c.revision() == 3
        assert (await c.get_many(["a", "b"])).keys() == {"b"}

    async def test_checks_all_or_nothing(self, make):
        c = make
        await c.txn(ops=[Put("x", b"1")])
        r = await c.txn([Check("x", 1), Check("y", 0)], [Put("x", b"2"), Put("y", b"n")])
        assert r.committed
        r = await c.txn([Check("x", 1), Check("y", 0), Check("w", 0)], [Put("x", b"3"), Put("z", b"z")])
        assert not r.committed and set(r.conflicts) == {"x", "y"}
        assert (await c.get("x")).value == b"2" and await c.get("z") is None
        assert await c.revision() == 2

    async def test_scan(self, make):
        c = make
        keys = ["a/1", "a/2", "a/3", "a0", "b/1", "é/1", "a/\u4e2d"]
        await c.txn(ops=[Put(k, k.encode()) for k in keys])
        assert [e.key for e in await c.scan("a/")] == ["a/1", "a/2", "a/3", "a/\u4e2d"]
        assert [e.key for e in await c.scan("a/", start="a/2")] == ["a/2", "a/3", "a/\u4e2d"]
        assert [e.key for e in await c.scan("a/", end="a/3")] == ["a/1", "a/2"]
        assert [e.key for e in await c.scan("a/", limit=2, reverse=True)] == ["a/\u4e2d", "a/3"]
        assert [e.key for e in await c.scan()] == sorted(keys, key=lambda k: k.encode())
        assert [e.key for e in await c.scan("a/", end="a/1")] == []
        assert [e.key for e in await c.scan(end="a/2", reverse=True, limit=1)] == ["a/1"]

    async def test_request_id_applies_once(self, make):
        c = make
        r1 = await c.txn([Check("n", 0)], [Put("n", b"1")], request_id="req-1")
        r2 = await c.txn([Check("n", 0)], [Put("n", b"1")], request_id="req-1")
        assert r1 == r2 and r1.committed and await c.revision() == 1
        assert await c.outcome("req-1") == r1
        assert await c.outcome("unknown") is None
        f1 = await c.txn([Check("n", 0)], [Put("n", b"2")], request_id="req-2")
        assert not f1.committed and await c.outcome("req-2") == f1

    async def test_limits_change_nothing(self, make):
        c = make
        bad = [
            ([], [Put("", b"x")]),
            ([], [Put("k" * (MAX_KEY_BYTES + 1), b"x")]),
            ([], [Put("k", b"x" * (MAX_VALUE_BYTES + 1))]),
            ([], [Put(f"k{i}", b"") for i in range(MAX_TXN_OPS + 1)]),
            ([], [Put("k", b"1"), Delete("k")]),
            ([], [Put(f"k{i}", b"x" * 16000) for i in range(4)]),
            ([Check("k", -1)], []),
            ([], [Put("a\x00b", b"")]),
            ([], [Put("k", "not bytes")]),
        ]
        for checks, ops in bad:
            with pytest.raises(InvalidTransactionError):
                await c.txn(checks, ops)
        with pytest.raises(InvalidTransactionError):
            await c.txn(ops=[Put("k", b"")], request_id="x" * 65)
        assert await c.revision() == 0 and await c.scan() == []

    async def test_concurrent_compare_and_set(self, make):
        c = make
        await c.txn(ops=[Put("counter", b"0")])

        async def incr():
            while True:
                e = await c.get("counter")
                r = await c.txn([Check("counter", e.version)], [Put("counter", str(int(e.value) + 1).encode())])
                if r.committed:
                    return

        await asyncio.gather(*(incr() for _ in range(40)))
        assert (await c.get("counter")).value == b"40"

    async def test_durable_across_reopen(self, make, reopen):
        if not self.durable:
            return
        c = make
        for i in range(50):
            await c.txn(ops=[Put(f"k/{i:03d}", b"v%d" % i)], request_id=f"r{i}")
        await c.txn(ops=[Delete("k/007")])
        c2 = await reopen(c)
        assert await c2.revision() == 51
        assert len(await c2.scan("k/")) == 49 and await c2.get("k/007") is None
        assert (await c2.get("k/049")).version == 50
        r = await c2.txn(ops=[Put("again", b"")], request_id="r3")
        assert r.revision == 4 and await c2.get("again") is None  # remembered across restart
