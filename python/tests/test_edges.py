"""Rough edges a pyarrow.cuda user meets: malformed Arrow capsules and foreign objects,
protocol probing on the simulator, readers and writers shared between threads, whole-buffer
conversions, dtype spellings, argument conventions and the backend switch."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, List

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda


def small_batch() -> pa.RecordBatch:
    return pa.record_batch([pa.array([1, 2, 3]), pa.array(["a", None, "c"])], names=["x", "y"])


# A PyCapsule that is no Arrow capsule (the datetime C API).
FOREIGN_CAPSULE = datetime.datetime_CAPI  # type: ignore[attr-defined]


class ArrayProducer:
    """`__arrow_c_array__` returning whatever it is given (the same objects every call)."""

    def __init__(self, result: object) -> None:
        self.result = result

    def __arrow_c_array__(self, requested_schema: object = None) -> object:
        return self.result


class StreamProducer:
    """`__arrow_c_stream__` returning whatever it is given (the same object every call)."""

    def __init__(self, result: object) -> None:
        self.result = result

    def __arrow_c_stream__(self, requested_schema: object = None) -> object:
        return self.result


class SchemaProducer:
    """`__arrow_c_schema__` returning whatever it is given (the same object every call)."""

    def __init__(self, result: object) -> None:
        self.result = result

    def __arrow_c_schema__(self) -> object:
        return self.result


def consumed_schema_capsule() -> object:
    capsule = small_batch().schema.__arrow_c_schema__()
    pa.Schema._import_from_c_capsule(capsule)  # moves the schema out: released
    return capsule


PLAIN_OBJECTS: List[object] = [None, 0, 7, "text", b"bytes", object(), [1, 2], FOREIGN_CAPSULE]


def assert_cudabuf_error(call: Callable[[], object]) -> cudabuf.CudaError:
    """`call` raises a cudabuf error (never PanicException, a BaseException that
    `pytest.raises(CudaError)` would let through and fail on)."""
    with pytest.raises(cudabuf.CudaError) as info:
        call()
    return info.value


def test_a_reused_array_capsule_raises_instead_of_panicking(ctx: cuda.Context) -> None:
    batch = small_batch()
    producer = ArrayProducer(batch.__arrow_c_array__())
    first = cuda.serialize_record_batch(producer, ctx)  # consumes the array capsule
    assert cuda.read_record_batch(first, batch.schema).to_host().equals(batch)
    err = assert_cudabuf_error(lambda: cuda.serialize_record_batch(producer, ctx))
    assert isinstance(err, cudabuf.InvalidArgumentError)
    assert "already consumed or released" in str(err) and "arrow_array" in str(err)
    # A fresh capsule still works.
    assert cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema).to_host().equals(batch)


def test_a_reused_stream_capsule_raises(ctx: cuda.Context) -> None:
    batch = small_batch()
    producer = StreamProducer(pa.Table.from_batches([batch]).__arrow_c_stream__())
    cuda.serialize_record_batch(producer, ctx)
    err = assert_cudabuf_error(lambda: cuda.serialize_record_batch(producer, ctx))
    assert isinstance(err, cudabuf.InvalidArgumentError) and "arrow_array_stream" in str(err)


@pytest.mark.parametrize(
    "make",
    [
        lambda b: (b.schema.__arrow_c_schema__(), FOREIGN_CAPSULE),  # wrong array capsule name
        lambda b: (FOREIGN_CAPSULE, b.__arrow_c_array__()[1]),  # wrong schema capsule name
        lambda b: tuple(reversed(b.__arrow_c_array__())),  # swapped
        lambda b: (consumed_schema_capsule(), b.__arrow_c_array__()[1]),  # released schema
        lambda b: None,
        lambda b: 3,
        lambda b: (1, 2),
        lambda b: (b.schema.__arrow_c_schema__(),),
        lambda b: b.__arrow_c_array__() + (None,),
        lambda b: object(),
    ],
)
def test_malformed_array_producers_raise_cudabuf_errors(ctx: cuda.Context, make: Callable[[Any], object]) -> None:
    assert_cudabuf_error(lambda: cuda.serialize_record_batch(ArrayProducer(make(small_batch())), ctx))


@pytest.mark.parametrize("result", [None, 1, object(), FOREIGN_CAPSULE, "arrow_array_stream"])
def test_malformed_stream_producers_raise_cudabuf_errors(ctx: cuda.Context, result: object) -> None:
    assert_cudabuf_error(lambda: cuda.serialize_record_batch(StreamProducer(result), ctx))


@pytest.mark.parametrize("obj", PLAIN_OBJECTS)
def test_plain_objects_raise_cudabuf_type_errors(ctx: cuda.Context, obj: object) -> None:
    cbuf = cuda.serialize_record_batch(small_batch(), ctx)
    schema = small_batch().schema
    calls: List[Callable[[], object]] = [
        lambda: cuda.serialize_record_batch(obj, ctx),
        lambda: cuda.read_record_batch(cbuf, obj),
        lambda: cuda.read_record_batch(obj, schema),
        lambda: cuda.read_message(obj),
        lambda: ctx.buffer_from_object(obj),
        lambda: cuda.CudaBuffer.from_buffer(obj),
    ]
    for call in calls:
        err = assert_cudabuf_error(call)
        # Still what Python code expects of a wrong type (or a bad value).
        assert isinstance(err, (TypeError, ValueError)), repr(err)


@pytest.mark.parametrize(
    "capsule",
    [lambda: consumed_schema_capsule(), lambda: FOREIGN_CAPSULE, lambda: small_batch().__arrow_c_array__()[1], lambda: None, lambda: 5],
)
def test_malformed_schema_capsules_raise_cudabuf_errors(ctx: cuda.Context, capsule: Callable[[], object]) -> None:
    cbuf = cuda.serialize_record_batch(small_batch(), ctx)
    err = assert_cudabuf_error(lambda: cuda.read_record_batch(cbuf, SchemaProducer(capsule())))
    assert isinstance(err, (cudabuf.InvalidArgumentError, cudabuf.InvalidDataError))


def test_wrong_capsule_names_are_named(ctx: cuda.Context) -> None:
    batch = small_batch()
    err = assert_cudabuf_error(
        lambda: cuda.serialize_record_batch(ArrayProducer((batch.schema.__arrow_c_schema__(), FOREIGN_CAPSULE)), ctx)
    )
    assert isinstance(err, cudabuf.InvalidTypeError) and isinstance(err, TypeError)
    assert "arrow_array" in str(err) and "datetime.datetime_CAPI" in str(err)


@pytest.mark.parametrize(
    "obj",
    [
        type("BadInterface", (), {"__cuda_array_interface__": 5})(),
        type("BadInterface2", (), {"__cuda_array_interface__": {"shape": "x", "data": None}})(),
        type("BadDlpack", (), {"__dlpack__": lambda self, **kw: 5, "__dlpack_device__": lambda self: (2, 0)})(),
        type("UsedDlpack", (), {"__dlpack__": lambda self, **kw: FOREIGN_CAPSULE, "__dlpack_device__": lambda self: (2, 0)})(),
    ],
)
def test_malformed_foreign_objects_raise_cudabuf_errors(ctx: cuda.Context, obj: object) -> None:
    assert_cudabuf_error(lambda: ctx.buffer_from_object(obj))
    assert_cudabuf_error(lambda: cuda.CudaBuffer.from_buffer(obj))


def test_protocol_attributes_are_absent_on_the_simulator(ctx: cuda.Context, sim_only: None) -> None:
    buf = ctx.new_buffer(16)
    view = buf.view("float32")
    for obj in (buf, view):
        assert not hasattr(obj, "__cuda_array_interface__")
        assert getattr(obj, "__cuda_array_interface__", None) is None
        with pytest.raises(cudabuf.SimulatedMemoryAttributeError) as info:
            obj.__cuda_array_interface__
        assert isinstance(info.value, cudabuf.SimulatedMemoryError)
        assert isinstance(info.value, AttributeError) and "simulator" in str(info.value)
        # DLPack is a method: present, and calling it raises the typed error, a
        # BufferError as the DLPack protocol asks of a producer that cannot export.
        assert hasattr(obj, "__dlpack__")
        assert obj.__dlpack_device__() == (12, 0)
        with pytest.raises(cudabuf.SimulatedMemoryError) as raised:
            obj.__dlpack__()
        assert isinstance(raised.value, BufferError)
        assert not isinstance(raised.value, AttributeError)


def test_a_reader_shared_between_threads(ctx: cuda.Context) -> None:
    chunk, count = 256 << 10, 48
    data = np.repeat(np.arange(count, dtype=np.uint8), chunk)  # chunk i holds byte i
    reader = cuda.BufferReader(ctx.buffer_from_data(data))
    got: List[bytes] = []
    errors: List[BaseException] = []

    def work() -> None:
        try:
            while True:
                reader.tell()
                piece = reader.read(chunk)
                if not piece:
                    return
                got.append(piece)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # Every read was whole and none overlapped: each chunk came back exactly once.
    assert sorted(got) == [bytes([i]) * chunk for i in range(count)]
    assert reader.tell() == data.size


def test_a_writer_shared_between_threads(ctx: cuda.Context) -> None:
    chunk, count = 1 << 20, 32
    dbuf = ctx.new_buffer(chunk * count)
    writer = cuda.BufferWriter(dbuf)
    writer.buffer_size = 64 << 10
    errors: List[BaseException] = []

    def work(first: int) -> None:
        try:
            for i in range(first, count, 4):
                writer.writeat(i * chunk, bytes([i]) * chunk)
                writer.tell()
                writer.num_bytes_buffered
                writer.seek(0)
                writer.write(b"")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.close()
    assert errors == []
    assert dbuf.to_pybytes() == b"".join(bytes([i]) * chunk for i in range(count))


@pytest.mark.parametrize("size", [0, 1, 1 << 20])
def test_bytes_and_iteration_copy_once(ctx: cuda.Context, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    cbuf = ctx.buffer_from_data(data)
    start = time.perf_counter()
    as_bytes = bytes(cbuf)
    as_list = list(cbuf)
    elapsed = time.perf_counter() - start
    assert as_bytes == cbuf.to_pybytes() == data.tobytes()
    assert as_list == data.tolist()
    assert elapsed < 0.2, f"bytes() and list() of {size} bytes took {elapsed:.3f} s"
    # A slice converts its own bytes only.
    if size > 10:
        assert bytes(cbuf[3:10]) == data[3:10].tobytes() and list(cbuf[3:5]) == data[3:5].tolist()


NATIVE_DTYPES = [
    "f4", "<f4", "=f4", "float32", "float", "f", "d", "double", "single", "half", "e", "f2",
    "u1", "|u1", ">u1", "B", "uint8", "ubyte", "i1", "b", "byte", "int8",
    "?", "bool", "b1",
    "h", "i2", "short", "H", "u2", "i", "i4", "intc", "I", "u4",
    "int", "i8", "q", "l", "int64", "longlong", "Q", "u8", "uint64",
    "F", "c8", "complex64", "D", "c16", "complex", "complex128",
]


@pytest.mark.parametrize("spec", NATIVE_DTYPES)
def test_view_accepts_what_numpy_accepts(ctx: cuda.Context, spec: str) -> None:
    expected = np.dtype(spec)
    cbuf = ctx.new_buffer(64)
    view = cbuf.view(spec)
    assert view.typestr == expected.str
    assert view.shape == (64 // expected.itemsize,)


@pytest.mark.parametrize("spec", [">f4", ">i8", "U4", "S3", "O", "M8", "f16", "float128", "nonsense"])
def test_view_refuses_other_types(ctx: cuda.Context, spec: str) -> None:
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(64).view(spec)


def test_view_needs_no_numpy_for_type_strings() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import cudabuf; from cudabuf import cuda\n"
        "b = cuda.Context(0).new_buffer(8)\n"
        "print(b.view('f4').typestr, b.view('u1').typestr, b.view('float').typestr, b.view('?').typestr)\n"
    )
    env = dict(os.environ, CUDABUF_BACKEND="sim")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["<f4", "|u1", "<f8", "|b1"]


def test_set_backend_names_the_argument_not_the_environment() -> None:
    with pytest.raises(cudabuf.InvalidArgumentError) as info:
        cudabuf.set_backend("gpu")
    message = str(info.value)
    assert "set_backend" in message and '"gpu"' in message and '"sim" or "cuda"' in message
    assert "CUDABUF_BACKEND" not in message


def test_get_backend_needs_no_driver() -> None:
    code = "import cudabuf; print(cudabuf.get_backend())"
    env = dict(os.environ, CUDABUF_BACKEND="cuda", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cuda"


def test_tell_on_a_closed_reader_or_writer_raises(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"0123456789")
    reader = cuda.BufferReader(cbuf)
    reader.read(4)
    assert reader.tell() == 4
    reader.close()
    with pytest.raises(cudabuf.ClosedError, match="BufferReader is closed"):
        reader.tell()
    writer = cuda.BufferWriter(cbuf)
    writer.write(b"ab")
    writer.close()
    with pytest.raises(cudabuf.ClosedError, match="BufferWriter is closed"):
        writer.tell()
    # Like Python's files.
    import io

    f = io.BytesIO(b"x")
    f.close()
    with pytest.raises(ValueError):
        f.tell()


def test_only_minus_one_means_the_default(ctx: cuda.Context, tmp_path: Any) -> None:
    cbuf = ctx.buffer_from_data(b"0123456789")
    assert cbuf.copy_to_host(nbytes=-1).to_pybytes() == b"0123456789"
    path = tmp_path / "f.bin"
    path.write_bytes(b"abcdef")
    calls: List[Callable[[], object]] = [
        lambda: cbuf.copy_to_host(nbytes=-5),
        lambda: cbuf.copy_to_host(nbytes=-2, buf=bytearray(10)),
        lambda: cbuf.copy_from_host(b"xy", nbytes=-2),
        lambda: cbuf.copy_from_device(ctx.new_buffer(2), nbytes=-7),
        lambda: ctx.buffer_from_data(b"abc", size=-3),
        lambda: ctx.buffer_from_data(cbuf, size=-2),
        lambda: ctx.read_file(str(path), size=-2),
    ]
    for call in calls:
        with pytest.raises(cudabuf.InvalidArgumentError, match="only -1"):
            call()
    assert cbuf.to_pybytes() == b"0123456789"  # nothing was written
    assert ctx.buffer_from_data(b"abc", size=-1).to_pybytes() == b"abc"
    assert ctx.read_file(str(path), offset=2, size=-1).to_pybytes() == b"cdef"
    assert cbuf.copy_from_host(b"xy", nbytes=-1) == 2


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def with_device(handle_bytes: bytes, device: int) -> bytes:
    """The handle's bytes naming another device, checksum redone (a forged handle)."""
    data = bytearray(handle_bytes)
    assert len(data) == 128
    data[84:88] = device.to_bytes(4, "little")
    data[120:128] = fnv1a(bytes(data[:120])).to_bytes(8, "little")
    return bytes(data)


def test_a_handle_naming_another_device_is_refused(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"device zero's bytes")
    raw = cbuf.export_for_ipc().serialize().to_pybytes()
    for device in (1, 7):
        forged = cuda.IpcMemHandle.from_buffer(with_device(raw, device))
        with pytest.raises(cudabuf.InvalidIpcHandleError, match=f"device {device}"):
            ctx.open_ipc_buffer(forged)
    assert ctx.open_ipc_buffer(cuda.IpcMemHandle.from_buffer(raw)).to_pybytes() == b"device zero's bytes"
