"""Streams on a GPU: the CUDA stream protocol, PyTorch's and CuPy's streams both ways, and
a pipeline that overlaps an upload, a PyTorch kernel and a download on cudabuf streams.

Every test here runs on the CUDA backend (``cudabuf_cuda`` marker): without a CUDA
driver and device they are skipped with the reason (and fail instead under
``CUDABUF_REQUIRE_CUDA=1``); without PyTorch or CuPy the tests that need them are
skipped with the reason too.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

import cudabuf
from cudabuf import cuda

pytestmark = pytest.mark.cudabuf_cuda


def test_stream_handles_and_the_protocol() -> None:
    ctx = cuda.Context(0)
    assert ctx.backend == "cuda"
    stream = ctx.new_stream(non_blocking=True)
    assert stream.handle not in (0, 1, 2) and stream.ptr == stream.handle
    assert stream.__cuda_stream__() == (0, stream.handle)
    assert ctx.default_stream().__cuda_stream__() == (0, 1)  # CU_STREAM_LEGACY
    # An integer handle of a live stream of this context wraps (the caller vouches for
    # it); the driver reports its flags.
    wrapped = ctx.wrap_stream(stream.handle)
    assert wrapped.kind == "foreign" and wrapped.handle == stream.handle and wrapped.non_blocking
    buf = ctx.new_buffer(5)
    wrapped.copy_from_host(buf, b"cuda!").wait()
    assert buf.to_pybytes() == b"cuda!"
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(16, stream=wrapped)  # its free could outlive the foreign stream
    start, end = cuda.Event(ctx, timing=True), cuda.Event(ctx, timing=True)
    start.record(stream)
    stream.copy_from_host(ctx.new_buffer(64 << 20), bytes(64 << 20)).wait()
    end.record(stream)
    end.synchronize()
    assert start.elapsed_time(end) > 0


def test_torch_runs_on_our_stream_and_we_run_on_torchs(torch: ModuleType) -> None:
    ctx = cuda.Context(0)
    n = 1 << 20
    data = np.arange(n, dtype=np.float32)
    # Ours in PyTorch: an upload, a PyTorch kernel and a download in one stream's order.
    ours = ctx.new_stream(non_blocking=True)
    buf = ctx.new_buffer(data.nbytes)
    host_in = cuda.new_host_buffer(data.nbytes)
    np.frombuffer(host_in, dtype=np.float32)[:] = data  # the temporary view is gone after this line
    upload = ours.copy_from_host(buf, host_in)
    with pytest.raises(cudabuf.BufferInUseError):
        np.frombuffer(host_in, dtype=np.float32)  # lent to the upload until it is waited for
    tensor = torch.from_dlpack(buf.view("float32"))  # zero-copy
    with torch.cuda.stream(torch.cuda.ExternalStream(ours.handle)):
        tensor.mul_(3)
    host_out = cuda.new_host_buffer(data.nbytes)
    ours.copy_to_host(buf, host_out).wait()
    upload.wait()
    assert np.array_equal(np.frombuffer(host_out, dtype=np.float32), data * 3)

    # Theirs in cudabuf: a PyTorch stream wrapped, kept alive by the wrapper.
    theirs = ctx.wrap_stream(torch.cuda.Stream())
    assert theirs.kind == "foreign"
    with torch.cuda.stream(torch.cuda.ExternalStream(theirs.handle)):
        tensor.add_(1)  # queued on the PyTorch stream
    theirs.copy_to_host(buf, host_out).wait()  # after the kernel, in the stream's order
    assert np.array_equal(np.frombuffer(host_out, dtype=np.float32), data * 3 + 1)
    default = ctx.wrap_stream(torch.cuda.default_stream())
    assert default.kind == "legacy default"
    if torch.cuda.device_count() > 1:
        with pytest.raises(cudabuf.InvalidArgumentError, match="device 1"):
            ctx.wrap_stream(torch.cuda.Stream(device=1))


def test_cupy_runs_on_our_stream_and_we_run_on_cupys(cupy: ModuleType) -> None:
    ctx = cuda.Context(0)
    data = np.arange(4096, dtype=np.float64)
    ours = ctx.new_stream()
    buf = ctx.buffer_from_data(data)
    array = cupy.asarray(buf.view("float64"))  # zero-copy
    with cupy.cuda.ExternalStream(ours.handle):
        array *= 2
    host = cuda.new_host_buffer(data.nbytes)
    ours.copy_to_host(buf, host).wait()
    assert np.array_equal(np.frombuffer(host, dtype=np.float64), data * 2)
    theirs = ctx.wrap_stream(cupy.cuda.Stream(non_blocking=True))
    assert theirs.kind == "foreign" and theirs.non_blocking  # the driver's flags
    with cupy.cuda.ExternalStream(theirs.handle):
        array += 1
    theirs.copy_to_host(buf, host).wait()
    assert np.array_equal(np.frombuffer(host, dtype=np.float64), data * 2 + 1)


def run_pipeline(
    torch: ModuleType,
    ctx: cuda.Context,
    streams: tuple[cuda.Stream, cuda.Stream, cuda.Stream],
    host_in: cuda.HostBuffer,
    host_out: cuda.HostBuffer,
    d_in: cuda.CudaBuffer,
    d_out: cuda.CudaBuffer,
    chunks: int,
) -> float:
    """Upload, ``x * 2`` in PyTorch, download, chunk by chunk: each stage on its stream,
    each chunk's stages ordered by events. Returns the milliseconds from the first
    upload to the last download."""
    up, compute, down = streams
    t_in = torch.from_dlpack(d_in.view("float32"))
    t_out = torch.from_dlpack(d_out.view("float32"))
    torch_compute = torch.cuda.ExternalStream(compute.handle)
    chunk = d_in.size // chunks
    items = chunk // 4
    start, end = cuda.Event(ctx, timing=True), cuda.Event(ctx, timing=True)
    start.record(up)
    compute.wait_event(start)
    down.wait_event(start)
    transfers = []
    for i in range(chunks):
        a, b = i * chunk, (i + 1) * chunk
        transfers.append(up.copy_from_host(d_in.slice(a, chunk), host_in[a:b]))
        compute.wait_event(up.record_event())
        with torch.cuda.stream(torch_compute):
            torch.mul(t_in[i * items : (i + 1) * items], 2.0, out=t_out[i * items : (i + 1) * items])
        down.wait_event(compute.record_event())
        transfers.append(down.copy_to_host(d_out.slice(a, chunk), host_out[a:b]))
    end.record(down)
    end.synchronize()
    for t in transfers:
        t.wait()
    return start.elapsed_time(end)


def test_a_pipeline_overlaps_upload_pytorch_and_download(torch: ModuleType) -> None:
    ctx = cuda.Context(0)
    chunks, size = 8, 256 << 20
    host_in, host_out = cuda.new_host_buffer(size), cuda.new_host_buffer(size)
    values = np.frombuffer(host_in, dtype=np.float32)
    values[:] = np.arange(size // 4, dtype=np.float32) % 1000
    expected = values * 2
    del values  # a live view of host_in would refuse the uploads
    d_in, d_out = ctx.new_buffer(size), ctx.new_buffer(size)
    three = (ctx.new_stream(non_blocking=True), ctx.new_stream(non_blocking=True), ctx.new_stream(non_blocking=True))
    one = ctx.new_stream(non_blocking=True)

    run_pipeline(torch, ctx, three, host_in, host_out, d_in, d_out, chunks)  # warm-up
    overlapped = run_pipeline(torch, ctx, three, host_in, host_out, d_in, d_out, chunks)
    assert np.array_equal(np.frombuffer(host_out, dtype=np.float32), expected)

    # The same work on one stream: no two stages overlap, so it takes their sum.
    memoryview(host_out)[:] = bytes(size)
    serial = run_pipeline(torch, ctx, (one, one, one), host_in, host_out, d_in, d_out, chunks)
    assert np.array_equal(np.frombuffer(host_out, dtype=np.float32), expected)
    print(f"pipeline of {chunks} x {size // chunks >> 20} MiB: {overlapped:.2f} ms on three streams, {serial:.2f} ms on one")
    # Uploads and downloads use separate copy engines: overlapped, the pipeline takes
    # about the longer of the two, not their sum (a generous margin).
    assert overlapped < 0.85 * serial
