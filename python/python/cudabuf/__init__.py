"""cudabuf: pyarrow.cuda for pip.

CUDA device buffers, pinned host buffers, IPC handles that share device memory between
processes, and Arrow record batches on the device, with the API of ``pyarrow.cuda``
(``from cudabuf import cuda``), zero-copy with PyTorch, CuPy, JAX and NumPy, and a
simulator backend so that GPU code runs in CI without a GPU.

Arrow Flight into device memory: :mod:`cudabuf.flight`.

Backends: ``"sim"`` (default) or ``"cuda"``, from ``CUDABUF_BACKEND`` or
:func:`set_backend`.
"""

from __future__ import annotations

from cudabuf._errors import (
    BufferInUseError,
    ClosedError,
    CudaError,
    DataRaceError,
    DriverError,
    FileError,
    FilePermissionError,
    FlightError,
    FlightNotFoundError,
    FlightTimedOutError,
    FlightUnauthenticatedError,
    FlightUnavailableError,
    MissingFileError,
    InvalidAddressError,
    InvalidArgumentError,
    InvalidDataError,
    InvalidDeviceError,
    InvalidIpcHandleError,
    InvalidTypeError,
    NoDriverError,
    NotReadyError,
    OutOfMemoryError,
    OutOfRangeError,
    SimulatedMemoryAttributeError,
    SimulatedMemoryError,
    SimulatorNotCleanError,
    SourceTooShortError,
    UnsupportedError,
)
from cudabuf._native import get_backend, set_backend
from cudabuf import cuda, flight, sim

__version__ = "0.1.0"

__all__ = [
    "cuda",
    "flight",
    "sim",
    "set_backend",
    "get_backend",
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
