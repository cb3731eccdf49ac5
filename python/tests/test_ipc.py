"""IPC handles: serialization, opening in this process, and in a child Python process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda

CHILD = textwrap.dedent(
    """
    import sys
    import cudabuf
    from cudabuf import cuda

    handle = cuda.IpcMemHandle.from_buffer(bytes.fromhex(sys.argv[1]))
    buf = cuda.Context(0).open_ipc_buffer(handle)
    buf.context.synchronize()
    sys.stdout.write(buf.to_pybytes().hex() + "\\n")
    sys.stdout.flush()
    if len(sys.argv) > 2:
        buf.copy_from_host(bytes.fromhex(sys.argv[2]))
    """
)


def run_child(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        env=dict(os.environ, CUDABUF_BACKEND=cudabuf.get_backend()),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("size", [0, 1, 1000])
def test_ipc_to_a_child_process(ctx: cuda.Context, size: int) -> None:
    arr = np.random.default_rng(size).integers(0, 256, size=size, dtype=np.uint8)
    cbuf = ctx.buffer_from_data(arr)
    handle_buffer = cbuf.export_for_ipc().serialize()
    assert isinstance(handle_buffer, cuda.Buffer)
    assert run_child(handle_buffer.to_pybytes().hex()) == arr.tobytes().hex()


def test_child_writes_back(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"\x00" * 16)
    handle = cbuf.export_for_ipc()
    run_child(handle.serialize().to_pybytes().hex(), (b"from the child!!").hex())
    assert cbuf.to_pybytes() == b"from the child!!"


def test_exported_slice_opens_exactly_the_slice(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"0123456789")
    handle = cbuf.slice(3, 4).export_for_ipc()
    assert handle.size == 4 and handle.offset == 3
    assert run_child(handle.serialize().to_pybytes().hex()) == b"3456".hex()


def test_handles_round_trip_in_process(ctx: cuda.Context) -> None:
    cbuf = ctx.buffer_from_data(b"shared bytes")
    handle = cbuf.export_for_ipc()
    data = handle.serialize()
    again = cuda.IpcMemHandle.from_buffer(data)
    assert again == handle
    assert cuda.IpcMemHandle.from_buffer(pa.py_buffer(data.to_pybytes())) == handle
    opened = ctx.open_ipc_buffer(again)  # in the exporting process: a view (fixed quirk)
    assert opened.to_pybytes() == b"shared bytes"
    assert ctx.open_ipc_buffer(again).address == opened.address
    assert "IpcMemHandle" in repr(handle)


def test_zero_size_handle_is_pyarrows_eight_bytes(ctx: cuda.Context) -> None:
    handle = ctx.new_buffer(0).export_for_ipc()
    assert handle.serialize().to_pybytes() == b"\x00" * 8
    assert ctx.open_ipc_buffer(cuda.IpcMemHandle.from_buffer(b"\x00" * 8)).size == 0


def test_corrupt_handles_raise(ctx: cuda.Context) -> None:
    data = bytearray(ctx.buffer_from_data(b"x" * 32).export_for_ipc().serialize().to_pybytes())
    for bad in (bytes(data[:20]), bytes(data) + b"\x00", b"", bytes(data[:-1]) + bytes([data[-1] ^ 1])):
        with pytest.raises(cudabuf.InvalidIpcHandleError):
            cuda.IpcMemHandle.from_buffer(bad)
    with pytest.raises(TypeError):
        cuda.IpcMemHandle.from_buffer("not bytes")


def test_pyarrow_format(ctx: cuda.Context, on_cuda: bool) -> None:
    cbuf = ctx.buffer_from_data(b"y" * 64)
    if on_cuda:
        raw = cbuf.export_for_ipc().to_pyarrow_bytes()
        assert len(raw) == 72 and int.from_bytes(raw[:8], "little") == 64
        with pytest.raises(cudabuf.UnsupportedError, match="offset"):
            cbuf.slice(8, 8).export_for_ipc().to_pyarrow_bytes()
    else:
        with pytest.raises(cudabuf.UnsupportedError):
            cbuf.export_for_ipc().to_pyarrow_bytes()


def test_views_of_host_memory_cannot_be_exported(ctx: cuda.Context) -> None:
    view = ctx.buffer_from_object(cuda.new_host_buffer(16))
    with pytest.raises(cudabuf.UnsupportedError):
        view.export_for_ipc()
