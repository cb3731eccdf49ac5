"""BufferReader and BufferWriter (pyarrow.cuda's file interfaces)."""

from __future__ import annotations

import numpy as np
import pytest

import cudabuf
from cudabuf import cuda


def random_bytes(size: int) -> bytes:
    return np.random.default_rng(1).integers(0, 256, size=size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("buffer_size", [0, 1 << 12])
def test_writer_in_chunks(ctx: cuda.Context, buffer_size: int) -> None:
    total, chunk = 1 << 16, 1000
    data = random_bytes(total)
    cbuf = ctx.new_buffer(total)
    writer = cuda.BufferWriter(cbuf)
    if buffer_size:
        writer.buffer_size = buffer_size
        assert writer.buffer_size == buffer_size
    assert writer.tell() == 0
    assert writer.write(data[:chunk]) == chunk
    assert writer.tell() == chunk
    assert writer.seek(0) == 0
    for position in range(0, total, chunk):
        writer.write(memoryview(data)[position : position + chunk])
    writer.flush()
    assert writer.num_bytes_buffered == 0
    assert cbuf.to_pybytes() == data


def test_writer_edge_cases(ctx: cuda.Context) -> None:
    data = random_bytes(1000)
    cbuf = ctx.new_buffer(1000)
    writer = cuda.BufferWriter(cbuf)
    assert writer.buffer_size == 0
    writer.buffer_size = 100
    writer.write(b"")
    assert writer.tell() == 0
    writer.write(data[:10])
    assert writer.num_bytes_buffered == 10
    writer.buffer_size = 200  # flushes first
    assert writer.buffer_size == 200 and writer.num_bytes_buffered == 0
    writer.write(data[10:310])  # larger than the staging buffer: goes straight through
    assert writer.num_bytes_buffered == 0
    writer.write(data[310:900])
    writer.write(data[900:])
    writer.flush()
    assert cbuf.to_pybytes() == data


def test_writeat_flushes_staged_bytes_first(ctx: cuda.Context) -> None:
    cbuf = ctx.new_buffer(100)
    writer = cuda.BufferWriter(cbuf)
    writer.buffer_size = 256
    writer.write(np.arange(100, dtype=np.uint8))
    assert writer.num_bytes_buffered == 100
    # pyarrow writes the staged bytes at the wrong place here; cudabuf flushes them first.
    writer.writeat(50, np.arange(25, dtype=np.uint8))
    assert writer.tell() == 75  # as Arrow's WriteAt
    writer.write(np.arange(25, dtype=np.uint8))
    writer.flush()
    arr = np.frombuffer(cbuf.copy_to_host(), dtype=np.uint8)
    np.testing.assert_equal(arr[:50], np.arange(50))
    np.testing.assert_equal(arr[50:75], np.arange(25))
    np.testing.assert_equal(arr[75:], np.arange(25))
    with pytest.raises(cudabuf.OutOfRangeError):
        writer.writeat(90, b"x" * 20)


def test_writer_bounds_whence_and_close(ctx: cuda.Context) -> None:
    cbuf = ctx.new_buffer(10)
    writer = cuda.BufferWriter(cbuf)
    assert writer.writable() and writer.seekable() and not writer.readable()
    assert writer.seek(10) == 10  # exactly the end is allowed (fixed pyarrow quirk)
    assert writer.seek(-4, 1) == 6
    assert writer.seek(-2, 2) == 8
    with pytest.raises(cudabuf.OutOfRangeError):
        writer.write(b"abc")  # past the end: nothing written
    with pytest.raises(ValueError):
        writer.seek(0, 7)
    with pytest.raises(cudabuf.OutOfRangeError):
        writer.seek(11)
    with writer:
        writer.write(b"ab")
    assert writer.closed
    with pytest.raises(cudabuf.ClosedError):
        writer.write(b"x")
    assert cbuf.to_pybytes()[8:] == b"ab"


def test_reader(ctx: cuda.Context) -> None:
    data = random_bytes(1000)
    cbuf = ctx.buffer_from_data(data)
    reader = cuda.BufferReader(cbuf)
    assert reader.readable() and reader.seekable() and not reader.writable()
    assert reader.size() == 1000
    assert reader.seek(950) == 950 and reader.tell() == 950
    chunk = reader.read(100)
    assert chunk == data[950:] and reader.tell() == 1000
    reader.seek(925)
    target = np.zeros(100, dtype=np.uint8)
    assert reader.readinto(target) == 75 and reader.tell() == 1000
    assert target[:75].tobytes() == data[925:]
    reader.seek(0)
    dev = reader.read_buffer()
    assert isinstance(dev, cuda.CudaBuffer) and dev.address == cbuf.address
    assert dev.to_pybytes() == data
    reader.seek(10)
    assert reader.read_buffer(5).to_pybytes() == data[10:15] and reader.tell() == 15
    assert reader.read(-1) == data[15:]
    assert reader.seek(-10, 2) == 990 and reader.seek(5, 1) == 995
    with pytest.raises(cudabuf.OutOfRangeError):
        reader.seek(1001)
    with reader:
        pass
    assert reader.closed
    with pytest.raises(cudabuf.ClosedError):
        reader.read(1)


def test_reader_zero_size(ctx: cuda.Context) -> None:
    reader = cuda.BufferReader(ctx.new_buffer(0))
    reader.seek(0)
    assert reader.read() == b"" and reader.tell() == 0
    assert reader.read_buffer().size == 0


def test_reader_and_writer_take_device_buffers(ctx: cuda.Context) -> None:
    with pytest.raises(TypeError):
        cuda.BufferReader(b"host bytes")
    with pytest.raises(TypeError):
        cuda.BufferWriter(bytearray(4))
