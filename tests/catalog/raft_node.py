"""A catalog node process for the Raft tests: one RaftCatalog behind a JSON-lines control port.

    python -m tests.catalog.raft_node --uri raft://...?self=... --dir D --secret-file F --ctl PORT

Prints ``ready`` once the catalog is open and the control port listens. Each
request is one JSON line ``{"op": ..., ...}``; the answer is ``{"ok": ...}`` or
``{"err": [exception class name, message]}``. SIGTERM closes the catalog cleanly.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import signal
import sys
import time

from catalog.abc import Check, Delete, Put
from catalog.raft import RaftCatalog


def entry(e):
    return None if e is None else [e.key, base64.b64encode(e.value).decode(), e.version]


def result(r):
    return None if r is None else {"committed": r.committed, "revision": r.revision,
                                   "conflicts": list(r.conflicts), "request_id": r.request_id}


def decode_ops(ops):
    out = []
    for o in ops:
        if o[0] == "put":
            out.append(Put(o[1], base64.b64decode(o[2])))
        elif o[0] == "put_str":
            out.append(Put(o[1], o[2]))
        else:
            out.append(Delete(o[1]))
    return out


class Node:
    def __init__(self, cat: RaftCatalog):
        self.cat = cat

    async def op_txn(self, q):
        checks = [Check(k, v) for k, v in q.get("checks", [])]
        return result(await self.cat.txn(checks, decode_ops(q.get("ops", [])), request_id=q.get("rid")))

    async def op_get(self, q):
        return entry(await (self.cat.stale if q.get("stale") else self.cat).get(q["key"]))

    async def op_get_many(self, q):
        got = await self.cat.get_many(q["keys"])
        return {k: entry(e) for k, e in got.items()}

    async def op_scan(self, q):
        src = self.cat.stale if q.get("stale") else self.cat
        return [entry(e) for e in await src.scan(q.get("prefix", ""), start=q.get("start"), end=q.get("end"),
                                                 limit=q.get("limit"), reverse=q.get("reverse", False))]

    async def op_outcome(self, q):
        return result(await self.cat.outcome(q["rid"]))

    async def op_revision(self, q):
        return await (self.cat.stale if q.get("stale") else self.cat).revision()

    async def op_status(self, q):
        return await self.cat.cluster_status()

    async def op_add_member(self, q):
        await self.cat.add_member(q["address"])

    async def op_remove_member(self, q):
        await self.cat.remove_member(q["address"])

    async def op_transfer(self, q):
        await self.cat.transfer_leadership(q.get("to"))

    async def op_raw_entry(self, q):
        """Submit bytes straight into the log, bypassing validation (problem 4's test)."""
        return repr(await self.cat._replicate(
            lambda rep, cb: rep.submit(base64.b64decode(q["payload"]), cb), "raw entry"))

    async def op_tick_probe(self, q):
        """Run a txn while counting event-loop wakeups (the loop must never block)."""
        ticks, stop = 0, False

        async def ticker():
            nonlocal ticks
            while not stop:
                await asyncio.sleep(0.01)
                ticks += 1
        t = asyncio.ensure_future(ticker())
        t0 = time.monotonic()
        try:
            await self.cat.txn(ops=decode_ops(q["ops"]))
            err = None
        except Exception as e:  # noqa: BLE001 — reported to the test
            err = [type(e).__name__, str(e)]
        stop = True
        await t
        return {"ticks": ticks, "seconds": time.monotonic() - t0, "err": err}

    async def handle(self, reader, writer):
        try:
            while line := await reader.readline():
                q = json.loads(line)
                try:
                    ans = {"ok": await getattr(self, "op_" + q["op"])(q)}
                except Exception as e:  # noqa: BLE001 — the test asserts on the class
                    ans = {"err": [type(e).__name__, str(e)]}
                writer.write(json.dumps(ans).encode() + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def main(args) -> None:
    tuning = json.loads(args.tuning) if args.tuning else None
    cat = RaftCatalog.from_uri(args.uri, secret_file=args.secret_file, dir=args.dir,
                               tuning=tuning, **json.loads(args.catalog_kw or "{}"))
    await cat.open()
    node = Node(cat)
    server = await asyncio.start_server(node.handle, "127.0.0.1", args.ctl, limit=1 << 24)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    server.close()
    await cat.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--uri", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--secret-file", required=True)
    p.add_argument("--ctl", type=int, required=True)
    p.add_argument("--tuning")
    p.add_argument("--catalog-kw")
    a = p.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    asyncio.run(main(a))
