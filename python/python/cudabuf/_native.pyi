"""Type stubs of the extension module behind ``cudabuf.cuda`` (see its docstrings)."""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
import os
from typing import Any, Literal, Optional, Protocol, SupportsIndex, TypedDict, Union, final, overload

from typing_extensions import Buffer as _BufferProtocol
from typing_extensions import Self, disjoint_base

class _HasFileno(Protocol):
    def fileno(self) -> int: ...

_FileArg = Union[str, "os.PathLike[str]", _HasFileno, int]

class _FileOptions(TypedDict):
    """How a context's file reads and writes run."""

    chunk_size: int
    threads: int
    direct_io: Literal["never", "if_supported", "required"]

__all__ = [
    "Buffer",
    "BufferReader",
    "BufferWriter",
    "Context",
    "CudaArrayView",
    "CudaBuffer",
    "DeviceRecordBatch",
    "Event",
    "FLIGHT_DEFAULT_MAX_MESSAGE_SIZE",
    "HostBuffer",
    "IpcMemHandle",
    "Message",
    "Simulator",
    "Stream",
    "Transfer",
    "_FlightClient",
    "_FlightServer",
    "_HostMemory",
    "_ReaderHostFile",
    "get_backend",
    "new_host_buffer",
    "read_ipc_file",
    "read_ipc_stream_file",
    "read_message",
    "read_parquet",
    "read_record_batch",
    "serialize_record_batch",
    "set_backend",
    "write_ipc_file",
]

def set_backend(name: str) -> None:
    """Use backend ``name`` ("sim" or "cuda") for every context and host buffer made from now on."""

def get_backend() -> str:
    """The name of the current backend: "sim" or "cuda" (needs no CUDA driver)."""

@disjoint_base
class _HostMemory:
    """Methods of ``Buffer`` and ``HostBuffer`` (not instantiable)."""

    def __new__(cls, *args: Any, **_kwargs: Any) -> Self: ...
    @property
    def size(self) -> int:
        """The size in bytes."""
    @property
    def address(self) -> int:
        """The host address of the first byte."""
    @property
    def is_cpu(self) -> bool:
        """Always ``True``."""
    @property
    def is_mutable(self) -> bool:
        """Always ``True``."""
    @property
    def parent(self) -> Optional[Buffer]:
        """The buffer this one was sliced from, or ``None``."""
    def __len__(self) -> int: ...
    def to_pybytes(self) -> bytes:
        """The bytes as a new ``bytes`` object (a copy)."""
    def __bytes__(self) -> bytes:
        """``bytes(buf)``: as ``to_pybytes`` (a read, where a buffer-protocol view is writable)."""
    def slice(self, offset: int = 0, length: Optional[int] = None) -> Buffer:
        """A zero-copy slice; out of range raises ``OutOfRangeError`` (no clamping)."""
    @overload
    def __getitem__(self, key: SupportsIndex, /) -> int: ...
    @overload
    def __getitem__(self, key: builtins.slice, /) -> Buffer: ...
    def equals(self, other: _BufferProtocol) -> bool:
        """Whether ``other`` holds the same bytes."""
    def __eq__(self, other: object, /) -> bool: ...
    def to_pyarrow(self) -> Any:
        """This memory as a ``pyarrow.Buffer``, zero-copy; it keeps this memory alive."""

class Buffer(_HostMemory, _BufferProtocol):
    """Host memory owned by cudabuf; speaks the buffer protocol (zero-copy NumPy/pyarrow views)."""

class HostBuffer(Buffer):
    """Pinned, device-mapped host memory from ``new_host_buffer``."""

def new_host_buffer(size: int, device: int = 0) -> HostBuffer:
    """Allocate a pinned host buffer of ``size`` bytes through device ``device``, zero-filled."""

