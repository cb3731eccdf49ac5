"""The GIL is released around copies: another Python thread runs meanwhile."""

from __future__ import annotations

import threading

import numpy as np

from cudabuf import cuda


def test_copies_release_the_gil(ctx: cuda.Context) -> None:
    size = 64 << 20
    src = np.ones(size, dtype=np.uint8)
    dbuf = ctx.new_buffer(size)
    stop = threading.Event()
    ticks = [0]

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    worker = threading.Thread(target=count)
    worker.start()
    try:
        progressed = 0
        for _ in range(6):
            before = ticks[0]
            dbuf.copy_from_host(src)
            dbuf.copy_to_host()
            progressed += ticks[0] - before
    finally:
        stop.set()
        worker.join()
    # With the GIL held for the whole copy, the counter could only move between calls
    # (at most a few switch intervals); released, it runs throughout the copies.
    assert progressed > 1000


def test_threads_copy_concurrently(ctx: cuda.Context) -> None:
    bufs = [ctx.new_buffer(1 << 20) for _ in range(4)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            data = bytes([i]) * (1 << 20)
            for _ in range(20):
                bufs[i].copy_from_host(data)
                assert bufs[i].to_pybytes() == data
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
