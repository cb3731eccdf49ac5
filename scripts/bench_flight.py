#!/usr/bin/env python3
"""Arrow Flight over loopback with pyarrow.flight: the Python peers of cudabuf-flight's
``flight`` bench (flight/benches/flight.rs), on the same data shape.

The data: ``--total`` bytes of batches of 8 int64 columns, ``--rows`` rows each (1 GiB
of 1 Mi-row batches by default), dealt round-robin into ``S`` parts for ``S`` concurrent
clients (each of ``--streams``, 1,4,16 by default), each client on its own connection in
its own thread (pyarrow releases the GIL while it reads). Rows, each the median of
``--reps`` runs, GB/s with 1 GB = 1e9 bytes of column data:

- ``pyarrow DoGet pyarrow server -> host``: ``FlightClient.do_get(...).read_all()`` from
  a pyarrow ``FlightServerBase`` this script starts in-process;
- ``pyarrow DoPut host -> pyarrow server``: ``FlightClient.do_put`` of the same batches
  into it (the server reads every batch and discards it);
- ``pyarrow DoGet Rust host server -> host``: the same client against the Rust bench's
  host server (``flight --serve-only 0``, started as a child when ``--rust-bench`` names
  the executable), its tickets ``host/S/I``;
- ``pyarrow DoGet ... -> device (read_all, cupy.asarray per buffer)``: pyarrow's naive
  device landing: the table read to the host, then each column's values buffer copied
  with ``cupy.asarray`` (and a device synchronize); only when CuPy and a GPU are present,
  otherwise recorded as not run with the reason.

Usage:
    python3 scripts/bench_flight.py [--total 1G] [--rows 1M] [--streams 1,4,16] [--reps 5]
        [--rust-bench PATH] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

COLUMNS = 8


def parse_size(s: str) -> int:
    s = s.strip().upper()
    for unit, scale in (("GIB", 1 << 30), ("MIB", 1 << 20), ("KIB", 1 << 10), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1)):
        if s.endswith(unit):
            return int(s[: -len(unit)]) * scale
    return int(s)


def make_batches(count: int, rows: int) -> list:
    import numpy as np
    import pyarrow as pa

    batches = []
    for b in range(count):
        columns = [pa.array(np.arange(rows, dtype=np.int64) + (b * COLUMNS + c) * rows) for c in range(COLUMNS)]
        batches.append(pa.record_batch(columns, names=[f"c{c}" for c in range(COLUMNS)]))
    return batches


def parts_of(batches: list, parts: int, i: int) -> list:
    return batches[i::parts]


def make_server(batches: list):
    import pyarrow as pa
    import pyarrow.flight as fl

    class Server(fl.FlightServerBase):
        def do_get(self, context, ticket):
            kind, parts, i = ticket.ticket.decode().split("/")
            if kind != "host":
                raise fl.FlightServerError(f"no flight {ticket.ticket!r}")
            chosen = parts_of(batches, int(parts), int(i))
            return fl.RecordBatchStream(pa.Table.from_batches(chosen, schema=batches[0].schema))

        def do_put(self, context, descriptor, reader, writer):
            for _ in reader:
                pass

    return Server("grpc://127.0.0.1:0")


class Bench:
    def __init__(self, reps: int, nbytes: int) -> None:
        self.reps = reps
        self.nbytes = nbytes
        self.results: list[dict[str, Any]] = []
        self.not_run: list[dict[str, str]] = []

    def time(self, path: str, streams: int, run: Callable[[], None]) -> None:
        run()  # warm-up
        times = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        secs = statistics.median(times)
        gbps = self.nbytes / secs / 1e9
        self.results.append({"path": path, "streams": streams, "median_s": secs, "gbps": gbps, "bytes": self.nbytes})
        print(f"| {streams} | {path} | {secs:.4f} | {gbps:.3f} |", flush=True)

    def skip(self, path: str, reason: str) -> None:
        self.not_run.append({"path": path, "reason": reason})
        print(f"| - | {path} | not run: {reason} | |", flush=True)


def concurrently(streams: int, one: Callable[[int], int], expected_rows: int) -> None:
    """Runs ``one(i)`` for each of ``streams`` parts in its own thread; checks the rows."""
    rows = [0] * streams
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            rows[i] = one(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if sum(rows) != expected_rows:
        raise RuntimeError(f"{sum(rows)} rows moved, {expected_rows} expected")


def start_rust_server(exe: Path, total: int, rows: int) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen(
        [str(exe), "--serve-only", "0", "--total", str(total), "--rows", str(rows)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("PORT "):
        child.kill()
        raise RuntimeError(f"{exe} --serve-only printed {line!r}, not PORT <n>")
    return child, int(line.split()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", default="1G")
    ap.add_argument("--rows", default="1M")
    ap.add_argument("--streams", default="1,4,16")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rust-bench", type=Path, help="the flight bench executable, for its --serve-only server")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.flight as fl

    total, rows = parse_size(args.total), parse_size(args.rows)
    count = total // (rows * COLUMNS * 8)
    streams = [int(s) for s in args.streams.split(",") if s.strip()]
    if count == 0 or any(s < 1 or s > count for s in streams):
        print(f"bench_flight.py: {count} batches for streams {streams}: each stream needs one", file=sys.stderr)
        return 2
    batches = make_batches(count, rows)
    nbytes = count * rows * COLUMNS * 8
    bench = Bench(args.reps, nbytes)

    cupy: Optional[Any] = None
    cupy_reason = ""
    try:
        import cupy as cupy_module  # type: ignore[import-not-found]

        cupy_module.cuda.runtime.getDeviceCount()
        cupy = cupy_module
    except Exception as e:  # noqa: BLE001 - any failure means "not run"
        cupy_reason = f"CuPy or a GPU is missing: {type(e).__name__}: {e}"

    child = None
    rust_port = 0
    if args.rust_bench is not None:
        child, rust_port = start_rust_server(args.rust_bench, total, rows)
    server = make_server(batches)
    threading.Thread(target=server.serve, daemon=True).start()
    targets = [("pyarrow server", server.port)]
    if child is not None:
        targets.append(("Rust host server", rust_port))

    def do_get(port: int, parts: int, device: bool) -> Callable[[int], int]:
        def one(i: int) -> int:
            client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
            table = client.do_get(fl.Ticket(f"host/{parts}/{i}".encode())).read_all()
            if device:
                for column in table.columns:
                    for chunk in column.chunks:
                        values = chunk.buffers()[1]
                        cupy.asarray(memoryview(values)[: len(chunk) * 8])  # type: ignore[union-attr]
                cupy.cuda.runtime.deviceSynchronize()  # type: ignore[union-attr]
            client.close()
            return table.num_rows

        return one

    def do_put(port: int, parts: int) -> Callable[[int], int]:
        def one(i: int) -> int:
            client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
            chosen = parts_of(batches, parts, i)
            writer, _ = client.do_put(fl.FlightDescriptor.for_path(f"put/{parts}/{i}"), batches[0].schema)
            for b in chosen:
                writer.write_batch(b)
            writer.close()
            client.close()
            return sum(b.num_rows for b in chosen)

        return one

    print(f"# pyarrow {pa.__version__}: {count} batches of {rows} rows x {COLUMNS} int64, {nbytes / 2**20:.1f} MiB, {args.reps} reps")
    print("| streams | path | median s | GB/s |")
    print("|---|---|---|---|")
    try:
        for s in streams:
            for name, port in targets:
                bench.time(f"pyarrow DoGet {name} -> host", s, lambda: concurrently(s, do_get(port, s, False), count * rows))
                path = f"pyarrow DoGet {name} -> device (read_all, cupy.asarray per buffer)"
                if cupy is None:
                    bench.skip(path, cupy_reason)
                else:
                    bench.time(path, s, lambda: concurrently(s, do_get(port, s, True), count * rows))
            bench.time("pyarrow DoPut host -> pyarrow server", s, lambda: concurrently(s, do_put(server.port, s), count * rows))
    finally:
        server.shutdown()
        if child is not None:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)

    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "bench": "flight_py",
                    "pyarrow": pa.__version__,
                    "batches": count,
                    "rows_per_batch": rows,
                    "columns": COLUMNS,
                    "bytes": nbytes,
                    "reps": args.reps,
                    "results": bench.results,
                    "not_run": bench.not_run,
                },
                indent=2,
            )
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