@final
class Stream:
    """A CUDA stream: work issued to it runs in order, asynchronously from Python."""

    def __new__(cls, ctx: Optional[Context] = None, non_blocking: bool = False, priority: int = 0) -> Self: ...
    @property
    def context(self) -> Context:
        """The context the stream belongs to."""
    @property
    def handle(self) -> int:
        """The ``CUstream`` as an integer (an id of the simulator's own on the simulator)."""
    @property
    def ptr(self) -> int:
        """The same as ``handle``."""
    @property
    def non_blocking(self) -> bool:
        """Whether the stream is not ordered with the legacy default stream."""
    @property
    def priority(self) -> int:
        """The stream's priority (lower numbers run first)."""
    @property
    def kind(self) -> Literal["owned", "legacy default", "per-thread default", "foreign"]:
        """What the stream is."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def __cuda_stream__(self, stream: Optional[object] = None) -> tuple[int, int]:
        """The CUDA stream protocol: ``(0, handle)`` (raises on the simulator)."""
    def synchronize(self) -> None:
        """Block until all work issued so far is done; earlier transfers' host buffers come back."""
    def query(self) -> bool:
        """Whether all work issued so far is done."""
    def record_event(self, event: Optional[Event] = None) -> Event:
        """Record ``event`` (a new one if ``None``) on this stream now; returns it."""
    def record(self, event: Optional[Event] = None) -> Event:
        """The same as ``record_event``."""
    def wait_event(self, event: Event) -> None:
        """Make later work of this stream wait for ``event``."""
    def wait_stream(self, stream: Stream) -> None:
        """Make later work of this stream wait for the work issued to ``stream`` so far."""
    def copy_from_host(self, dst: CudaBuffer, src: _BufferProtocol) -> Transfer:
        """Copy all of ``src`` into the start of ``dst``, asynchronously (pinned ``src`` is lent to the transfer)."""
    def copy_to_host(self, src: CudaBuffer, dst: Buffer) -> Transfer:
        """Copy all of ``src`` into the start of pinned ``dst``, asynchronously (``dst`` is lent to the transfer)."""
    def copy_device(self, dst: CudaBuffer, src: CudaBuffer) -> None:
        """Copy all of ``src`` into the start of ``dst``, asynchronously."""
    def close(self) -> None:
        """Let the stream go (after waiting for the copies it tracks)."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> bool: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class Event:
    """A CUDA event: a point in a stream that the host and other streams can wait for."""

    def __new__(cls, ctx: Optional[Context] = None, timing: bool = False) -> Self: ...
    @property
    def context(self) -> Context:
        """The context the event belongs to."""
    @property
    def handle(self) -> int:
        """The ``CUevent`` as an integer (an id of the simulator's own on the simulator)."""
    @property
    def ptr(self) -> int:
        """The same as ``handle``."""
    @property
    def timing(self) -> bool:
        """Whether the event measures time."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def record(self, stream: Optional[Stream] = None) -> None:
        """Capture the work issued to ``stream`` (default: the legacy default stream) so far."""
    def wait(self, stream: Optional[Stream] = None) -> None:
        """Make later work of ``stream`` (default: the legacy default stream) wait for this event."""
    def query(self) -> bool:
        """Whether the captured work is done (``True`` if never recorded)."""
    def synchronize(self) -> None:
        """Block until the captured work is done."""
    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both timing events, recorded and complete)."""
    def close(self) -> None:
        """Let the event go."""

@final
class Transfer:
    """An asynchronous copy in flight; the host bytes it touches are lent to it until it is known complete."""

    def wait(self) -> None:
        """Block until the copy is done and hand the host bytes back."""
    def query(self) -> bool:
        """Whether the copy is done (if so, the host bytes come back)."""
    @property
    def nbytes(self) -> int:
        """The number of bytes the copy moves."""

@final
class Context:
    """A CUDA context on one device (pyarrow.cuda's ``Context``)."""

    def __new__(cls, device_number: int = 0, handle: Optional[int] = None) -> Self: ...
    @staticmethod
    def get_num_devices() -> int:
        """The number of devices of the current backend."""
    @property
    def device_number(self) -> int:
        """The number of this context's device."""
    @property
    def handle(self) -> int:
        """The raw context handle."""
    @property
    def bytes_allocated(self) -> int:
        """Bytes currently allocated through this context."""
    @property
    def backend(self) -> str:
        """"sim" or "cuda"."""
    def synchronize(self) -> None:
        """Wait until all work on the device in this context is done."""
    def new_buffer(self, nbytes: int, stream: Optional[Stream] = None) -> CudaBuffer:
        """Allocate a device buffer of ``nbytes``; with ``stream``, stream-ordered (freed on ``stream``)."""
    def new_stream(self, non_blocking: bool = False, priority: int = 0) -> Stream:
        """A new stream of this context (blocking unless ``non_blocking``)."""
    def stream_priority_range(self) -> tuple[int, int]:
        """``(least, greatest)`` stream priority; numerically ``least >= greatest``."""
    def default_stream(self) -> Stream:
        """The legacy default stream, where the synchronous copies run."""
    def per_thread_stream(self) -> Stream:
        """The calling thread's default stream."""
    def wrap_stream(self, obj: object) -> Stream:
        """A ``Stream`` over another library's stream (``__cuda_stream__``, ``.cuda_stream``, ``.ptr`` or an int), kept alive."""
    def new_event(self, timing: bool = False) -> Event:
        """A new event of this context (with ``timing``, it measures time)."""
    def buffer_from_data(self, data: Union[_BufferProtocol, CudaBuffer], offset: int = 0, size: int = -1) -> CudaBuffer:
        """A new device buffer holding a copy of ``data[offset:offset+size]``."""
    def buffer_from_object(self, obj: Any) -> CudaBuffer:
        """A zero-copy device view of ``obj``'s memory (CudaBuffer, HostBuffer, CAI or DLPack objects)."""
    def foreign_buffer(self, address: int, size: int, base: Optional[object] = None) -> CudaBuffer:
        """A device buffer over ``size`` bytes at ``address``, keeping ``base`` alive."""
    def get_device_address(self, address: int) -> int:
        """The device address for a pinned host address or a device address."""
    def open_ipc_buffer(self, ipc_handle: IpcMemHandle) -> CudaBuffer:
        """Open a device buffer exported by ``CudaBuffer.export_for_ipc``."""
    def read_file(self, path: Union[str, os.PathLike[str]], offset: int = 0, size: int = -1) -> CudaBuffer:
        """A new device buffer holding ``size`` bytes of the file from ``offset`` (-1: to the end)."""
    def file_options(self) -> _FileOptions:
        """How this context's file reads and writes run."""
    def set_file_options(
        self,
        *,
        chunk_size: Optional[int] = None,
        threads: Optional[int] = None,
        direct_io: Optional[Literal["never", "if_supported", "required"]] = None,
    ) -> None:
        """Change how this context's file reads and writes run."""
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class CudaBuffer:
    """Device memory (pyarrow.cuda's ``CudaBuffer``)."""

    def __new__(cls, *_args: Any, **_kwargs: Any) -> Self: ...
    @staticmethod
    def from_buffer(buf: Any) -> CudaBuffer:
        """A zero-copy device buffer over a CudaBuffer, a typed view, or a CAI/DLPack object."""
    @property
    def size(self) -> int:
        """The size in bytes."""
    @property
    def address(self) -> int:
        """The device address of the first byte (0 when empty)."""
    @property
    def context(self) -> Context:
        """The context this buffer belongs to."""
    @property
    def parent(self) -> Optional[CudaBuffer]:
        """The buffer this one was sliced from, or ``None``."""
    @property
    def is_cpu(self) -> bool:
        """Always ``False``."""
    @property
    def is_mutable(self) -> bool:
        """Always ``True``."""
    def __len__(self) -> int: ...
    @overload
    def copy_to_host(
        self,
        position: int = 0,
        nbytes: int = -1,
        buf: None = None,
        memory_pool: Optional[object] = None,
        resizable: bool = False,
    ) -> Buffer: ...
    @overload
    def copy_to_host(
        self,
        position: int,
        nbytes: int,
        buf: _BufferProtocol,
        memory_pool: Optional[object] = None,
        resizable: bool = False,
    ) -> _BufferProtocol: ...
    @overload
    def copy_to_host(
        self,
        position: int = 0,
        nbytes: int = -1,
        *,
        buf: _BufferProtocol,
        memory_pool: Optional[object] = None,
        resizable: bool = False,
    ) -> _BufferProtocol: ...
    def copy_from_host(self, data: _BufferProtocol, position: int = 0, nbytes: int = -1) -> int:
        """Copy host bytes into this buffer at ``position``; returns the bytes copied."""
    def copy_from_device(self, buf: CudaBuffer, position: int = 0, nbytes: int = -1) -> int:
        """Copy from device buffer ``buf`` into this buffer at ``position``; returns the bytes copied."""
    def export_for_ipc(self) -> IpcMemHandle:
        """Export this buffer for another process."""
    def slice(self, offset: int = 0, length: Optional[int] = None) -> CudaBuffer:
        """A zero-copy slice; out of range raises ``OutOfRangeError`` (no clamping)."""
    def to_pybytes(self) -> bytes:
        """The whole buffer as ``bytes``."""
    def __bytes__(self) -> bytes:
        """The whole buffer as ``bytes``, in one copy."""
    def __iter__(self) -> Iterator[int]:
        """The bytes as ints, from one copy of the whole buffer."""
    def read_file(self, file: _FileArg, file_offset: int = 0) -> None:
        """Fill this whole buffer with bytes of ``file`` from ``file_offset``."""
    def write_file(self, file: _FileArg, file_offset: int = 0) -> int:
        """Write this whole buffer to ``file`` at ``file_offset``; returns the bytes written."""
    @overload
    def __getitem__(self, key: SupportsIndex, /) -> int: ...
    @overload
    def __getitem__(self, key: builtins.slice, /) -> CudaBuffer: ...
    def equals(self, other: Union[CudaBuffer, _BufferProtocol]) -> bool:
        """Whether ``other`` holds the same bytes."""
    def __eq__(self, other: object, /) -> bool: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3), ``uint8``, one dimension; on the
        simulator, ``SimulatedMemoryAttributeError`` (``hasattr`` is ``False``)."""
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule over the same memory."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``."""
    def view(self, dtype: Any, shape: Optional[Sequence[int]] = None) -> CudaArrayView:
        """A typed, C-contiguous view for other libraries."""

