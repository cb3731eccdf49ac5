"""No deadlock between two threads when one of them gets a cudabuf error: making an
error runs no Python code and allocates no object the garbage collector tracks, so it
is safe under the extension's own locks (a closed Event, Stream or FlightClient, a host
buffer lent to a copy, the backend's selection), and the first error's lookup of the
exception classes never waits for the GIL under such a lock.

Each case runs in a child process (a deadlock there holds the GIL for good, so no
timeout inside this process could end it) that hands the GIL over every microsecond
while two threads race for the lock; before, each case hung in most runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Each case: two functions racing for the same lock in threads, for `SECONDS`.
PRELUDE = """
import sys, threading, time
sys.setswitchinterval(1e-6)
import cudabuf
from cudabuf import sim
SECONDS = 1.5
def race(first, second):
    stop = time.time() + SECONDS
    counts = [0, 0]
    def loop(i, f):
        while time.time() < stop:
            try:
                f()
            except cudabuf.CudaError:
                pass
            counts[i] += 1
    threads = [threading.Thread(target=loop, args=(0, first)),
               threading.Thread(target=loop, args=(1, second))]
    for t in threads: t.start()
    for t in threads: t.join()
    assert min(counts) > 0, counts
    print("done", counts)
"""

CASES = {
    "closed event": """
        s = sim.Simulator(); event = s.context(0).new_event(); event.close()
        race(event.synchronize, lambda: event.closed)
    """,
    "closed stream": """
        s = sim.Simulator(); stream = s.context(0).new_stream(); stream.close()
        race(stream.synchronize, lambda: stream.closed)
    """,
    "lent host buffer": """
        s = sim.Simulator(); ctx = s.context(0); stream = ctx.new_stream()
        dev = ctx.new_buffer(4096); host = s.new_host_buffer(4096)
        transfer = stream.copy_to_host(dev, host)
        race(host.to_pybytes, lambda: memoryview(host))
        transfer.wait()
    """,
    "backend selection": """
        from cudabuf import cuda
        race(lambda: cuda.Context(0), cudabuf.get_backend)
    """,
    "garbage collected transfer": """
        import gc
        s = sim.Simulator(); ctx = s.context(0); stream = ctx.new_stream()
        dev = ctx.new_buffer(16); host = s.new_host_buffer(32); part = host[0:16]
        t = stream.copy_to_host(dev, part)
        cycle = [t]; cycle.append(cycle)  # the transfer is kept only by a cycle
        del t, cycle
        gc.set_threshold(1, 1, 1)  # a collection at the error's first allocation
        try:
            part.to_pybytes()
        except cudabuf.BufferInUseError:
            pass
        print("done")
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_error_under_a_lock_never_deadlocks(case: str) -> None:
    env = dict(os.environ)
    # A backend name that cannot be made: the selection's error path on any machine.
    env["CUDABUF_BACKEND"] = "no-such-backend" if case == "backend selection" else "sim"
    script = PRELUDE + textwrap.dedent(CASES[case])
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case}: deadlocked (no end within 60 s)")
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout
