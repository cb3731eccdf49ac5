"""Arrow on the device through the Arrow PyCapsule interface, with pip's pyarrow."""

from __future__ import annotations

import ctypes

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda


def make_batch(length: int) -> pa.RecordBatch:
    rng = np.random.default_rng(length)
    return pa.record_batch(
        [
            pa.array(rng.integers(0, 255, size=length, dtype=np.int16)),
            pa.array([None if i % 3 == 0 else f"s{i}" for i in range(length)]),
            pa.array([[i, i + 1] if i % 2 else None for i in range(length)], type=pa.list_(pa.int32())),
        ],
        names=["f0", "f1", "f2"],
    )


@pytest.mark.parametrize("length", [0, 10, 1000])
def test_serialize_and_read_back(ctx: cuda.Context, length: int) -> None:
    batch = make_batch(length)
    cbuf = cuda.serialize_record_batch(batch, ctx)
    assert isinstance(cbuf, cuda.CudaBuffer)
    # A valid encapsulated IPC message that pyarrow reads back (arrow-rs's encoding: its
    # buffers are 64-byte aligned, so the bytes differ from pyarrow's 8-byte-aligned ones).
    message = pa.ipc.read_message(cbuf.copy_to_host())
    assert message.type == "record batch"
    assert pa.ipc.read_record_batch(message, batch.schema).equals(batch)
    assert pa.ipc.read_record_batch(cbuf.copy_to_host(), batch.schema).equals(batch)
    dbatch = cuda.read_record_batch(cbuf, batch.schema)
    assert isinstance(dbatch, cuda.DeviceRecordBatch)
    assert dbatch.num_rows == length == len(dbatch) and dbatch.num_columns == 3
    assert dbatch.schema is batch.schema
    assert dbatch.context == ctx
    body = dbatch.body
    assert body is not None and body.address >= cbuf.address
    host = dbatch.to_host()
    assert isinstance(host, pa.RecordBatch) and host.equals(batch)


def test_column_buffers_are_device_slices(ctx: cuda.Context) -> None:
    batch = pa.record_batch([pa.array(np.arange(16, dtype=np.int64))], names=["x"])
    dbatch = cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema)
    validity, values = dbatch.column_buffers(0)
    assert validity is None
    assert values is not None
    assert np.frombuffer(values.copy_to_host(), dtype=np.int64).tolist() == list(range(16))
    with pytest.raises(cudabuf.OutOfRangeError):
        dbatch.column_buffers(1)


def test_producers(ctx: cuda.Context) -> None:
    batch = make_batch(5)
    table = pa.Table.from_batches([batch])
    from_table = cuda.read_record_batch(cuda.serialize_record_batch(table, ctx), batch.schema)
    assert from_table.to_host().equals(batch)

    class Producer:
        """Any Arrow PyCapsule producer, not a pyarrow type."""

        def __arrow_c_array__(self, requested_schema: object = None) -> object:
            return batch.__arrow_c_array__()

    assert cuda.read_record_batch(cuda.serialize_record_batch(Producer(), ctx), batch.schema).to_host().equals(batch)
    two = pa.Table.from_batches([batch, batch])
    with pytest.raises(cudabuf.InvalidArgumentError, match="2 record batches"):
        cuda.serialize_record_batch(two, ctx)
    with pytest.raises(TypeError, match="record batch"):
        cuda.serialize_record_batch([1, 2, 3], ctx)
    with pytest.raises(cudabuf.InvalidArgumentError, match="struct array"):
        cuda.serialize_record_batch(pa.array([1, 2, 3]), ctx)


def test_dictionary_columns_are_refused(ctx: cuda.Context) -> None:
    batch = pa.record_batch([pa.array(["a", "b", "a"]).dictionary_encode()], names=["d"])
    with pytest.raises(cudabuf.UnsupportedError, match="dictionary"):
        cuda.serialize_record_batch(batch, ctx)
    plain = make_batch(3)
    cbuf = cuda.serialize_record_batch(plain, ctx)
    with pytest.raises(cudabuf.UnsupportedError):
        cuda.read_record_batch(cbuf, plain.schema, dictionary_memo=object())


