"""The exceptions of cudabuf: one ``CudaError`` hierarchy, by kind of failure.

Every error raised by cudabuf is a :class:`CudaError`. Each kind also derives from the
built-in exception a Python user expects (``ValueError`` for bad arguments,
``IndexError`` for ranges, ``MemoryError`` for out-of-memory, ``BufferError`` where a
buffer cannot be exported), so ``except ValueError`` keeps working for code written
against ``pyarrow.cuda``.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "CudaError",
    "OutOfRangeError",
    "SourceTooShortError",
    "OutOfMemoryError",
    "InvalidDeviceError",
    "InvalidAddressError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidIpcHandleError",
    "NoDriverError",
    "UnsupportedError",
    "SimulatedMemoryError",
    "SimulatedMemoryAttributeError",
    "InvalidDataError",
    "ClosedError",
    "BufferInUseError",
    "DataRaceError",
    "NotReadyError",
    "DriverError",
    "FileError",
    "MissingFileError",
    "FilePermissionError",
    "SimulatorNotCleanError",
    "FlightError",
    "FlightUnauthenticatedError",
    "FlightNotFoundError",
    "FlightUnavailableError",
    "FlightTimedOutError",
]


class CudaError(RuntimeError):
    """Base class of every cudabuf error.

    Attributes:
        kind: the kind of failure, as the Rust ``cudabuf::ErrorKind`` names it
            (``"OutOfRange"``, ``"OutOfMemory"``, ``"Driver"``, ...).
        cuda_name: the CUDA error name (``"CUDA_ERROR_INVALID_VALUE"``, ...) when the
            failure came from, or stands for, a CUDA driver error; otherwise ``None``.
        cuda_code: the numeric CUDA error code with ``cuda_name``; otherwise ``None``.
    """

    kind: str
    cuda_name: Optional[str]
    cuda_code: Optional[int]

    def __init__(
        self,
        message: str,
        kind: str = "Driver",
        cuda_name: Optional[str] = None,
        cuda_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.cuda_name = cuda_name
        self.cuda_code = cuda_code


class OutOfRangeError(CudaError, IndexError, ValueError):
    """A position, offset or length lies outside a buffer (also an ``IndexError`` and,
    as pyarrow raises for ranges, a ``ValueError``)."""


class SourceTooShortError(CudaError, ValueError):
    """The source of a copy holds fewer bytes than asked for."""


class OutOfMemoryError(CudaError, MemoryError):
    """The device (or pinned host memory) cannot hold the allocation."""


class InvalidDeviceError(CudaError, ValueError):
    """No device with this number."""


class InvalidAddressError(CudaError, ValueError):
    """An address is not (or no longer) usable: freed, pageable, unknown, or of
    another device."""


class InvalidArgumentError(CudaError, ValueError):
    """An argument is wrong in a way that is not a range."""


class InvalidTypeError(InvalidArgumentError, TypeError):
    """An argument is of a type the operation cannot use: not an Arrow producer, not
    device memory, an Arrow PyCapsule of the wrong kind (also a ``TypeError``, as Python
    raises for wrong types)."""


class InvalidIpcHandleError(CudaError, ValueError):
    """IPC handle bytes are truncated, corrupt, of another backend, or name memory that
    is gone."""


class NoDriverError(CudaError):
    """The CUDA driver cannot be loaded, or reports no usable device."""


class UnsupportedError(CudaError, NotImplementedError):
    """The backend or build does not support the operation."""


class SimulatedMemoryError(UnsupportedError, BufferError):
    """Simulated device memory was about to be handed to (or taken from) another
    library: the simulator's device addresses are not memory any GPU library can
    reach, so ``__cuda_array_interface__``, DLPack and foreign objects need the
    ``cuda`` backend."""


class SimulatedMemoryAttributeError(SimulatedMemoryError, AttributeError):
    """A protocol attribute (``__cuda_array_interface__``) read on the simulator. Also an
    ``AttributeError``, so ``hasattr(buf, "__cuda_array_interface__")`` is ``False`` and
    libraries that probe for the protocol (Numba, PyTorch, CuPy) fall back instead of
    failing."""


class InvalidDataError(CudaError, ValueError):
    """Bytes that should hold a structure (an Arrow IPC message, ...) are truncated or
    corrupt."""


class ClosedError(CudaError, ValueError):
    """A reader, writer, stream or event was used after ``close()`` (a ``ValueError``,
    like Python's own closed files)."""


class BufferInUseError(CudaError, BufferError):
    """Pinned host bytes are in use: lent to an asynchronous copy in flight (reading,
    writing or exporting them is refused until its transfer is waited for, or its
    stream or an event recorded after it is synchronized), or exported through the
    buffer protocol (a copy cannot take bytes that a live ``memoryview`` or NumPy array
    reaches). Also a ``BufferError``, as ``bytearray`` raises when it cannot resize
    while exported. ``kind`` is ``"BufferInUse"``."""


class DataRaceError(CudaError):
    """The simulator's race detector found two operations on the same bytes that
    nothing orders (a missing ``wait_event``, a read before a ``synchronize``), at the
    call that races (``races="fail"``, the default). The message names both operations
    and the bytes; the simulator's ``race_report()`` keeps it."""


class NotReadyError(CudaError):
    """The work an operation needs has not completed yet (``Event.elapsed_time``
    before both events are done)."""


class DriverError(CudaError):
    """A CUDA driver call failed in a way not covered by another kind; ``cuda_name``
    and ``cuda_code`` say how."""


class FileError(CudaError, OSError):
    """Reading or writing a file failed: it is missing or unreadable, not a regular file
    (a directory, FIFO or device node), shorter than the range asked for (also when it
    shrinks while being read), or a write failed. The message names the file and the
    byte; ``filename`` is the file's path."""

    def __init__(
        self,
        message: str,
        kind: str = "File",
        cuda_name: Optional[str] = None,
        cuda_code: Optional[int] = None,
        filename: Optional[str] = None,
    ) -> None:
        super().__init__(message, kind, cuda_name, cuda_code)
        self.filename = filename

    def __str__(self) -> str:
        # The message, as for every cudabuf error (OSError's own form would replace it
        # with "[Errno None] None: 'filename'" once ``filename`` is set).
        return str(self.args[0]) if self.args else ""


class MissingFileError(FileError, FileNotFoundError):
    """The file does not exist (also a ``FileNotFoundError``, as pyarrow raises)."""


class FilePermissionError(FileError, PermissionError):
    """The file cannot be opened with the access the call needs (also a
    ``PermissionError``)."""


class SimulatorNotCleanError(CudaError, AssertionError):
    """``cudabuf.sim.Simulator.assert_clean``: the simulator still holds allocations (a
    leak) or has detected a data race. The message lists each one; ``leaks`` and
    ``races`` hold the reports (also an ``AssertionError``, so a test framework reports
    it as a failed check)."""

    leaks: list[Any]
    races: list[Any]

    def __init__(
        self,
        message: str,
        leaks: Optional[list[Any]] = None,
        races: Optional[list[Any]] = None,
    ) -> None:
        super().__init__(message, "SimulatorNotClean")
        self.leaks = list(leaks) if leaks is not None else []
        self.races = list(races) if races is not None else []


GRPC_CODE_NAMES = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}
"""gRPC's status codes by number, with their canonical names."""


