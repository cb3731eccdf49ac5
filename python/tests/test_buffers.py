"""CudaBuffer: copies, slices, views, and their checks (pyarrow.cuda's semantics, with
cudabuf's fixed quirks)."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda

SIZES = [0, 1, 1000]


def random_bytes(size: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 255, size=size, dtype=np.uint8)


def device(ctx: cuda.Context, arr: np.ndarray) -> cuda.CudaBuffer:
    return ctx.buffer_from_data(arr)


@pytest.mark.parametrize("size", SIZES)
def test_buffer_from_data_sources(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    for source in (arr, arr.tobytes(), bytearray(arr.tobytes()), pa.py_buffer(arr.tobytes()), memoryview(arr)):
        cbuf = ctx.buffer_from_data(source)
        assert cbuf.size == size
        assert cbuf.to_pybytes() == arr.tobytes()
    host = cuda.new_host_buffer(size)
    np.frombuffer(host, dtype=np.uint8)[:] = arr
    assert ctx.buffer_from_data(host).to_pybytes() == arr.tobytes()
    # From another device buffer: a copy, not a view.
    cbuf = ctx.buffer_from_data(arr)
    copy = ctx.buffer_from_data(cbuf)
    if size:
        copy.copy_from_host(b"\x00", position=0)
        assert cbuf.to_pybytes() == arr.tobytes()
        assert copy.to_pybytes()[0] == 0


@pytest.mark.parametrize("size", [8, 1000])
def test_buffer_from_data_offset_and_size(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    off, n = size // 4, size // 2
    for source in (arr, arr.tobytes(), ctx.buffer_from_data(arr)):
        assert ctx.buffer_from_data(source, offset=off, size=n).to_pybytes() == arr[off : off + n].tobytes()
        assert ctx.buffer_from_data(source, offset=off).to_pybytes() == arr[off:].tobytes()
        with pytest.raises(cudabuf.OutOfRangeError):
            ctx.buffer_from_data(source, offset=off, size=size)
        with pytest.raises(cudabuf.OutOfRangeError):
            ctx.buffer_from_data(source, offset=size + 1)
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.buffer_from_data(arr, offset=-1)


def test_buffer_from_data_rejects_non_buffers(ctx: cuda.Context) -> None:
    with pytest.raises(TypeError, match="buffer protocol"):
        ctx.buffer_from_data([1, 2, 3])
    strided = np.arange(10, dtype=np.uint8)[::2]
    with pytest.raises(TypeError):
        ctx.buffer_from_data(strided)


@pytest.mark.parametrize("size", SIZES)
def test_copy_to_host(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    dbuf = device(ctx, arr)
    out = dbuf.copy_to_host()
    assert isinstance(out, cuda.Buffer) and out.is_cpu
    np.testing.assert_equal(np.frombuffer(out, dtype=np.uint8), arr)
    np.testing.assert_equal(np.frombuffer(dbuf.copy_to_host(position=size // 4), dtype=np.uint8), arr[size // 4 :])
    part = dbuf.copy_to_host(position=size // 4, nbytes=size // 8)
    np.testing.assert_equal(np.frombuffer(part, dtype=np.uint8), arr[size // 4 : size // 4 + size // 8])
    assert dbuf.copy_to_host(position=size, nbytes=0).size == 0  # position == size is allowed
    for position, nbytes in [(size + 2, -1), (size + 1, 0)]:
        with pytest.raises(cudabuf.OutOfRangeError):
            dbuf.copy_to_host(position=position, nbytes=nbytes)
    with pytest.raises(ValueError):  # negative positions: pyarrow's ValueError
        dbuf.copy_to_host(position=-2)
    for position, nbytes in [(0, size + 1), (size // 2, (size + 1) // 2 + 1), (size, 1)]:
        with pytest.raises(cudabuf.OutOfRangeError, match="available in device buffer"):
            dbuf.copy_to_host(position=position, nbytes=nbytes)


@pytest.mark.parametrize("size", [16, 1000])
def test_copy_to_host_into_caller_buffer(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    dbuf = device(ctx, arr)
    for target in (bytearray(size // 4), np.zeros(size // 4, dtype=np.uint8), cuda.new_host_buffer(size // 4)):
        assert dbuf.copy_to_host(buf=target) is target
        np.testing.assert_equal(np.frombuffer(target, dtype=np.uint8), arr[: size // 4])
        dbuf.copy_to_host(buf=target, position=3, nbytes=2)
        np.testing.assert_equal(np.frombuffer(target, dtype=np.uint8)[:2], arr[3:5])
    target = bytearray(size // 4)
    with pytest.raises(cudabuf.OutOfRangeError, match="host buffer"):
        dbuf.copy_to_host(buf=target, nbytes=size // 2)
    # Fixed pyarrow quirk: the device range is checked when the caller gives the buffer.
    with pytest.raises(cudabuf.OutOfRangeError, match="device buffer"):
        dbuf.copy_to_host(buf=bytearray(size), position=size - 2, nbytes=4)
    with pytest.raises(BufferError):
        dbuf.copy_to_host(buf=b"read-only bytes")
    with pytest.raises(cudabuf.UnsupportedError):
        dbuf.copy_to_host(resizable=True)
    # memory_pool is accepted (pyarrow's signature) and not needed.
    assert dbuf.copy_to_host(memory_pool=pa.default_memory_pool()).to_pybytes() == arr.tobytes()


@pytest.mark.parametrize("size", SIZES)
def test_copy_from_host(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    lst = arr.tolist()
    dbuf = ctx.new_buffer(size)

    def put(*args: object, **kwargs: object) -> list[int]:
        assert dbuf.copy_from_host(arr, *args, **kwargs) >= 0
        return list(dbuf.to_pybytes())

    assert put() == lst
    if size > 4:
        half = arr[: size // 2]
        assert dbuf.copy_from_host(half, position=size // 4) == size // 2
        assert list(dbuf.to_pybytes()) == lst[: size // 4] + lst[: size // 2] + lst[size // 4 + size // 2 :]
        assert put() == lst
        assert put(position=1, nbytes=size // 2) == lst[:1] + lst[: size // 2] + lst[1 + size // 2 :]
    with pytest.raises(cudabuf.SourceTooShortError, match="available from host buffer"):
        dbuf.copy_from_host(arr, nbytes=size + 1)
    with pytest.raises(cudabuf.OutOfRangeError):
        dbuf.copy_from_host(arr, position=size + 1, nbytes=0)
    if size >= 4:
        # Fixed pyarrow quirk: nbytes=-1 copies all of the source or nothing.
        before = dbuf.to_pybytes()
        with pytest.raises(cudabuf.OutOfRangeError, match="available in device buffer"):
            dbuf.copy_from_host(arr, position=size // 2)
        assert dbuf.to_pybytes() == before


def test_copy_from_host_positions(ctx: cuda.Context) -> None:
    dbuf = ctx.buffer_from_data(b"abcdefgh")
    assert dbuf.copy_from_host(b"XYZ", position=2, nbytes=2) == 2
    assert dbuf.to_pybytes() == b"abXYefgh"
    assert dbuf.copy_from_host(b"", position=8) == 0


@pytest.mark.parametrize("another", [False, True])
@pytest.mark.parametrize("size", SIZES)
def test_copy_from_device(ctx: cuda.Context, size: int, another: bool) -> None:
    arr = random_bytes(size)
    src = device(ctx, arr)
    dest_ctx = cuda.Context(cuda.Context.get_num_devices() - 1) if another else ctx
    if another and dest_ctx.device_number == ctx.device_number:
        pytest.skip("one device only: no peer copy to test")
    dst = dest_ctx.new_buffer(size)
    assert dst.copy_from_device(src) == size
    assert dst.to_pybytes() == arr.tobytes()
    if size > 4:
        dst.copy_from_device(src.slice(0, size // 4), position=size // 2)
        assert dst.to_pybytes() == arr[: size // 2].tobytes() + arr[: size // 4].tobytes() + arr[size // 2 + size // 4 :].tobytes()
        with pytest.raises(cudabuf.OutOfRangeError, match="available in device buffer"):
            dst.copy_from_device(src, position=1)
    with pytest.raises(cudabuf.SourceTooShortError, match="available from device buffer"):
        dst.copy_from_device(src, nbytes=size + 1)
    with pytest.raises(ValueError):
        dst.copy_from_device(src, position=-1)
    with pytest.raises(TypeError):
        dst.copy_from_device(arr)


@pytest.mark.parametrize("size", [4, 1000])
def test_slices_alias_and_are_strict(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    cbuf = device(ctx, arr)
    sbuf = cbuf.slice(size // 4, size // 2)
    assert sbuf.parent is cbuf
    assert sbuf.address == cbuf.address + size // 4
    assert sbuf.to_pybytes() == arr[size // 4 : size // 4 + size // 2].tobytes()
    sbuf.copy_from_host(b"\x00" * (size // 2))
    assert cbuf.to_pybytes()[size // 4 : size // 4 + size // 2] == b"\x00" * (size // 2)
    assert cbuf.slice(size // 2).size == size - size // 2
    assert cbuf.slice().size == size
    # Fixed pyarrow quirk: no clamping.
    with pytest.raises(cudabuf.OutOfRangeError):
        cbuf.slice(0, size + 10)
    with pytest.raises(cudabuf.OutOfRangeError):
        cbuf.slice(size + 1)


def test_getitem_and_iteration(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"\x01\x02\x03\x04\x05")
    assert cbuf[0] == 1 and cbuf[-1] == 5
    assert cbuf[1:3].to_pybytes() == b"\x02\x03"
    assert cbuf[3:100].to_pybytes() == b"\x04\x05"  # Python slice syntax clamps
    assert cbuf[:].parent is cbuf
    with pytest.raises(IndexError):
        cbuf[5]
    with pytest.raises(IndexError):
        cbuf[::2]
    assert list(cbuf) == [1, 2, 3, 4, 5]


def test_equality(ctx: cuda.Context) -> None:
    a = ctx.buffer_from_data(b"same bytes")
    b = ctx.buffer_from_data(b"same bytes")
    assert a == b and a.equals(b) and a.equals(b"same bytes")
    assert a != ctx.buffer_from_data(b"different!")
    assert (a == "not bytes") is False
    assert a.slice(0, 4).parent == a


def test_foreign_buffer_over_pinned_memory(ctx: cuda.Context) -> None:
    hbuf = cuda.new_host_buffer(10)
    np.frombuffer(hbuf, dtype=np.uint8)[:] = np.arange(10, dtype=np.uint8)
    rc = sys.getrefcount(hbuf)
    fbuf = ctx.foreign_buffer(hbuf.address, hbuf.size, hbuf)
    assert sys.getrefcount(hbuf) == rc + 1
    assert fbuf.to_pybytes() == bytes(range(10))
    del fbuf
    assert sys.getrefcount(hbuf) == rc
    fbuf = ctx.foreign_buffer(hbuf.address, hbuf.size, hbuf)
    del hbuf  # the base keeps the memory alive
    assert fbuf.to_pybytes() == bytes(range(10))
    assert ctx.foreign_buffer(0, 0).size == 0
    hbuf = cuda.new_host_buffer(10)
    np.frombuffer(hbuf, dtype=np.uint8)[:] = np.arange(10, dtype=np.uint8)
    part = ctx.foreign_buffer(hbuf.address + 2, 4, hbuf)
    assert part.to_pybytes() == bytes([2, 3, 4, 5])
    part.copy_from_host(b"\xff")
    assert hbuf[2] == 255


def test_foreign_buffer_checks_the_range(ctx: cuda.Context) -> None:
    dbuf = ctx.new_buffer(64)
    view = ctx.foreign_buffer(dbuf.address + 8, 16, dbuf)
    view.copy_from_host(b"z" * 16)
    assert dbuf.to_pybytes()[8:24] == b"z" * 16
    with pytest.raises(cudabuf.InvalidAddressError):
        ctx.foreign_buffer(dbuf.address + 8, 64, dbuf)
    with pytest.raises(cudabuf.InvalidAddressError):
        ctx.foreign_buffer(12345, 16)


def test_get_device_address(ctx: cuda.Context) -> None:
    hbuf = cuda.new_host_buffer(16)
    dev = ctx.get_device_address(hbuf.address)
    assert isinstance(dev, int) and dev != 0
    dbuf = ctx.new_buffer(16)
    assert ctx.get_device_address(dbuf.address) == dbuf.address
    pageable = np.zeros(16, dtype=np.uint8)
    with pytest.raises(cudabuf.InvalidAddressError):
        ctx.get_device_address(pageable.ctypes.data)
    with pytest.raises(cudabuf.InvalidAddressError):
        ctx.get_device_address(0)


@pytest.mark.parametrize("size", SIZES)
def test_buffer_from_object(ctx: cuda.Context, size: int) -> None:
    arr = random_bytes(size)
    hbuf = cuda.new_host_buffer(size)
    np.frombuffer(hbuf, dtype=np.uint8)[:] = arr
    view = ctx.buffer_from_object(hbuf)  # pinned memory, seen from the device
    assert view.size == size and view.to_pybytes() == arr.tobytes()
    if size:
        view.copy_from_host(b"\x00")
        assert hbuf[0] == 0  # the same memory
        part = ctx.buffer_from_object(hbuf[size // 2 :])
        assert part.to_pybytes() == bytes(hbuf)[size // 2 :]
    cbuf = ctx.buffer_from_data(arr)
    again = ctx.buffer_from_object(cbuf)
    assert again.size == size and again.address == cbuf.address
    with pytest.raises(cudabuf.InvalidAddressError, match="pageable"):
        ctx.buffer_from_object(cbuf.copy_to_host())
    with pytest.raises(TypeError, match="cannot create device buffer view.*DLPack device is not CUDA"):
        ctx.buffer_from_object(np.array([1, 2, 3]))  # numpy speaks DLPack, on the CPU
    with pytest.raises(TypeError, match="cannot create device buffer view"):
        ctx.buffer_from_object(pa.py_buffer(b"123"))


def test_from_buffer(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"0123456789abcdef")
    assert cuda.CudaBuffer.from_buffer(cbuf) is cbuf
    typed = cbuf.view("int32")
    back = cuda.CudaBuffer.from_buffer(typed)
    assert back.address == cbuf.address and back.size == 16
    with pytest.raises(TypeError):
        cuda.CudaBuffer.from_buffer(b"host bytes")


def test_buffer_on_another_device(ctx: cuda.Context) -> None:
    n = cuda.Context.get_num_devices()
    if n < 2:
        pytest.skip("one device only")
    other = cuda.Context(1)
    buf = other.buffer_from_data(b"on device one")
    assert buf.context.device_number == 1
    assert ctx.buffer_from_data(buf).to_pybytes() == b"on device one"  # peer copy
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.buffer_from_object(buf)