@final
class CudaArrayView:
    """A typed view of a device buffer (``CudaBuffer.view``)."""

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape."""
    @property
    def typestr(self) -> str:
        """The NumPy type string."""
    @property
    def nbytes(self) -> int:
        """The size in bytes."""
    @property
    def buffer(self) -> CudaBuffer:
        """The device buffer viewed."""
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface (version 3); on the simulator,
        ``SimulatedMemoryAttributeError`` (``hasattr`` is ``False``)."""
    def __dlpack__(
        self,
        *,
        stream: Optional[Any] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any:
        """A DLPack capsule with this view's type and shape."""
    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``."""

@final
class IpcMemHandle:
    """A serializable handle to device memory for another process."""

    @staticmethod
    def from_buffer(opaque_handle: _BufferProtocol) -> IpcMemHandle:
        """Read a handle from its serialized bytes."""
    def serialize(self, pool: Optional[object] = None) -> Buffer:
        """The handle as a host ``Buffer`` in cudabuf's format."""
    def to_pyarrow_bytes(self) -> bytes:
        """The handle in pyarrow's 72-byte format."""
    @property
    def size(self) -> int:
        """The number of bytes the importer sees."""
    @property
    def offset(self) -> int:
        """The offset of the exported range in its allocation."""
    def __eq__(self, other: object, /) -> bool: ...

@final
class BufferReader:
    """Reads a device buffer like a file."""

    def __new__(cls, obj: CudaBuffer) -> Self: ...
    def read_buffer(self, nbytes: Optional[int] = None) -> CudaBuffer:
        """Up to ``nbytes`` as a zero-copy device slice."""
    def read(self, nbytes: Optional[int] = None) -> bytes:
        """Up to ``nbytes`` copied to the host."""
    def readinto(self, buffer: _BufferProtocol) -> int:
        """Read into a writable host buffer; returns the bytes read."""
    def seek(self, position: int, whence: int = 0) -> int:
        """Move the position; returns it."""
    def tell(self) -> int:
        """The current position; ``ClosedError`` once closed."""
    def size(self) -> int:
        """The size of the buffer."""
    def close(self) -> None:
        """Close the reader."""
    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
    def readable(self) -> bool: ...
    def seekable(self) -> bool: ...
    def writable(self) -> bool: ...
    def to_pyarrow(self) -> Any:
        """This reader as a ``pyarrow.PythonFile`` reading host copies (shares the position)."""
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

@final
class _ReaderHostFile:
    """A ``BufferReader`` as a plain binary file on the host (no ``read_buffer``)."""

    def read(self, nbytes: Optional[int] = None) -> bytes: ...
    def readinto(self, buffer: _BufferProtocol) -> int: ...
    def seek(self, position: int, whence: int = 0) -> int: ...
    def tell(self) -> int: ...
    def size(self) -> int: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def mode(self) -> str: ...
    def readable(self) -> bool: ...
    def seekable(self) -> bool: ...
    def writable(self) -> bool: ...

@final
class BufferWriter:
    """Writes into a device buffer like a file."""

    def __new__(cls, buffer: CudaBuffer) -> Self: ...
    def write(self, data: _BufferProtocol) -> int:
        """Write at the current position; returns the bytes written."""
    def writeat(self, position: int, data: _BufferProtocol) -> None:
        """Write at ``position``, leaving the position after it."""
    def flush(self) -> None:
        """Send staged bytes to the device."""
    def seek(self, position: int, whence: int = 0) -> int:
        """Move the position (after flushing); returns it."""
    def tell(self) -> int:
        """The current position; ``ClosedError`` once closed."""
    def close(self) -> None:
        """Flush and close."""
    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
    @property
    def buffer_size(self) -> int:
        """The size of the pinned staging buffer (0: unbuffered)."""
    @buffer_size.setter
    def buffer_size(self, buffer_size: int) -> None: ...
    @property
    def num_bytes_buffered(self) -> int:
        """Bytes staged and not yet sent."""
    def readable(self) -> bool: ...
    def seekable(self) -> bool: ...
    def writable(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *_args: object) -> None: ...

@final
class Message:
    """One Arrow IPC message: metadata on the host, body on the device."""

    @property
    def type(self) -> str:
        """"schema", "dictionary batch", "record batch", ..."""
    @property
    def metadata_version(self) -> str:
        """E.g. "V5"."""
    @property
    def metadata(self) -> Buffer:
        """The flatbuffer metadata."""
    @property
    def body(self) -> CudaBuffer:
        """The body, a zero-copy device slice."""
    def __len__(self) -> int: ...

@final
class DeviceRecordBatch:
    """A record batch whose column buffers stay in device memory."""

    @property
    def schema(self) -> Any:
        """The schema passed to ``read_record_batch``."""
    @property
    def num_rows(self) -> int: ...
    @property
    def num_columns(self) -> int: ...
    def __len__(self) -> int: ...
    @property
    def body(self) -> Optional[CudaBuffer]:
        """The message body."""
    @property
    def context(self) -> Context:
        """The context whose device holds the data."""
    def column_buffers(self, i: int) -> list[Optional[CudaBuffer]]:
        """The device buffers of column ``i``."""
    def to_host(self) -> Any:
        """Copy to a ``pyarrow.RecordBatch``."""
    def __arrow_c_device_array__(self, requested_schema: Optional[object] = None, **kwargs: Any) -> tuple[object, object]:
        """The Arrow PyCapsule device protocol."""
    def __arrow_c_schema__(self) -> object:
        """The schema as an Arrow PyCapsule."""

def serialize_record_batch(batch: Any, ctx: Context) -> CudaBuffer:
    """Write a record batch (any Arrow PyCapsule producer) as one IPC message on the device."""

def read_message(source: Union[CudaBuffer, BufferReader], pool: Optional[object] = None) -> Message:
    """Read one Arrow IPC message from device memory."""

def read_record_batch(
    buffer: Union[CudaBuffer, Message],
    schema: Any,
    *,
    dictionary_memo: Optional[object] = None,
    pool: Optional[object] = None,
) -> DeviceRecordBatch:
    """Read the record batch message that fills ``buffer``."""

def read_ipc_file(
    path: Union[str, os.PathLike[str]],
    ctx: Context,
    columns: Optional[Union[Sequence[str], Sequence[int]]] = None,
) -> list[DeviceRecordBatch]:
    """Read an Arrow IPC file (Feather v2) into device record batches."""

def read_ipc_stream_file(path: Union[str, os.PathLike[str]], ctx: Context) -> list[DeviceRecordBatch]:
    """Read an Arrow IPC stream file into device record batches."""

def read_parquet(
    path: Union[str, os.PathLike[str]],
    ctx: Context,
    columns: Optional[Sequence[str]] = None,
    *,
    decompression_limit: Optional[int] = None,
) -> list[DeviceRecordBatch]:
    """Read a Parquet file into device record batches, one per row group (decoded on the host).

    ``decompression_limit``: the most bytes the decompressed pages held at once may take
    (``None``: 1 GiB); a file that needs more raises ``InvalidDataError``.
    """

def write_ipc_file(
    path: Union[str, os.PathLike[str]],
    batches: Sequence[DeviceRecordBatch],
    schema: Optional[Any] = None,
) -> None:
    """Write device record batches to an Arrow IPC file."""

@disjoint_base
class Simulator:
    """A simulator instance of its own (the native part of ``cudabuf.sim.Simulator``)."""

    def __new__(
        cls,
        devices: int = 2,
        capacity: int = 1073741824,
        *,
        seed: Optional[int] = None,
        schedule: Optional[Literal["deterministic", "threaded"]] = None,
        races: Optional[Literal["fail", "log", "off"]] = None,
        name: Optional[str] = None,
        fill: int = 0xA5,
    ) -> Self: ...
    @property
    def devices(self) -> int:
        """The number of simulated devices."""
    @property
    def capacity(self) -> int:
        """Each device's capacity in bytes."""
    @property
    def name(self) -> str:
        """The name of the devices and of the reports."""
    @property
    def fill(self) -> int:
        """The byte new device memory holds before anything is written to it."""
    @property
    def seed(self) -> int:
        """The seed of the stream scheduler."""
    @property
    def schedule(self) -> Literal["deterministic", "threaded"]:
        """How streams run."""
    @property
    def races(self) -> Literal["fail", "log", "off"]:
        """What the race detector does."""
    def context(self, device: int = 0) -> Context:
        """Device ``device``'s context on this simulator."""
    def new_host_buffer(self, size: int, device: int = 0) -> HostBuffer:
        """Pinned host memory from this simulator."""
    def bytes_in_use(self, device: int = 0) -> int:
        """The bytes of live device allocations on ``device``; ``InvalidDeviceError`` for
        a device this simulator does not have."""
    def _leaks(self) -> tuple[list[tuple[int, str, int, int]], str]: ...
    def _races(self) -> tuple[list[tuple[str, str, str, str, str]], int, str]: ...
    def clear_race_report(self) -> None:
        """Forget the races detected so far."""
    def fail_nth(
        self,
        op: Literal["allocate", "alloc_host", "copy", "ipc_export", "ipc_open", "synchronize"],
        n: int,
        error: Optional[Literal["out_of_memory", "driver"]] = None,
    ) -> None:
        """Make the ``n``-th call of ``op`` from now fail."""
    def fail_randomly(
        self,
        op: Literal["allocate", "alloc_host", "copy", "ipc_export", "ipc_open", "synchronize"],
        probability: float,
        seed: int = 0,
        error: Optional[Literal["out_of_memory", "driver"]] = None,
    ) -> None:
        """Make each call of ``op`` fail with ``probability``, reproducibly from ``seed``."""
    def clear_faults(self) -> None:
        """Disarm every injected fault."""
    def op_count(
        self, op: Literal["allocate", "alloc_host", "copy", "ipc_export", "ipc_open", "synchronize"]
    ) -> int:
        """How many calls of ``op`` this simulator has seen."""

FLIGHT_DEFAULT_MAX_MESSAGE_SIZE: int
"""The default limit on one incoming Flight message (64 MiB)."""

_FlightDescriptorTuple = tuple[Optional[list[str]], Optional[bytes]]
_FlightInfoTuple = tuple[
    Any, Optional[_FlightDescriptorTuple], list[tuple[bytes, list[str], bytes]], int, int, bool, bytes
]

@disjoint_base
class _FlightClient:
    """The native part of ``cudabuf.flight.FlightClient``."""

    def __new__(
        cls,
        location: str,
        *,
        token: Optional[str] = None,
        max_message_size: int = 67108864,
        connect_timeout: Optional[float] = 10.0,
    ) -> Self: ...
    @property
    def location(self) -> str:
        """The location, as given."""
    @property
    def max_message_size(self) -> int:
        """The limit on one incoming message, in bytes."""
    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
    def close(self) -> None:
        """Close the connection."""
    def _do_get(
        self, ticket: bytes, ctx: Context, timeout: Optional[float] = None
    ) -> tuple[Any, list[DeviceRecordBatch]]: ...
    def _get_flight_info(
        self, path: Optional[list[str]], command: Optional[bytes], timeout: Optional[float] = None
    ) -> _FlightInfoTuple: ...
    def _list_flights(self, criteria: bytes, timeout: Optional[float] = None) -> list[_FlightInfoTuple]: ...
    def _do_put(
        self,
        path: Optional[list[str]],
        command: Optional[bytes],
        batches: list[DeviceRecordBatch],
        schema: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> list[bytes]: ...
    def _do_exchange(
        self,
        path: Optional[list[str]],
        command: Optional[bytes],
        batches: list[DeviceRecordBatch],
        ctx: Context,
        schema: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> tuple[Any, list[DeviceRecordBatch]]: ...

@disjoint_base
class _FlightServer:
    """The native part of ``cudabuf.flight.FlightServer``."""

    def __new__(
        cls,
        ctx: Context,
        *,
        token: Optional[str] = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_message_size: int = 67108864,
    ) -> Self: ...
    @property
    def port(self) -> int:
        """The port the server listens on."""
    @property
    def host(self) -> str:
        """The host it listens on, as given."""
    @property
    def location(self) -> str:
        """``grpc://host:port``."""
    @property
    def max_message_size(self) -> int:
        """The limit on one incoming ``DoPut`` message, in bytes."""
    @property
    def closed(self) -> bool:
        """Whether ``shutdown()`` was called."""
    def keys(self) -> list[bytes]:
        """Every key, in order."""
    def shutdown(self, grace: float = 5.0) -> None:
        """Stop serving and drop the flights; calls in progress get ``grace`` seconds."""
    def _insert(self, key: bytes, batches: list[DeviceRecordBatch], schema: Optional[Any] = None) -> None: ...
    def _get(self, key: bytes) -> Optional[tuple[Any, list[DeviceRecordBatch]]]: ...
    def _remove(self, key: bytes) -> Optional[tuple[Any, list[DeviceRecordBatch]]]: ...