def test_read_message(ctx: cuda.Context) -> None:
    batch = make_batch(7)
    cbuf = cuda.serialize_record_batch(batch, ctx)
    message = cuda.read_message(cbuf)
    assert message.type == "record batch"
    assert message.metadata_version == "V5"
    assert isinstance(message.metadata, cuda.Buffer) and message.metadata.size > 0
    assert isinstance(message.body, cuda.CudaBuffer)
    assert len(message) == cbuf.size
    assert cuda.read_record_batch(message, batch.schema).to_host().equals(batch)
    # Two messages back to back, read through one reader (fixed pyarrow quirk).
    both = ctx.new_buffer(2 * cbuf.size)
    both.copy_from_device(cbuf)
    both.copy_from_device(cbuf, position=cbuf.size)
    reader = cuda.BufferReader(both)
    first = cuda.read_message(reader)
    assert reader.tell() == cbuf.size
    second = cuda.read_message(reader)
    assert reader.tell() == 2 * cbuf.size
    assert cuda.read_record_batch(second, batch.schema).to_host().equals(batch)
    assert first.body.address < second.body.address
    with pytest.raises(cudabuf.InvalidDataError):  # bytes after the message
        cuda.read_record_batch(both, batch.schema)
    with pytest.raises(TypeError):
        cuda.read_message(b"host bytes")


def test_corrupt_messages_raise(ctx: cuda.Context) -> None:
    batch = make_batch(4)
    host = bytearray(batch.serialize().to_pybytes())
    host[4:8] = (1 << 30).to_bytes(4, "little")  # metadata length far past the end
    with pytest.raises(cudabuf.InvalidDataError):
        cuda.read_record_batch(ctx.buffer_from_data(host), batch.schema)
    with pytest.raises(cudabuf.InvalidDataError):
        cuda.read_message(ctx.buffer_from_data(b"\xff\xff\xff\xff\x10"))
    other_schema = pa.schema([("only", pa.float64())])
    with pytest.raises(cudabuf.InvalidDataError):
        cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), other_schema)


class ArrowDeviceArray(ctypes.Structure):
    """The C Device Data Interface struct, to read what the capsule holds."""

    _fields_ = [
        ("length", ctypes.c_int64),
        ("null_count", ctypes.c_int64),
        ("offset", ctypes.c_int64),
        ("n_buffers", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("buffers", ctypes.c_void_p),
        ("children", ctypes.c_void_p),
        ("dictionary", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("private_data", ctypes.c_void_p),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 3),
    ]


def capsule_pointer(capsule: object, name: bytes) -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return int(get(capsule, name))


def test_arrow_c_device_array(ctx: cuda.Context, on_cuda: bool) -> None:
    batch = make_batch(10)
    dbatch = cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema)
    schema_capsule, array_capsule = dbatch.__arrow_c_device_array__()
    assert pa.schema(dbatch) == batch.schema  # the schema capsule through pyarrow
    assert pa.Schema._import_from_c_capsule(schema_capsule) == batch.schema
    device_array = ArrowDeviceArray.from_address(capsule_pointer(array_capsule, b"arrow_device_array"))
    assert device_array.length == 10 and device_array.n_children == 3
    assert device_array.device_id == ctx.device_number
    assert device_array.device_type == (2 if on_cuda else 12)  # CUDA, or an extension device
    assert device_array.release != 0 and device_array.sync_event is None
    with pytest.raises(NotImplementedError):
        dbatch.__arrow_c_device_array__(future_option=True)
    assert dbatch.__arrow_c_device_array__(requested_schema=None, future_option=None)


def test_pip_pyarrow_refuses_simulated_device_arrays(ctx: cuda.Context, sim_only: None) -> None:
    batch = make_batch(3)
    dbatch = cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema)
    schema_capsule, array_capsule = dbatch.__arrow_c_device_array__()
    with pytest.raises((pa.ArrowException, ValueError, NotImplementedError)):
        pa.RecordBatch._import_from_c_device_capsule(schema_capsule, array_capsule)