class FlightError(CudaError):
    """An Arrow Flight call (:mod:`cudabuf.flight`) failed with a gRPC status: the
    peer's refusal (``NOT_FOUND``, ``UNAUTHENTICATED``, ...), a stream that broke, a
    connection that could not be made or a server that cannot listen (``UNAVAILABLE``),
    a call past its ``timeout`` (``DEADLINE_EXCEEDED``), or a message over the size limit
    (``RESOURCE_EXHAUSTED``; tonic's own refusal far over it: ``OUT_OF_RANGE``).
    ``kind`` is ``"Flight"``.

    Attributes:
        code: the gRPC status code (``16`` for ``UNAUTHENTICATED``, ...).
        code_name: its canonical name (``"UNAUTHENTICATED"``, ...).
    """

    code: int
    code_name: str

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message, "Flight")
        self.code = code
        self.code_name = GRPC_CODE_NAMES.get(code, "UNKNOWN")


class FlightUnauthenticatedError(FlightError):
    """``UNAUTHENTICATED``: the server wants a bearer token, or another one."""


class FlightNotFoundError(FlightError, KeyError):
    """``NOT_FOUND``: the server has no flight for the ticket or descriptor (also a
    ``KeyError``, as pyarrow.flight raises for this status)."""

    def __str__(self) -> str:
        # The message, as for every cudabuf error (KeyError's own form quotes it).
        return str(self.args[0]) if self.args else ""


class FlightUnavailableError(FlightError):
    """``UNAVAILABLE``: the connection could not be made or broke, or the server could
    not listen."""


class FlightTimedOutError(FlightError):
    """``DEADLINE_EXCEEDED``: the call did not finish within its ``timeout``."""


_FLIGHT_ERRORS = {
    16: FlightUnauthenticatedError,
    5: FlightNotFoundError,
    14: FlightUnavailableError,
    4: FlightTimedOutError,
}


def _flight_error(message: str, code: int) -> FlightError:
    """The exception for gRPC status ``code`` (the extension picks its class from
    ``_FLIGHT_ERRORS`` the same way)."""
    return _FLIGHT_ERRORS.get(code, FlightError)(message, code)
