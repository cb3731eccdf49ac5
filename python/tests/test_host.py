"""Host buffers and the buffer protocol: zero-copy NumPy and pyarrow views that keep the
memory alive."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda


@pytest.mark.parametrize("size", [0, 1, 1000])
def test_new_host_buffer_numpy_view(size: int) -> None:
    buf = cuda.new_host_buffer(size)
    assert isinstance(buf, cuda.HostBuffer) and isinstance(buf, cuda.Buffer)
    assert buf.size == size and len(buf) == size and buf.is_cpu and buf.is_mutable
    arr = np.frombuffer(buf, dtype=np.uint8)
    assert not arr.flags.owndata and arr.flags.writeable
    assert bytes(buf) == b"\x00" * size  # zero-filled
    arr[size // 4 : 3 * size // 4] = 1
    np.testing.assert_equal(np.frombuffer(buf, dtype=np.uint8), arr)
    assert buf.to_pybytes() == arr.tobytes()
    if size:
        assert arr.ctypes.data == buf.address


def test_pyarrow_views_are_zero_copy_and_keep_memory_alive() -> None:
    buf = cuda.new_host_buffer(64)
    np.frombuffer(buf, dtype=np.uint8)[:] = np.arange(64, dtype=np.uint8)
    pbuf = pa.py_buffer(buf)
    assert pbuf.address == buf.address and pbuf.size == 64
    ref = weakref.ref(buf)
    del buf
    gc.collect()
    assert ref() is not None  # the pyarrow buffer holds the exporter
    assert pbuf.to_pybytes() == bytes(range(64))
    arr = pa.Array.from_buffers(pa.int64(), 8, [None, pbuf])
    assert arr.to_pylist()[1] == int.from_bytes(bytes(range(8, 16)), "little")
    del pbuf, arr
    gc.collect()
    assert ref() is None


def test_memoryview_slices_keep_memory_alive() -> None:
    buf = cuda.new_host_buffer(16)
    mv = memoryview(buf)
    assert mv.format == "B" and mv.nbytes == 16 and not mv.readonly
    tail = mv[8:]
    del buf, mv
    gc.collect()
    tail[:] = b"\x07" * 8
    assert bytes(tail) == b"\x07" * 8


def test_host_slices_and_items() -> None:
    buf = cuda.new_host_buffer(10)
    buf_np = np.frombuffer(buf, dtype=np.uint8)
    buf_np[:] = np.arange(10, dtype=np.uint8)
    assert buf[3] == 3 and buf[-1] == 9
    part = buf.slice(2, 4)
    assert isinstance(part, cuda.Buffer) and not isinstance(part, cuda.HostBuffer)
    assert part.parent is buf
    assert part.to_pybytes() == bytes([2, 3, 4, 5])
    assert part.address == buf.address + 2
    assert buf[2:6] == part
    assert buf.slice(8).to_pybytes() == bytes([8, 9])
    np.frombuffer(part, dtype=np.uint8)[:] = 0
    assert buf.to_pybytes()[2:6] == b"\x00" * 4
    with pytest.raises(cudabuf.OutOfRangeError):
        buf.slice(8, 4)
    with pytest.raises(IndexError):
        buf[10]


def test_copy_to_host_result_is_a_writable_buffer(ctx: cuda.Context) -> None:
    out = ctx.buffer_from_data(b"abcdef").copy_to_host()
    assert type(out) is cuda.Buffer
    assert out == b"abcdef" and out.equals(pa.py_buffer(b"abcdef"))
    np.frombuffer(out, dtype=np.uint8)[0] = ord("z")
    assert out.to_pybytes() == b"zbcdef"
    assert pa.py_buffer(out).to_pybytes() == b"zbcdef"
    assert "pageable" in repr(out)


def test_host_buffer_constructor_is_private() -> None:
    with pytest.raises(TypeError, match="Do not call HostBuffer's constructor directly"):
        cuda.HostBuffer()
    with pytest.raises(TypeError):
        cuda.Buffer(b"abc")


def test_host_buffer_on_each_device() -> None:
    for device in range(cuda.Context.get_num_devices()):
        assert cuda.new_host_buffer(32, device=device).size == 32
    with pytest.raises(cudabuf.InvalidDeviceError):
        cuda.new_host_buffer(32, device=cuda.Context.get_num_devices())
    with pytest.raises(cudabuf.InvalidArgumentError):
        cuda.new_host_buffer(-1)


def test_pinned_round_trip_through_the_device(ctx: cuda.Context) -> None:
    src = cuda.new_host_buffer(1 << 20)
    np.frombuffer(src, dtype=np.uint32)[:] = np.arange(1 << 18, dtype=np.uint32)
    dbuf = ctx.buffer_from_data(src)
    dst = cuda.new_host_buffer(1 << 20)
    dbuf.copy_to_host(buf=dst)
    np.testing.assert_equal(np.frombuffer(dst, dtype=np.uint32), np.arange(1 << 18, dtype=np.uint32))
