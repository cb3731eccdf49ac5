"""The CudaError hierarchy and the backend switch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import cudabuf
from cudabuf import cuda


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (cudabuf.OutOfRangeError, IndexError),
        (cudabuf.OutOfRangeError, ValueError),
        (cudabuf.SourceTooShortError, ValueError),
        (cudabuf.OutOfMemoryError, MemoryError),
        (cudabuf.InvalidDeviceError, ValueError),
        (cudabuf.InvalidAddressError, ValueError),
        (cudabuf.InvalidArgumentError, ValueError),
        (cudabuf.InvalidIpcHandleError, ValueError),
        (cudabuf.UnsupportedError, NotImplementedError),
        (cudabuf.SimulatedMemoryError, BufferError),
        (cudabuf.SimulatedMemoryError, cudabuf.UnsupportedError),
        (cudabuf.SimulatedMemoryAttributeError, cudabuf.SimulatedMemoryError),
        (cudabuf.SimulatedMemoryAttributeError, AttributeError),
        (cudabuf.InvalidTypeError, cudabuf.InvalidArgumentError),
        (cudabuf.InvalidTypeError, TypeError),
        (cudabuf.InvalidDataError, ValueError),
        (cudabuf.ClosedError, ValueError),
        (cudabuf.NoDriverError, RuntimeError),
        (cudabuf.DriverError, RuntimeError),
    ],
)
def test_hierarchy(cls: type, builtin: type) -> None:
    assert issubclass(cls, cudabuf.CudaError)
    assert issubclass(cls, builtin)


def test_errors_carry_kind_and_message(ctx: cuda.Context) -> None:
    buf = ctx.new_buffer(4)
    with pytest.raises(cudabuf.CudaError) as info:
        buf.copy_to_host(position=2, nbytes=5)
    err = info.value
    assert type(err) is cudabuf.OutOfRangeError
    assert err.kind == "OutOfRange" and err.cuda_name is None and err.cuda_code is None
    assert "copy_to_host" in str(err) and "5 bytes at position 2" in str(err)


def test_set_backend(ctx: cuda.Context) -> None:
    current = cudabuf.get_backend()
    with pytest.raises(cudabuf.InvalidArgumentError, match="expected"):
        cudabuf.set_backend("gpu")
    assert cudabuf.get_backend() == current
    try:
        cudabuf.set_backend("cuda")
    except cudabuf.NoDriverError as e:
        # No GPU here: the switch is refused with the driver's reason, nothing changes.
        assert e.kind == "NoDriver" and cudabuf.get_backend() == current
    else:
        assert cudabuf.get_backend() == "cuda"
        assert cuda.Context(0).backend == "cuda"
    cudabuf.set_backend("sim")
    sim_ctx = cuda.Context(0)
    assert sim_ctx.backend == "sim" and cudabuf.get_backend() == "sim"
    buf = sim_ctx.new_buffer(8)
    cudabuf.set_backend("sim")  # the same simulator instance: same context, same counter
    assert cuda.Context(0) == sim_ctx and cuda.Context(0).bytes_allocated >= 8
    del buf
    cudabuf.set_backend(current)
    assert cudabuf.get_backend() == current
    assert ctx.new_buffer(1).context == ctx  # objects keep their backend


def test_backend_from_the_environment() -> None:
    code = "import cudabuf; print(cudabuf.get_backend())"
    env = dict(os.environ, CUDABUF_BACKEND="sim")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "sim"
    env["CUDABUF_BACKEND"] = "tpu"
    bad = subprocess.run(
        [sys.executable, "-c", "import cudabuf\nfrom cudabuf import cuda\ncuda.Context(0)"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "InvalidArgumentError" in bad.stderr and "tpu" in bad.stderr


def test_a_buffer_export_may_use_the_writer_it_is_written_to(ctx: cuda.Context) -> None:
    """The data's buffer export runs before the writer is taken: using the writer from it
    works (calls from other threads wait; see test_edges.py), nothing raises or races."""
    dbuf = ctx.new_buffer(8)
    writer = cuda.BufferWriter(dbuf)
    seen: list[int] = []

    class Reentrant:
        """A buffer-protocol object whose export re-enters the writer."""

        def __buffer__(self, flags: int) -> memoryview:
            seen.append(writer.tell())
            return memoryview(b"ab")

    if sys.version_info < (3, 12):
        pytest.skip("__buffer__ in Python classes needs Python 3.12")
    assert writer.write(Reentrant()) == 2
    assert seen == [0] and writer.tell() == 2
    assert dbuf.to_pybytes()[:2] == b"ab"
