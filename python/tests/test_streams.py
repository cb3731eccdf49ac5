"""Streams, events and asynchronous copies on the simulator.

The simulator runs streams asynchronously under a seeded scheduler and its race detector
flags a missing wait at the call that races (``races="fail"``, ``DataRaceError``) or in
its report (``races="log"``): a racy program is flagged under every seed, a correct one
never. Most tests use the ``cudabuf_sim`` fixture, which also fails a test that leaks or
races; the racy programs run on simulators of their own, under several seeds.
"""

from __future__ import annotations

import gc
import threading
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda, sim

SEEDS = range(6)
SCHEDULES = ("deterministic", "threaded")


def pattern(n: int, salt: int = 0) -> bytes:
    return bytes((i * 7 + salt) % 251 for i in range(n))


def filled(s: sim.Simulator, data: bytes) -> cuda.HostBuffer:
    """A pinned buffer of ``s`` holding ``data``."""
    host = s.new_host_buffer(len(data))
    memoryview(host)[:] = data
    return host


def simulators(races: str = "fail") -> Iterator[sim.Simulator]:
    for schedule in SCHEDULES:
        for seed in SEEDS:
            yield sim.Simulator(devices=2, seed=seed, schedule=schedule, races=races)


# --- copies -------------------------------------------------------------------------


