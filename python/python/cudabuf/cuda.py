"""``cudabuf.cuda``: pyarrow.cuda's API, name for name and argument for argument.

A program written for ``pyarrow.cuda`` runs after changing ``from pyarrow import cuda``
to ``from cudabuf import cuda``. Where pyarrow has a quirk that cudabuf fixes on purpose
(clamped slices, silent partial copies, leaked IPC exports, ...), cudabuf's behaviour
applies and the docstring says so under "Fixed pyarrow quirk". ``from_numba`` /
``to_numba`` are replaced by the protocols every GPU library speaks:
``__cuda_array_interface__`` and DLPack.

Beyond pyarrow.cuda: streams and events (:class:`Stream`, :class:`Event`) with
asynchronous copies between device buffers and pinned host buffers
(:class:`Transfer`), stream-ordered allocation (``ctx.new_buffer(n, stream=s)``) and
interop with PyTorch's, CuPy's and cuda.core's streams (``__cuda_stream__``,
``Context.wrap_stream``).
"""

from __future__ import annotations

from cudabuf._native import (
    Buffer,
    BufferReader,
    BufferWriter,
    Context,
    CudaArrayView,
    CudaBuffer,
    DeviceRecordBatch,
    Event,
    HostBuffer,
    IpcMemHandle,
    Message,
    new_host_buffer,
    read_ipc_file,
    read_ipc_stream_file,
    read_message,
    read_parquet,
    read_record_batch,
    serialize_record_batch,
    Stream,
    Transfer,
    write_ipc_file,
)

__all__ = [
    "Context",
    "CudaBuffer",
    "CudaArrayView",
    "HostBuffer",
    "Buffer",
    "IpcMemHandle",
    "BufferReader",
    "BufferWriter",
    "Message",
    "DeviceRecordBatch",
    "Stream",
    "Event",
    "Transfer",
    "new_host_buffer",
    "serialize_record_batch",
    "read_message",
    "read_record_batch",
    "read_ipc_file",
    "read_ipc_stream_file",
    "read_parquet",
    "write_ipc_file",
]
