"""Results handed to pyarrow: host buffers as ``pa.Buffer`` (zero-copy, kept alive) and a
device-buffer reader as a pyarrow file (``BufferReader.to_pyarrow``)."""

from __future__ import annotations

import gc
import gzip

import pytest

import cudabuf
from cudabuf import cuda, sim

pa = pytest.importorskip("pyarrow")
pa_ipc = pytest.importorskip("pyarrow.ipc")


def sample_table() -> "pa.Table":
    batch = pa.record_batch(
        [
            pa.array(list(range(1000)), pa.int64()),
            pa.array([f"s{i % 7}" for i in range(1000)]).dictionary_encode(),
            pa.array([None if i % 5 == 0 else i / 2 for i in range(1000)]),
        ],
        names=["i", "d", "f"],
    )
    return pa.Table.from_batches([batch, batch.slice(10, 300)])


def ipc_stream_bytes(table: "pa.Table") -> bytes:
    sink = pa.BufferOutputStream()
    with pa_ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_copy_to_host_result_is_a_zero_copy_pyarrow_buffer(ctx: cuda.Context) -> None:
    dbuf = ctx.buffer_from_data(bytes(range(200)))
    host = dbuf.copy_to_host()
    arrow = host.to_pyarrow()
    assert isinstance(arrow, pa.Buffer)
    assert (arrow.address, arrow.size) == (host.address, host.size)
    assert arrow.is_cpu
    memoryview(host)[3] = 0xEE  # the same memory: a write through one shows in the other
    assert arrow.to_pybytes()[3] == 0xEE
    # The pyarrow buffer (and its slices) keep cudabuf's memory alive.
    piece = arrow.slice(100, 50)
    del host, arrow, dbuf
    gc.collect()
    assert piece.to_pybytes() == bytes(range(100, 150))


def test_a_sliced_buffer_converts_with_its_offset(ctx: cuda.Context) -> None:
    host = ctx.buffer_from_data(b"0123456789").copy_to_host()
    part = host.slice(2, 5)
    arrow = part.to_pyarrow()
    assert arrow.address == host.address + 2
    assert arrow.to_pybytes() == b"23456"


def test_pinned_host_buffer_lives_while_its_pyarrow_buffer_does() -> None:
    s = sim.Simulator(devices=1)
    host = s.new_host_buffer(64)
    memoryview(host)[:4] = b"pin!"
    arrow = host.to_pyarrow()
    assert arrow.address == host.address
    del host
    gc.collect()
    [leak] = s.leak_report()
    assert (leak.kind, leak.size) == ("pinned", 64)
    assert arrow.to_pybytes()[:4] == b"pin!"
    del arrow
    s.assert_clean()


def test_pyarrow_reads_an_ipc_stream_on_the_device_through_to_pyarrow(
    ctx: cuda.Context,
) -> None:
    table = sample_table()
    dbuf = ctx.buffer_from_data(ipc_stream_bytes(table))
    reader = cuda.BufferReader(dbuf)
    source = reader.to_pyarrow()
    assert isinstance(source, pa.NativeFile)
    assert source.readable() and source.seekable() and not source.writable()
    assert source.size() == dbuf.size
    stream = pa_ipc.open_stream(source)
    assert stream.schema.equals(table.schema)
    assert stream.read_all().equals(table)
    assert reader.tell() == dbuf.size  # the same position: everything was read


def test_pyarrow_reads_an_ipc_file_with_random_access(ctx: cuda.Context) -> None:
    table = sample_table()
    sink = pa.BufferOutputStream()
    with pa_ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches():
            writer.write_batch(batch)
    dbuf = ctx.buffer_from_data(sink.getvalue())
    with pa_ipc.open_file(cuda.BufferReader(dbuf).to_pyarrow()) as file:
        assert file.num_record_batches == 2
        assert file.get_batch(1).equals(table.to_batches()[1])
        assert file.read_all().equals(table)


def test_pyarrow_input_stream_decompresses_from_the_device(ctx: cuda.Context) -> None:
    payload = bytes(range(256)) * 64
    dbuf = ctx.buffer_from_data(gzip.compress(payload))
    stream = pa.input_stream(cuda.BufferReader(dbuf).to_pyarrow(), compression="gzip")
    assert stream.read() == payload


def test_the_pyarrow_file_shares_the_readers_position_and_closes_it(
    ctx: cuda.Context,
) -> None:
    reader = cuda.BufferReader(ctx.buffer_from_data(b"abcdefghij"))
    assert reader.read(2) == b"ab"
    source = reader.to_pyarrow()
    assert source.tell() == 2
    assert source.read(3) == b"cde"
    assert reader.tell() == 5
    assert reader.read_buffer(2).to_pybytes() == b"fg"  # pyarrow.cuda's read_buffer is kept
    assert source.read_at(3, 0) == b"abc"
    source.close()
    assert reader.closed
    with pytest.raises(cudabuf.ClosedError):
        reader.read(1)


def test_pythonfile_over_the_reader_itself_fails_as_documented(ctx: cuda.Context) -> None:
    # pyarrow prefers a file object's read_buffer and needs host bytes from it; the
    # reader's read_buffer returns device memory (pyarrow.cuda's semantics), hence
    # to_pyarrow().
    data = ipc_stream_bytes(sample_table())
    reader = cuda.BufferReader(ctx.buffer_from_data(data))
    with pytest.raises(TypeError):
        pa_ipc.open_stream(pa.PythonFile(reader, mode="r"))


def test_to_pyarrow_follows_the_lending_rule(cudabuf_sim: sim.Simulator) -> None:
    ctx = cudabuf_sim.context(0)
    stream = ctx.new_stream(non_blocking=True)
    src = ctx.buffer_from_data(b"download")
    host = cudabuf_sim.new_host_buffer(8)
    transfer = stream.copy_to_host(src, host)
    with pytest.raises(cudabuf.BufferInUseError):
        host.to_pyarrow()  # lent to the copy in flight
    transfer.wait()
    arrow = host.to_pyarrow()
    assert arrow.to_pybytes() == b"download"
    with pytest.raises(cudabuf.BufferInUseError, match="exported"):
        stream.copy_from_host(src, host)  # the pyarrow buffer is an export
    del arrow
    gc.collect()
    stream.copy_from_host(src, host).wait()
    del transfer
