"""Device memory across libraries: __cuda_array_interface__ and DLPack.

On the simulator every export and foreign import raises SimulatedMemoryError (simulated
device memory is not memory a GPU library can reach). On CUDA the protocols are checked
against cudabuf itself and, when installed, PyTorch, CuPy and JAX (skipped with a reason
when absent; failing instead under CUDABUF_REQUIRE_CUDA=1).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

import cudabuf
from cudabuf import cuda


class CaiObject:
    """A bare foreign object exporting someone's device memory by CAI."""

    def __init__(self, interface: dict[str, Any], owner: object) -> None:
        self.__cuda_array_interface__ = interface
        self.owner = owner


class DlpackObject:
    """A bare foreign object exporting device memory by DLPack only."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.producer.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.producer.__dlpack_device__()


def test_simulated_memory_is_not_exported(ctx: cuda.Context, sim_only: None) -> None:
    buf = ctx.buffer_from_data(b"12345678")
    with pytest.raises(cudabuf.SimulatedMemoryError, match="simulator"):
        buf.__cuda_array_interface__
    with pytest.raises(BufferError):
        buf.__dlpack__()
    assert buf.__dlpack_device__() == (12, 0)
    view = buf.view("int32")
    with pytest.raises(cudabuf.SimulatedMemoryError):
        view.__cuda_array_interface__
    with pytest.raises(cudabuf.SimulatedMemoryError):
        view.__dlpack__(max_version=(1, 0))


def test_foreign_objects_are_refused_on_the_simulator(ctx: cuda.Context, sim_only: None) -> None:
    fake = CaiObject({"shape": (4,), "typestr": "|u1", "data": (0x7F0000001000, False), "version": 3}, None)
    with pytest.raises(cudabuf.SimulatedMemoryError):
        ctx.buffer_from_object(fake)
    with pytest.raises(cudabuf.SimulatedMemoryError):
        cuda.CudaBuffer.from_buffer(fake)
    with pytest.raises(cudabuf.SimulatedMemoryError):
        ctx.buffer_from_object(DlpackObject(ctx.new_buffer(4)))


def test_typed_views(ctx: cuda.Context) -> None:
    buf = ctx.new_buffer(24)
    view = buf.view("float32")
    assert view.shape == (6,) and view.typestr == "<f4" and view.nbytes == 24
    assert view.buffer.address == buf.address
    assert buf.view("<i8", (3,)).shape == (3,)
    assert buf.view(np.dtype(np.int16), [3, 4]).shape == (3, 4)
    assert buf.view(np.uint8).typestr == "|u1"
    assert buf.view("bool").typestr == "|b1"
    assert ctx.buffer_from_object(view).address == buf.address
    for dtype, shape in [("float32", [5]), ("float64", [2]), ("float32", [-6]), ("complex128", None)]:
        with pytest.raises(cudabuf.InvalidArgumentError):
            buf.view(dtype, shape)
    with pytest.raises(cudabuf.InvalidArgumentError, match="unsupported dtype"):
        buf.view(">f4")
    with pytest.raises(cudabuf.InvalidArgumentError, match="unsupported dtype"):
        buf.view("object")
    with pytest.raises(cudabuf.InvalidArgumentError, match="aligned"):
        buf.slice(1, 8).view("int32")
    assert "CudaArrayView" in repr(view)


# ---- CUDA backend: the protocols against cudabuf itself -----------------------------


def test_cuda_array_interface_export(ctx: cuda.Context, cuda_only: None) -> None:
    buf = ctx.buffer_from_data(bytes(range(32)))
    cai = buf.__cuda_array_interface__
    assert cai["version"] == 3 and cai["shape"] == (32,) and cai["typestr"] == "|u1"
    assert cai["data"] == (buf.address, False) and cai["strides"] is None and cai["stream"] is None
    typed = buf.view("float64", (2, 2)).__cuda_array_interface__
    assert typed["shape"] == (2, 2) and typed["typestr"] == "<f8"
    assert buf.__dlpack_device__() == (2, 0)


def test_cuda_array_interface_import(ctx: cuda.Context, cuda_only: None) -> None:
    buf = ctx.buffer_from_data(bytes(range(64)))
    owner = buf.slice(16, 32)
    fake = CaiObject({"shape": (4, 2), "typestr": "<i4", "data": (owner.address, False), "version": 3, "strides": None}, owner)
    view = ctx.buffer_from_object(fake)
    assert view.address == owner.address and view.size == 32
    assert view.to_pybytes() == bytes(range(16, 48))
    view.copy_from_host(b"\xee" * 4)
    assert buf.to_pybytes()[16:20] == b"\xee" * 4
    assert cuda.CudaBuffer.from_buffer(fake).to_pybytes()[:4] == b"\xee" * 4
    reversed_rows = CaiObject({"shape": (2,), "typestr": "<i8", "data": (owner.address + 8, False), "strides": (-8,), "version": 3}, owner)
    assert ctx.buffer_from_object(reversed_rows).address == owner.address
    empty = CaiObject({"shape": (0,), "typestr": "<f4", "data": (0, False), "version": 3}, None)
    assert ctx.buffer_from_object(empty).size == 0
    past_end = CaiObject({"shape": (1000,), "typestr": "|u1", "data": (buf.address, False), "version": 3}, buf)
    with pytest.raises(cudabuf.InvalidAddressError):
        ctx.buffer_from_object(past_end)


def test_dlpack_round_trip_through_cudabuf(ctx: cuda.Context, cuda_only: None) -> None:
    buf = ctx.buffer_from_data(bytes(range(16)))
    for kwargs in ({}, {"max_version": (1, 0)}):
        capsule = buf.__dlpack__(**kwargs)
        assert type(capsule).__name__ == "PyCapsule"
    view = ctx.buffer_from_object(DlpackObject(buf))
    assert view.address == buf.address and view.to_pybytes() == bytes(range(16))
    copied = ctx.buffer_from_object(DlpackObject(_Copying(buf)))
    assert copied.address != buf.address and copied.to_pybytes() == bytes(range(16))
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(2, 99))


class _Copying:
    def __init__(self, buf: cuda.CudaBuffer) -> None:
        self.buf = buf

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.buf.__dlpack__(copy=True, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.buf.__dlpack_device__()


# ---- GPU peer libraries -----------------------------------------------------------


def test_torch_round_trip(ctx: cuda.Context, torch: ModuleType) -> None:
    t = torch.arange(64, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    view = ctx.buffer_from_object(t)  # CAI import, zero-copy
    assert view.address == t.data_ptr() and view.to_pybytes() == bytes(range(64))
    view.copy_from_host(b"\xff" * 8)  # write through cudabuf, read through torch
    assert t[:8].cpu().tolist() == [255] * 8
    buf = ctx.buffer_from_data(np.arange(16, dtype=np.float32))
    t2 = torch.from_dlpack(buf.view("float32"))  # DLPack export, zero-copy
    assert t2.data_ptr() == buf.address and t2.dtype == torch.float32
    assert t2.cpu().tolist() == list(range(16))
    t2.mul_(2)  # write through torch, read through cudabuf
    torch.cuda.synchronize()
    assert np.frombuffer(buf.copy_to_host(), dtype=np.float32).tolist() == [2.0 * i for i in range(16)]
    t3 = torch.as_tensor(buf, device="cuda")  # CAI export
    assert t3.data_ptr() == buf.address and t3.numel() == 64
    imported = cuda.CudaBuffer.from_buffer(DlpackObject(t2))  # DLPack import
    assert imported.address == t2.data_ptr()


def test_cupy_round_trip(ctx: cuda.Context, cupy: ModuleType) -> None:
    a = cupy.arange(32, dtype=cupy.int32)
    view = ctx.buffer_from_object(a)
    assert view.address == a.data.ptr and view.size == 128
    view.copy_from_host(np.full(4, -1, dtype=np.int32))
    assert a[:4].get().tolist() == [-1] * 4
    buf = ctx.buffer_from_data(np.arange(8, dtype=np.float64))
    b = cupy.asarray(buf.view("float64"))
    assert b.data.ptr == buf.address
    b += 1
    cupy.cuda.runtime.deviceSynchronize()
    assert np.frombuffer(buf.copy_to_host(), dtype=np.float64).tolist() == [i + 1.0 for i in range(8)]
    c = cupy.from_dlpack(buf.view("float64"))
    assert c.data.ptr == buf.address


def test_jax_round_trip(ctx: cuda.Context, jax: ModuleType) -> None:
    jnp = jax.numpy
    buf = ctx.buffer_from_data(np.arange(16, dtype=np.float32))
    x = jax.dlpack.from_dlpack(buf.view("float32"))
    assert x.unsafe_buffer_pointer() == buf.address  # zero-copy
    assert jnp.sum(x).item() == sum(range(16))
    buf.copy_from_host(np.full(16, 7, dtype=np.float32))  # write through cudabuf
    # A new device computation reads the memory again (np.asarray(x) would return the
    # host copy JAX cached on the first transfer).
    assert float(x[0] + 0) == 7.0  # JAX sees the same memory
    y = jnp.arange(8, dtype=jnp.int32) * 3
    y.block_until_ready()
    view = ctx.buffer_from_object(DlpackObject(y))
    assert np.frombuffer(view.copy_to_host(), dtype=np.int32).tolist() == [3 * i for i in range(8)]
