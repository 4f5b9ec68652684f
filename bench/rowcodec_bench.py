"""Row codec throughput: ~140-byte rows (int64 key, two float64, a
timestamp, a short string), encode and decode, against Arrow IPC stream
serialization of the same batch in the same run."""
from __future__ import annotations

import asyncio
import statistics

import numpy as np
import pyarrow as pa

from bench.common import Result, Timer, print_table, write_json
from rowstore.codec import kernels
from rowstore.codec.rows import decode_rows, encode_rows
from rowstore.schema import parse_schema

N = 1_000_000
SCHEMA = parse_schema("id int64 primary key, lat float64, lon float64, ts timestamp, name string")


def sample(n: int = N) -> pa.RecordBatch:
    rng = np.random.default_rng(1)
    names = pa.array([f"sensor-{i % 100000:06d}-" + "x" * 80 for i in range(n)])
    return pa.RecordBatch.from_arrays([
        pa.array(rng.integers(0, 2**62, n)), pa.array(rng.random(n) * 180), pa.array(rng.random(n) * 90),
        pa.array(rng.integers(0, 2**50, n)).cast(pa.int64()).cast(pa.timestamp("us", tz="UTC")), names,
    ], schema=SCHEMA.arrow())


def _rate(fn, n: int, repeat: int = 7) -> float:
    """Median rows/s over ``repeat`` runs after one warm-up (fresh-page faults skew the first)."""
    fn()
    times = []
    for _ in range(repeat):
        with Timer() as t:
            fn()
        times.append(t.seconds)
    return n / statistics.median(times)


def _ipc_write(batch):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue()


async def main() -> list[Result]:
    kernels.warm_up()
    batch = sample()
    enc = encode_rows(batch, SCHEMA, 1)
    ours_enc = _rate(lambda: encode_rows(batch, SCHEMA, 1), N)
    ours_dec = _rate(lambda: decode_rows(enc.buf, enc.starts, lambda v: SCHEMA, SCHEMA), N)
    ipc = _ipc_write(batch)
    ipc_enc = _rate(lambda: _ipc_write(batch), N)
    # reading IPC is zero-copy; the fair peer materializes the columns like our decode does
    ipc_dec = _rate(lambda: _ipc_read_copy(ipc), N)
    structured = _rate(lambda: _numpy_structured(batch), N)
    row = enc.nbytes / N
    results = [
        Result(f"encode Arrow -> rows ({row:.0f} B/row)", ours_enc, "Arrow IPC write", ipc_enc, "rows/s", "report"),
        Result(f"encode Arrow -> rows ({row:.0f} B/row)", ours_enc, "numpy structured (fixed cols only)",
               structured, "rows/s", "report"),
        Result("decode rows -> Arrow", ours_dec, "Arrow IPC read + copy columns", ipc_dec, "rows/s", "report"),
    ]
    print_table("Row codec", results)
    print(f"\nJSON: {write_json('rowcodec', results)}")
    return results


def _ipc_read_copy(buf):
    """Read an IPC stream and copy every column out of it (our decode also materializes)."""
    batch = pa.ipc.open_stream(buf).read_next_batch()
    return [pa.concat_arrays([c, c.slice(0, 0)]) for c in batch.columns]


def _numpy_structured(batch):
    dt = np.dtype([("id", "<i8"), ("lat", "<f8"), ("lon", "<f8"), ("ts", "<i8")])
    out = np.empty(batch.num_rows, dt)
    out["id"] = batch.column(0).to_numpy()
    out["lat"] = batch.column(1).to_numpy()
    out["lon"] = batch.column(2).to_numpy()
    out["ts"] = batch.column(3).cast(pa.int64()).to_numpy()
    return out


if __name__ == "__main__":
    asyncio.run(main())
