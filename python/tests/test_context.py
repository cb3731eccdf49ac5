"""Context: devices, handles, accounting, allocation."""

from __future__ import annotations

import pytest

import cudabuf
from cudabuf import cuda


def test_num_devices_and_device_numbers() -> None:
    n = cuda.Context.get_num_devices()
    assert n >= 1
    assert cuda.Context(0).device_number == 0
    last = cuda.Context(n - 1)
    assert last.device_number == n - 1
    # Fixed pyarrow quirk: a buffer's context knows its device.
    assert last.new_buffer(8).context.device_number == n - 1


def test_invalid_device_is_a_value_error() -> None:
    n = cuda.Context.get_num_devices()
    with pytest.raises(cudabuf.InvalidDeviceError) as info:
        cuda.Context(n)
    assert isinstance(info.value, ValueError)
    assert info.value.kind == "InvalidDevice"
    assert info.value.cuda_name == "CUDA_ERROR_INVALID_DEVICE"
    with pytest.raises(cudabuf.InvalidArgumentError):
        cuda.Context(-1)


def test_contexts_of_a_device_share_accounting(ctx: cuda.Context) -> None:
    other = cuda.Context(0)
    assert other == ctx
    assert hash(other) == hash(ctx)
    before = ctx.bytes_allocated
    buf = other.new_buffer(128)
    assert ctx.bytes_allocated == before + 128
    view = ctx.buffer_from_object(buf)
    sliced = buf.slice(8, 8)
    assert ctx.bytes_allocated == before + 128  # views and slices are not counted
    del buf, view, sliced
    assert ctx.bytes_allocated == before


def test_handle_is_the_primary_context(ctx: cuda.Context) -> None:
    assert isinstance(ctx.handle, int)
    assert cuda.Context(0, handle=ctx.handle) == ctx
    assert cuda.Context(0, handle=None) == ctx
    # pyarrow would wrap any integer as a CUcontext (and crash); cudabuf refuses.
    with pytest.raises(cudabuf.InvalidArgumentError, match="primary context"):
        cuda.Context(0, handle=ctx.handle ^ 0x10)


def test_new_buffer(ctx: cuda.Context) -> None:
    buf = ctx.new_buffer(1000)
    assert buf.size == 1000 and len(buf) == 1000
    assert buf.address != 0
    assert not buf.is_cpu
    assert buf.context == ctx
    assert buf.parent is None
    empty = ctx.new_buffer(0)
    assert empty.size == 0 and empty.address == 0
    assert empty.to_pybytes() == b""
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(-1)


def test_out_of_memory_is_a_memory_error(ctx: cuda.Context) -> None:
    with pytest.raises(cudabuf.OutOfMemoryError) as info:
        ctx.new_buffer(1 << 60)
    assert isinstance(info.value, MemoryError)
    assert info.value.cuda_name == "CUDA_ERROR_OUT_OF_MEMORY"


def test_synchronize_and_repr(ctx: cuda.Context) -> None:
    ctx.synchronize()
    assert "device_number=0" in repr(ctx)
    assert ctx.backend == cudabuf.get_backend()


def test_cuda_buffer_constructor_is_private() -> None:
    with pytest.raises(TypeError, match="Do not call CudaBuffer's constructor directly"):
        cuda.CudaBuffer()