def test_bytes_round_trip_through_async_copies_on_several_streams(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    streams = [ctx.new_stream(), ctx.new_stream(non_blocking=True), cuda.Stream(ctx, priority=-1)]
    size = 4096
    sources = [filled(cudabuf_sim, pattern(size, i)) for i in range(3)]
    device = [ctx.new_buffer(size) for _ in range(3)]
    back = [cudabuf_sim.new_host_buffer(size) for _ in range(3)]
    uploads = [s.copy_from_host(d, h) for s, d, h in zip(streams, device, sources)]
    downloads = [s.copy_to_host(d, h) for s, d, h in zip(streams, device, back)]
    assert all(t.nbytes == size for t in uploads + downloads)
    for t in uploads + downloads:
        t.wait()
    for i in range(3):
        assert bytes(back[i]) == pattern(size, i)
        assert bytes(sources[i]) == pattern(size, i)  # the upload's source came back intact


def test_pageable_bytes_are_staged_and_free_at_once(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    dst = ctx.new_buffer(12)
    data = bytearray(b"pageable!!!!")
    transfer = stream.copy_from_host(dst, data)
    data[:] = b"overwritten."  # staged at the call: the copy does not see this
    transfer.wait()
    array = np.arange(3, dtype=np.int32)
    stream.copy_from_host(dst, array).wait()
    stream.synchronize()
    assert dst.to_pybytes() == array.tobytes()
    stream.copy_from_host(dst.slice(8, 4), b"tail").wait()
    assert dst.to_pybytes()[8:] == b"tail"


def test_device_to_device_and_peer_copies_on_a_stream(cudabuf_sim: sim.Simulator) -> None:
    ctx0, ctx1 = cudabuf_sim.context(0), cudabuf_sim.context(1)
    stream = ctx1.new_stream()
    src = ctx0.buffer_from_data(b"device zero")
    dst = ctx1.new_buffer(11)
    stream.copy_device(dst, src)  # a peer copy into device 1's memory
    del src  # the stream keeps it alive until the copy is done
    stream.synchronize()
    assert dst.to_pybytes() == b"device zero"


def test_disjoint_slices_of_one_pinned_buffer_are_in_flight_at_once(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    streams = [ctx.new_stream(non_blocking=True), ctx.new_stream(non_blocking=True)]
    data = pattern(4096)
    src = ctx.buffer_from_data(data)
    host = cudabuf_sim.new_host_buffer(4096)
    transfers = [
        streams[i % 2].copy_to_host(src.slice(i * 1024, 1024), host[i * 1024 : (i + 1) * 1024]) for i in range(3)
    ]
    # The last quarter is not lent: Python may use it meanwhile.
    memoryview(host[3072:])[:] = data[3072:]
    with pytest.raises(cudabuf.BufferInUseError):
        bytes(host)
    with pytest.raises(cudabuf.BufferInUseError):
        streams[0].copy_to_host(src.slice(0, 2048), host[1000:3048])  # overlaps two lent slices
    transfers[1].wait()
    transfers[2].wait()
    assert bytes(host[1024:2048]) == data[1024:2048]
    memoryview(host[1024:])[:] = bytes(3072)
    # Bytes 1024.. came back as three ranges while 0..1024 is still lent: one copy takes
    # them all (in three pieces).
    spanning = streams[1].copy_to_host(src.slice(1024, 3072), host[1024:])
    with pytest.raises(cudabuf.BufferInUseError):
        bytes(host[3000:3100])
    spanning.wait()
    transfers[0].wait()
    assert bytes(host) == data
    # Every range back: the buffer is one again (a device view needs it whole).
    view = ctx.buffer_from_object(host)
    assert view.to_pybytes() == data


def test_copy_sizes_are_checked(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    small, big = ctx.new_buffer(4), ctx.new_buffer(16)
    host = cudabuf_sim.new_host_buffer(8)
    with pytest.raises(cudabuf.OutOfRangeError):
        stream.copy_from_host(small, host)
    with pytest.raises(cudabuf.OutOfRangeError):
        stream.copy_from_host(small, b"too long")
    with pytest.raises(cudabuf.OutOfRangeError):
        stream.copy_to_host(big, host)
    with pytest.raises(cudabuf.OutOfRangeError):
        stream.copy_device(small, big)
    # Refused before anything was lent: the buffer is usable.
    assert bytes(host) == bytes(8)
    # Empty copies do nothing, and complete at once.
    empty = stream.copy_to_host(ctx.new_buffer(0), host)
    assert empty.nbytes == 0 and empty.query()
    assert stream.copy_from_host(small, b"").query()


# --- lending ------------------------------------------------------------------------


def test_a_lent_host_buffer_refuses_every_access_until_the_copy_is_waited_for(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    src = ctx.buffer_from_data(b"download")
    host = cudabuf_sim.new_host_buffer(8)
    transfer = stream.copy_to_host(src, host)
    refusals: list[Callable[[], object]] = [
        lambda: memoryview(host),
        lambda: bytes(host),
        lambda: np.frombuffer(host, dtype=np.uint8),
        lambda: pa.py_buffer(host),
        lambda: host.to_pybytes(),
        lambda: host[0],
        lambda: bytes(host[2:4]),
        lambda: host.equals(b"download"),
        lambda: host == b"download",
        lambda: ctx.buffer_from_object(host),  # a device view would reach the bytes too
        lambda: ctx.buffer_from_data(host),
        lambda: src.copy_to_host(buf=host),
        lambda: src.copy_from_host(host),
        lambda: src == host,
        lambda: stream.copy_from_host(src, host),  # another copy of the same bytes
    ]
    for refused in refusals:
        with pytest.raises(cudabuf.BufferInUseError, match="lent .* to an asynchronous copy") as raised:
            refused()
        assert raised.value.kind == "BufferInUse" and isinstance(raised.value, BufferError)
    assert host.size == 8 and host.address != 0  # what touches no byte still works
    transfer.wait()
    assert bytes(host) == b"download" and host[0] == ord("d") and host == b"download"
    assert ctx.buffer_from_object(host).to_pybytes() == b"download"
    transfer.wait()  # again: nothing left to wait for


def test_a_copy_is_refused_while_its_bytes_are_exported(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    dst = ctx.new_buffer(16)
    host = filled(cudabuf_sim, pattern(16))
    view = memoryview(host)[4:8]  # a slice of a view holds the whole export
    with pytest.raises(cudabuf.BufferInUseError, match="exported"):
        stream.copy_from_host(dst, host)
    with pytest.raises(BufferError):
        stream.copy_to_host(dst, host)
    array = np.frombuffer(host[8:16], dtype=np.uint8)  # an export of bytes 8..16 only
    view.release()
    stream.copy_from_host(dst.slice(0, 8), host[0:8]).wait()  # bytes 0..8 are not exported
    with pytest.raises(cudabuf.BufferInUseError):
        stream.copy_from_host(dst, host)
    del array
    gc.collect()
    stream.copy_from_host(dst, host).wait()
    stream.synchronize()
    assert dst.to_pybytes() == pattern(16)


@pytest.mark.parametrize("how", ["wait", "transfer query", "stream synchronize", "stream query", "event synchronize", "event query", "drop"])
def test_the_host_buffer_comes_back_when_the_copy_is_known_complete(cudabuf_sim: sim.Simulator, how: str) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    src = ctx.buffer_from_data(pattern(1 << 16))
    host = cudabuf_sim.new_host_buffer(1 << 16)
    transfer = stream.copy_to_host(src, host)
    event = stream.record_event()
    with pytest.raises(cudabuf.BufferInUseError):
        bytes(host)
    if how == "wait":
        transfer.wait()
    elif how == "transfer query":
        while not transfer.query():
            pass
    elif how == "stream synchronize":
        stream.synchronize()
    elif how == "stream query":
        while not stream.query():
            pass
    elif how == "event synchronize":
        event.synchronize()
    elif how == "event query":
        while not event.query():
            pass
    else:
        del transfer  # waits, with the GIL released
    assert bytes(host) == pattern(1 << 16)


def test_an_event_recorded_before_a_copy_does_not_return_its_buffer(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    before = stream.record_event()
    host = cudabuf_sim.new_host_buffer(4)
    transfer = stream.copy_to_host(ctx.buffer_from_data(b"late"), host)
    before.synchronize()
    with pytest.raises(cudabuf.BufferInUseError):
        bytes(host)
    transfer.wait()
    assert bytes(host) == b"late"


def test_dropping_transfers_streams_and_buffers_without_waiting_is_safe(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    src = ctx.buffer_from_data(pattern(1 << 20))
    host = cudabuf_sim.new_host_buffer(1 << 20)
    address = host.address
    transfer = stream.copy_to_host(src, host)
    del host, src  # the transfer keeps the pinned memory and the device buffer
    gc.collect()
    stream.close()  # the transfer is not the stream's to wait for
    assert stream.closed
    with pytest.raises(cudabuf.ClosedError):
        stream.synchronize()
    transfer.wait()
    del transfer
    # A transfer dropped while in flight waits; a stream dropped with work queued too.
    other = ctx.new_stream()
    dst = ctx.new_buffer(1 << 20)
    pinned = filled(cudabuf_sim, pattern(1 << 20, 3))
    other.copy_from_host(dst, pinned)  # the Transfer is dropped at once
    other.copy_device(ctx.new_buffer(1 << 20), dst)
    del other
    gc.collect()
    assert dst.to_pybytes() == pattern(1 << 20, 3)
    assert address != 0


def test_a_failed_copy_gives_its_buffer_back(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    src = ctx.buffer_from_data(b"fail")
    host = cudabuf_sim.new_host_buffer(4)
    cudabuf_sim.fail_nth("copy", 1)
    with pytest.raises(cudabuf.DriverError):
        stream.copy_to_host(src, host)
    assert bytes(host) == bytes(4)  # refused and returned: usable, unchanged
    stream.copy_to_host(src, host).wait()
    assert bytes(host) == b"fail"


# --- events, ordering and races -------------------------------------------------------


def producer_consumer(s: sim.Simulator, wait: bool) -> bytes:
    """Upload on one non-blocking stream, copy on another, download: ``wait`` orders the
    second after the first with an event."""
    ctx = s.context(0)
    producer, consumer = ctx.new_stream(non_blocking=True), ctx.new_stream(non_blocking=True)
    staging, data = ctx.new_buffer(256), ctx.new_buffer(256)
    host = filled(s, pattern(256, 9))
    upload = producer.copy_from_host(staging, host)
    if wait:
        consumer.wait_event(producer.record_event())
    consumer.copy_device(data, staging)
    out = s.new_host_buffer(256)
    consumer.copy_to_host(data, out).wait()
    upload.wait()
    return bytes(out)


def test_an_event_wait_orders_two_streams_under_every_seed() -> None:
    for s in simulators():
        assert producer_consumer(s, wait=True) == pattern(256, 9)
        assert list(s.race_report()) == []
        s.assert_clean()


def test_a_missing_wait_is_a_race_under_every_seed() -> None:
    for s in simulators("fail"):
        with pytest.raises(cudabuf.DataRaceError, match="data race") as raised:
            producer_consumer(s, wait=False)
        assert "copy_device" in str(raised.value) and raised.value.kind == "DataRace"
        del raised
        gc.collect()
        report = s.race_report()
        assert len(report) == 1 and "copy_from_host" in report[0].conflicting
    for s in simulators("log"):
        producer_consumer(s, wait=False)  # goes ahead, and is reported
        with pytest.raises(cudabuf.SimulatorNotCleanError) as not_clean:
            s.assert_clean()
        assert len(not_clean.value.races) == 1


def test_blocking_streams_are_ordered_with_synchronous_copies_non_blocking_ones_are_not() -> None:
    def program(s: sim.Simulator) -> None:
        ctx = s.context(0)
        blocking = ctx.new_stream()
        buf = ctx.new_buffer(4)
        upload = blocking.copy_from_host(buf, b"sync")
        assert buf.to_pybytes() == b"sync"  # the legacy stream waits for blocking streams
        upload.wait()
        free = ctx.new_stream(non_blocking=True)
        upload = free.copy_from_host(buf, b"race")
        with pytest.raises(cudabuf.DataRaceError):
            buf.to_pybytes()

    for s in simulators():
        program(s)
        assert len(s.race_report()) == 1
        s.clear_race_report()
        s.assert_clean()


def test_wait_stream_and_event_wait(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    a, b, c = (ctx.new_stream(non_blocking=True) for _ in range(3))
    x, y, z = ctx.new_buffer(4), ctx.new_buffer(4), ctx.new_buffer(4)
    upload = a.copy_from_host(x, b"abcd")
    b.wait_stream(a)
    b.copy_device(y, x)
    done = cuda.Event(ctx)
    done.record(b)
    done.wait(c)
    c.copy_device(z, y)
    c.synchronize()
    upload.wait()
    assert z.to_pybytes() == b"abcd"


def test_elapsed_time_between_timing_events(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    start, end = cuda.Event(ctx, timing=True), ctx.new_event(timing=True)
    assert start.timing and start.query()  # never recorded: nothing to wait for
    start.record(stream)
    stream.copy_from_host(ctx.new_buffer(1 << 20), bytes(1 << 20)).wait()
    end.record(stream)
    end.synchronize()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms > 0  # simulated time
    assert end.elapsed_time(start) == 0.0  # clamped
    plain = stream.record_event()
    plain.synchronize()
    with pytest.raises(cudabuf.InvalidArgumentError, match="timing"):
        start.elapsed_time(plain)


def test_elapsed_time_before_completion_is_not_ready() -> None:
    s = sim.Simulator(devices=1, schedule="deterministic")
    ctx = s.context(0)
    stream = ctx.new_stream(non_blocking=True)
    start, end = ctx.new_event(timing=True), ctx.new_event(timing=True)
    start.record(stream)
    upload = stream.copy_from_host(ctx.new_buffer(1 << 20), bytes(1 << 20))
    end.record(stream)
    # Deterministic schedule: queued work runs only when the host waits or queries.
    with pytest.raises(cudabuf.NotReadyError):
        start.elapsed_time(end)
    upload.wait()
    end.synchronize()
    assert start.elapsed_time(end) > 0


def pipeline(s: sim.Simulator, chunks: int, order: bool) -> bytes:
    """Upload, a device copy standing for a kernel, download, chunk by chunk, each stage
    on a stream of its own (the shape of the GPU test's PyTorch pipeline); ``order``
    orders each chunk's stages with events."""
    ctx = s.context(0)
    up, compute, down = (ctx.new_stream(non_blocking=True) for _ in range(3))
    size = 1024 * chunks
    host_in, host_out = filled(s, pattern(size, 5)), s.new_host_buffer(size)
    d_in, d_out = ctx.new_buffer(size), ctx.new_buffer(size)
    transfers = []
    for i in range(chunks):
        a, b = i * 1024, (i + 1) * 1024
        transfers.append(up.copy_from_host(d_in.slice(a, 1024), host_in[a:b]))
        if order:
            compute.wait_event(up.record_event())
        compute.copy_device(d_out.slice(a, 1024), d_in.slice(a, 1024))
        if order:
            down.wait_event(compute.record_event())
        transfers.append(down.copy_to_host(d_out.slice(a, 1024), host_out[a:b]))
    for t in transfers:
        t.wait()
    return bytes(host_out)


def test_a_three_stream_pipeline_is_correct_and_race_free_under_every_seed() -> None:
    for s in simulators():
        assert pipeline(s, chunks=4, order=True) == pattern(4096, 5)
        s.assert_clean()
    for s in simulators():
        with pytest.raises(cudabuf.DataRaceError):
            pipeline(s, chunks=4, order=False)


# --- stream-ordered allocation ------------------------------------------------------


def test_stream_ordered_allocation(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    buf = ctx.new_buffer(1024, stream=stream)
    assert buf.size == 1024
    stream.copy_from_host(buf, pattern(1024)).wait()
    out = cudabuf_sim.new_host_buffer(1024)
    stream.copy_to_host(buf, out).wait()
    assert bytes(out) == pattern(1024)
    del buf  # freed on the stream, in stream order
    stream.synchronize()
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(16, stream=ctx.per_thread_stream())
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(16, stream=cudabuf_sim.context(1).new_stream())
    closed = ctx.new_stream()
    closed.close()
    with pytest.raises(cudabuf.ClosedError):
        ctx.new_buffer(16, stream=closed)


def test_a_stream_ordered_buffer_used_on_another_stream_without_a_wait_is_a_race() -> None:
    def program(s: sim.Simulator) -> None:
        ctx = s.context(0)
        owner, other = ctx.new_stream(non_blocking=True), ctx.new_stream(non_blocking=True)
        buf = ctx.new_buffer(64, stream=owner)
        with pytest.raises(cudabuf.DataRaceError):
            other.copy_from_host(buf, bytes(64))
        other.wait_event(owner.record_event())  # the fix
        other.copy_from_host(buf, bytes(64)).wait()
        del buf
        owner.synchronize()

    for s in simulators():
        program(s)
        assert len(s.race_report()) == 1
        s.clear_race_report()
        s.assert_clean()


# --- errors -------------------------------------------------------------------------


def test_wrong_context_errors_are_typed(cudabuf_sim: sim.Simulator) -> None:
    ctx0, ctx1 = cudabuf_sim.context(0), cudabuf_sim.context(1)
    stream = ctx0.new_stream()
    theirs = ctx1.new_buffer(8)
    host = cudabuf_sim.new_host_buffer(8)
    with pytest.raises(cudabuf.InvalidArgumentError, match="context"):
        stream.copy_to_host(theirs, host)
    assert bytes(host) == bytes(8)  # given back
    with pytest.raises(cudabuf.InvalidArgumentError):
        stream.copy_from_host(theirs, host)
    with pytest.raises(cudabuf.InvalidArgumentError):
        stream.copy_from_host(theirs, b"bytes")
    with pytest.raises(cudabuf.InvalidArgumentError):
        stream.copy_to_host(ctx1.new_buffer(0), host)  # an empty copy is checked too
    with pytest.raises(cudabuf.InvalidArgumentError):
        stream.copy_device(theirs, ctx0.new_buffer(8))
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx1.new_event().record(stream)
    # Another simulator's stream and buffer.
    other = sim.Simulator(devices=1)
    with pytest.raises(cudabuf.InvalidArgumentError):
        stream.copy_device(ctx0.new_buffer(8), other.context(0).new_buffer(8))
    with pytest.raises(cudabuf.InvalidArgumentError):
        cudabuf_sim.context(0).wrap_stream(other.context(0).new_stream())


def test_wrong_types_are_typed_errors(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    buf = ctx.new_buffer(8)
    with pytest.raises(cudabuf.InvalidTypeError, match="pinned"):
        stream.copy_to_host(buf, bytearray(8))  # pageable: no asynchronous download
    pageable = buf.copy_to_host()  # a cudabuf Buffer, on the heap
    with pytest.raises(cudabuf.InvalidTypeError, match="pageable"):
        stream.copy_to_host(buf, pageable)
    with pytest.raises(cudabuf.InvalidTypeError):
        stream.copy_from_host(buf, 42)
    with pytest.raises(TypeError):
        stream.copy_device(b"not a buffer", buf)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        stream.wait_event(stream)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cuda.Transfer()  # type: ignore[call-arg]


def test_closed_streams_and_events_raise_closed_error(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream, event = ctx.new_stream(), ctx.new_event()
    buf, host = ctx.new_buffer(4), cudabuf_sim.new_host_buffer(4)
    stream.close()
    stream.close()  # twice: nothing
    for call in (
        stream.synchronize,
        stream.query,
        stream.record_event,
        lambda: stream.wait_event(event),
        lambda: stream.copy_from_host(buf, host),
        lambda: stream.copy_to_host(buf, host),
        lambda: stream.copy_device(buf, buf),
        lambda: stream.context,
        lambda: event.record(stream),
    ):
        with pytest.raises(cudabuf.ClosedError, match="Stream is closed"):
            call()
    assert bytes(host) == bytes(4)  # nothing was lent
    assert "closed" in repr(stream) and stream.handle != 0
    event.close()
    assert event.closed
    for call in (event.synchronize, event.query, lambda: ctx.new_stream().wait_event(event), lambda: event.elapsed_time(event)):
        with pytest.raises(cudabuf.ClosedError, match="Event is closed"):
            call()


def test_errors_are_cudabuf_errors_never_panics(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    host = cudabuf_sim.new_host_buffer(16)
    attempts: list[Callable[[], object]] = [
        lambda: stream.copy_to_host(ctx.new_buffer(32), host),
        lambda: stream.copy_to_host(ctx.new_buffer(8), host[20:]),
        lambda: ctx.new_buffer(-1, stream=stream),
        lambda: ctx.wrap_stream(-5),
        lambda: ctx.wrap_stream(2**70),
        lambda: ctx.wrap_stream(True),
        lambda: ctx.new_event().elapsed_time(ctx.new_event()),
    ]
    for attempt in attempts:
        with pytest.raises(cudabuf.CudaError):
            attempt()


# --- default streams, interop -------------------------------------------------------


def test_default_streams(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    legacy, per_thread = ctx.default_stream(), ctx.per_thread_stream()
    assert (legacy.kind, legacy.handle, legacy.ptr) == ("legacy default", 1, 1)
    assert (per_thread.kind, per_thread.handle) == ("per-thread default", 2)
    assert legacy == ctx.default_stream() and legacy != per_thread
    assert len({legacy, ctx.default_stream()}) == 1
    buf = ctx.new_buffer(6)
    legacy.copy_from_host(buf, b"legacy").wait()
    assert buf.to_pybytes() == b"legacy"
    per_thread.copy_from_host(buf, b"thread")
    per_thread.synchronize()
    assert buf.to_pybytes() == b"thread"
    owned = ctx.new_stream(non_blocking=True, priority=-1)
    least, greatest = ctx.stream_priority_range()
    assert least >= greatest
    assert owned.kind == "owned" and owned.non_blocking and owned.priority == max(-1, greatest)
    assert owned.context == ctx and owned != ctx.new_stream()


def test_streams_are_context_managers(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    host = cudabuf_sim.new_host_buffer(4)
    with ctx.new_stream(non_blocking=True) as stream:
        transfer = stream.copy_to_host(ctx.buffer_from_data(b"with"), host)
        with pytest.raises(cudabuf.BufferInUseError):
            bytes(host)
    assert stream.closed
    assert bytes(host) == b"with"  # synchronized at the exit: the buffer is back
    assert transfer.query()


def test_cuda_stream_protocol_and_wrapping_on_the_simulator(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream()
    with pytest.raises(cudabuf.SimulatedMemoryError, match="simulator"):
        stream.__cuda_stream__()

    class CudaCoreLike:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0x1234)

    class TorchLike:
        cuda_stream = 0x1234

    class CupyLike:
        ptr = 0x1234
        device_id = 1

    class FutureProtocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (1, 0x1234)

    for foreign in (CudaCoreLike(), TorchLike(), 0x1234, 0):
        with pytest.raises(cudabuf.SimulatedMemoryError, match="simulator"):
            ctx.wrap_stream(foreign)
    with pytest.raises(cudabuf.InvalidArgumentError, match="device 1"):
        ctx.wrap_stream(CupyLike())
    with pytest.raises(cudabuf.InvalidArgumentError, match="version"):
        ctx.wrap_stream(FutureProtocol())
    with pytest.raises(cudabuf.InvalidTypeError):
        ctx.wrap_stream("stream")
    # A cudabuf stream wraps into another object over the same stream.
    alias = ctx.wrap_stream(stream)
    assert alias == stream and alias is not stream and alias.kind == "owned"
    host = cudabuf_sim.new_host_buffer(5)
    transfer = alias.copy_to_host(ctx.buffer_from_data(b"alias"), host)
    stream.close()  # the alias keeps the stream
    alias.synchronize()  # and shares the transfers issued through it
    assert bytes(host) == b"alias"
    transfer.wait()


# --- threads ------------------------------------------------------------------------


def test_two_threads_issue_on_one_stream(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    errors: list[BaseException] = []

    def work(salt: int) -> None:
        try:
            dbuf = ctx.new_buffer(4096)
            host, back = filled(cudabuf_sim, pattern(4096, salt)), cudabuf_sim.new_host_buffer(4096)
            for _ in range(25):
                up = stream.copy_from_host(dbuf, host)
                down = stream.copy_to_host(dbuf, back)
                stream.synchronize()  # the other thread's transfers may come back here too
                up.wait()
                down.wait()
                assert bytes(back) == pattern(4096, salt)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(salt,)) for salt in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_waiting_releases_the_gil() -> None:
    s = sim.Simulator(devices=1, schedule="threaded")
    ctx = s.context(0)
    stream = ctx.new_stream(non_blocking=True)
    size = 32 << 20
    dbuf = ctx.buffer_from_data(bytes(size))
    host = s.new_host_buffer(size)
    stop = threading.Event()
    ticks = [0]

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    worker = threading.Thread(target=count)
    worker.start()
    try:
        progressed = 0
        for _ in range(4):
            transfer = stream.copy_to_host(dbuf, host)
            before = ticks[0]
            transfer.wait()
            stream.copy_from_host(dbuf, host)
            stream.synchronize()
            progressed += ticks[0] - before
    finally:
        stop.set()
        worker.join()
    assert progressed > 1000
    del transfer, dbuf, host
    s.assert_clean()


# --- pinned memory and its device view --------------------------------------------------


def view_write(s: sim.Simulator, non_blocking: bool = True) -> tuple[cuda.Stream, cuda.HostBuffer, cuda.CudaBuffer]:
    """A stream writing 7s into a pinned buffer through its device view, in flight."""
    ctx = s.context(0)
    stream = ctx.new_stream(non_blocking=non_blocking)
    host = s.new_host_buffer(256)
    view = ctx.buffer_from_object(host)
    src = ctx.new_buffer(256)
    src.copy_from_host(b"\x07" * 256)
    stream.copy_device(view, src)
    return stream, host, view


HOST_READS: dict[str, Callable[[cuda.HostBuffer], object]] = {
    "bytes()": bytes,
    "to_pybytes": lambda h: h.to_pybytes(),
    "index": lambda h: h[3],
    "equals": lambda h: h.equals(b"\x07" * 256),
    "==": lambda h: h == b"\x07" * 256,
    "== (reflected)": lambda h: b"\x07" * 256 == h,
}


@pytest.mark.parametrize("non_blocking", [True, False])
def test_a_host_read_of_pinned_bytes_a_stream_writes_through_a_device_view_is_a_race(non_blocking: bool) -> None:
    # Host accesses are ordered after no stream, blocking or not: only a synchronization.
    for s in simulators():
        stream, host, view = view_write(s, non_blocking)
        for name, read in HOST_READS.items():
            with pytest.raises(cudabuf.DataRaceError, match="host read|host write") as raised:
                read(host)
            assert "D2D copy" in str(raised.value), name
            del raised
        report = s.race_report()
        assert len(report) == len(HOST_READS)
        assert "synchronize" in report[0].hint
        stream.synchronize()
        assert bytes(host) == b"\x07" * 256  # never the stale zeros
        s.clear_race_report()
        del stream, host, view
        gc.collect()
        s.assert_clean()


def test_a_host_access_is_checked_for_its_own_bytes_and_views_are_not_checked() -> None:
    for s in simulators():
        ctx = s.context(0)
        stream = ctx.new_stream(non_blocking=True)
        host = s.new_host_buffer(256)
        view = ctx.buffer_from_object(host[128:])
        src = ctx.new_buffer(128)
        src.copy_from_host(b"\x07" * 128)
        stream.copy_device(view, src)  # writes bytes 128..256 only
        # A byte nothing writes is no race; one the stream writes is.
        assert host[5] == 0 and bytes(host[:128]) == bytes(128)
        with pytest.raises(cudabuf.DataRaceError):
            host[200]
        s.clear_race_report()
        # A buffer-protocol view is not checked: it may be only read, or handed to a
        # synchronous copy, as here (correct: the copy waits for nothing it needs).
        dst = ctx.new_buffer(128)
        dst.copy_from_host(memoryview(host)[:128])
        np.frombuffer(host, dtype=np.uint8)
        assert list(s.race_report()) == []
        stream.synchronize()
        assert host[200] == 7
        del stream, host, view, src, dst
        gc.collect()
        s.assert_clean()


def test_a_host_write_of_pinned_bytes_a_stream_reads_through_a_device_view_is_a_race() -> None:
    for s in simulators():
        ctx = s.context(0)
        stream = ctx.new_stream(non_blocking=True)
        host = filled(s, pattern(256, 5))
        view = ctx.buffer_from_object(host)
        dst = ctx.new_buffer(256)
        stream.copy_device(dst, view)
        # Reads beside the stream's read are no race (nor are views, which go unchecked)...
        assert bytes(host) == pattern(256, 5) and host.to_pybytes() == pattern(256, 5)
        assert host == pattern(256, 5) and host[1] == pattern(256, 5)[1]
        assert bytes(memoryview(host)) == pattern(256, 5)
        assert np.frombuffer(host, dtype=np.uint8)[3] == pattern(256, 5)[3]
        assert list(s.race_report()) == []
        # ...a write of cudabuf's into them is.
        source = ctx.new_buffer(256)
        source.copy_from_host(b"\x09" * 256)
        with pytest.raises(cudabuf.DataRaceError, match="host write"):
            cuda.BufferReader(source).readinto(host)
        assert len(s.race_report()) == 1
        stream.synchronize()
        assert cuda.BufferReader(source).readinto(host) == 256
        assert dst.to_pybytes() == pattern(256, 5)
        assert host.to_pybytes() == b"\x09" * 256
        s.clear_race_report()
        del stream, host, view, dst, source
        gc.collect()
        s.assert_clean()


def learn_by(how: str, s: sim.Simulator, stream: cuda.Stream) -> None:
    """Make the host learn that ``stream``'s work so far is done, as ``how`` says."""
    ctx = s.context(0)
    if how == "stream":
        stream.synchronize()
    elif how == "event":
        stream.record_event().synchronize()
    elif how == "other stream":
        other = ctx.new_stream(non_blocking=True)
        other.wait_event(stream.record_event())
        other.synchronize()
    elif how == "transfer":
        out = s.new_host_buffer(4)
        stream.copy_to_host(ctx.new_buffer(4), out).wait()  # after the view's write
    elif how == "context":
        ctx.synchronize()
    elif how == "query":
        while not stream.query():
            pass
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["stream", "event", "other stream", "transfer", "context", "query"])
def test_host_access_after_the_program_synchronized_a_device_view_copy_is_never_flagged(how: str) -> None:
    for s in simulators():
        stream, host, view = view_write(s)
        learn_by(how, s, stream)
        assert bytes(host) == b"\x07" * 256
        assert host.to_pybytes() == b"\x07" * 256 and host[0] == 7
        assert np.frombuffer(host, dtype=np.uint8).sum() == 7 * 256
        memoryview(host)[:] = pattern(256)
        assert view.to_pybytes() == pattern(256)
        # The other way round: a stream reads through the view, the host writes after.
        ctx = s.context(0)
        dst = ctx.new_buffer(256)
        stream.copy_device(dst, view)
        learn_by(how, s, stream)
        memoryview(host)[:] = b"\x01" * 256
        assert dst.to_pybytes() == pattern(256)
        assert list(s.race_report()) == [], how
        del stream, host, view, dst
        gc.collect()
        s.assert_clean()


def test_a_synchronous_copy_of_pinned_bytes_follows_the_legacy_streams_order() -> None:
    # Not a host access: the legacy stream waits for blocking streams (the simulator checks
    # the copy itself), and not for non-blocking ones.
    for s in simulators():
        dst = s.context(0).new_buffer(256)
        stream, host, view = view_write(s, non_blocking=False)
        dst.copy_from_host(host)
        assert dst.to_pybytes() == b"\x07" * 256
        assert list(s.race_report()) == []
        stream, host, view = view_write(s, non_blocking=True)
        with pytest.raises(cudabuf.DataRaceError, match="synchronous H2D"):
            dst.copy_from_host(host)
        stream.synchronize()
        s.clear_race_report()
        del stream, host, view, dst
        gc.collect()
        s.assert_clean()
