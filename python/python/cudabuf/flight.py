"""``cudabuf.flight``: Arrow Flight straight into device memory.

A client whose ``DoGet`` lands record batches on the device and whose ``DoPut`` and
``DoExchange`` send them from it (:class:`FlightClient`, :func:`do_get_to_device`) and a
server of device batches (:class:`FlightServer`: ``DoGet``, ``DoPut`` into device
memory, ``DoExchange`` echoing, ``GetFlightInfo``, ``GetSchema``, ``ListFlights``), over the Rust crate ``cudabuf-flight``. Both speak plain gRPC
(``grpc://host:port``) with pyarrow.flight and any other Flight peer, with an optional
bearer token (``authorization: Bearer <token>``), and run on the simulator like the rest
of cudabuf, so Flight code can be tested in CI without a GPU::

    import pyarrow as pa
    from cudabuf import cuda, flight

    ctx = cuda.Context(0)
    batch = pa.record_batch([pa.array([1, 2, 3])], names=["x"])
    on_device = cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema)

    with flight.FlightServer(ctx, token="s3cret") as server:
        server.insert("numbers", [on_device])
        with flight.FlightClient(server.location, token="s3cret") as client:
            batches = client.do_get("numbers", ctx)     # DeviceRecordBatch objects
    assert batches.to_host().equals(pa.Table.from_batches([batch]))

Network and device work run on tokio runtimes inside the extension with the GIL released;
a waiting call checks for signals, so Ctrl-C interrupts it (``KeyboardInterrupt``), and
every call takes an optional ``timeout`` in seconds (:class:`~cudabuf.FlightTimedOutError`).
A gRPC status from the peer (a refusal, a broken stream, a failed connection) raises
:class:`~cudabuf.FlightError` (with ``code`` and ``code_name``) or its subclass for the
code; bytes that are no valid Flight data raise :class:`~cudabuf.InvalidDataError`;
device failures raise the cudabuf error of their kind.

Dictionary-encoded columns travel both ways (delta dictionary batches are refused with
:class:`~cudabuf.UnsupportedError`). Not there yet: TLS, a handler for the server's
``DoExchange`` (it echoes), and streaming (``do_get`` and ``do_exchange`` return every
batch at once, ``do_put`` takes them all at once).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import TracebackType
from typing import Any, List, Optional, Sequence, Tuple, Type, Union

from cudabuf._errors import (
    FlightError,
    FlightNotFoundError,
    FlightTimedOutError,
    FlightUnauthenticatedError,
    FlightUnavailableError,
    InvalidArgumentError,
    InvalidTypeError,
)
from cudabuf._native import (
    FLIGHT_DEFAULT_MAX_MESSAGE_SIZE,
    Context,
    DeviceRecordBatch,
    _FlightClient,
    _FlightServer,
)

__all__ = [
    "FlightClient",
    "FlightServer",
    "FlightDescriptor",
    "FlightEndpoint",
    "FlightInfo",
    "FlightBatches",
    "do_get_to_device",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "FlightError",
    "FlightUnauthenticatedError",
    "FlightNotFoundError",
    "FlightUnavailableError",
    "FlightTimedOutError",
]

DEFAULT_MAX_MESSAGE_SIZE: int = FLIGHT_DEFAULT_MAX_MESSAGE_SIZE
"""The default limit on one incoming Flight message, header and body (64 MiB)."""


def _as_bytes(operation: str, name: str, value: Union[bytes, str]) -> bytes:
    """``value`` (bytes-like, or ``str`` as UTF-8) as ``bytes``."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidTypeError(
        f"invalid argument to {operation}: {name} must be bytes or str, got {type(value).__name__}",
        "InvalidArgument",
    )


@dataclass(frozen=True)
class FlightDescriptor:
    """What a flight is called: a ``path`` (a tuple of strings) or an opaque ``command``
    (bytes), exactly one of them (pyarrow.flight's ``FlightDescriptor``). Make one with
    :meth:`for_path` or :meth:`for_command`.

    cudabuf's :class:`FlightServer` keys a flight by its descriptor: a path
    ``("a", "b")`` is the key ``b"a/b"``, a command is its bytes (:attr:`key`).
    """

    path: Optional[Tuple[str, ...]] = None
    """The path, or ``None`` for a command."""
    command: Optional[bytes] = None
    """The command, or ``None`` for a path."""

    def __post_init__(self) -> None:
        if (self.path is None) == (self.command is None):
            raise InvalidArgumentError(
                "invalid argument to FlightDescriptor: give exactly one of path and command",
                "InvalidArgument",
            )

    @classmethod
    def for_path(cls, *path: Union[str, bytes]) -> FlightDescriptor:
        """A path descriptor; ``bytes`` parts are decoded as UTF-8."""
        parts = tuple(p.decode() if isinstance(p, (bytes, bytearray)) else str(p) for p in path)
        return cls(path=parts)

    @classmethod
    def for_command(cls, command: Union[bytes, str]) -> FlightDescriptor:
        """A command descriptor (``str`` is encoded as UTF-8)."""
        return cls(command=_as_bytes("FlightDescriptor.for_command", "command", command))

    @property
    def descriptor_type(self) -> str:
        """``"path"`` or ``"cmd"``."""
        return "path" if self.path is not None else "cmd"

    @property
    def key(self) -> bytes:
        """The key cudabuf's :class:`FlightServer` keeps this flight under."""
        if self.path is not None:
            return "/".join(self.path).encode()
        assert self.command is not None
        return self.command


@dataclass(frozen=True)
class FlightEndpoint:
    """Where to fetch (part of) a flight: a ``ticket`` for ``DoGet`` and the
    ``locations`` that redeem it (empty: the server that answered)."""

    ticket: bytes
    """The ticket to pass to :meth:`FlightClient.do_get`."""
    locations: Tuple[str, ...] = ()
    """URIs of servers that redeem the ticket (empty: the one that answered)."""
    app_metadata: bytes = b""
    """Application-defined metadata."""


@dataclass(frozen=True)
class FlightInfo:
    """What ``GetFlightInfo`` and ``ListFlights`` say about a flight."""

    schema: Any
    """The schema: a ``pyarrow.Schema`` (with pyarrow installed; otherwise an object with
    ``__arrow_c_schema__``), or ``None`` when the server sent none."""
    descriptor: Optional[FlightDescriptor]
    """The flight's descriptor, when the server sent one."""
    endpoints: Tuple[FlightEndpoint, ...]
    """Where to fetch it; all of them together make the whole flight."""
    total_records: int
    """The number of rows, ``-1`` when unknown."""
    total_bytes: int
    """The size in bytes, ``-1`` when unknown."""
    ordered: bool = False
    """Whether the endpoints are in the order of the data."""
    app_metadata: bytes = b""
    """Application-defined metadata."""


class FlightBatches(List[DeviceRecordBatch]):
    """The device record batches of one flight, in order (a ``list`` of
    :class:`cudabuf.cuda.DeviceRecordBatch`), with the flight's ``schema`` (known also
    when there are no batches)."""

    schema: Any
    """A ``pyarrow.Schema`` (with pyarrow installed; otherwise an object with
    ``__arrow_c_schema__``)."""

    def __init__(self, batches: Sequence[DeviceRecordBatch], schema: Any) -> None:
        super().__init__(batches)
        self.schema = schema

    def to_host(self) -> Any:
        """Copy every batch to the host as one ``pyarrow.Table`` (needs pyarrow)."""
        pa = importlib.import_module("pyarrow")
        return pa.Table.from_batches([b.to_host() for b in self], schema=self.schema)


def _descriptor_parts(
    operation: str, descriptor: Union[FlightDescriptor, str]
) -> Tuple[Optional[List[str]], Optional[bytes]]:
    """``descriptor`` (a ``str`` is a one-part path) as the native ``(path, command)``."""
    if isinstance(descriptor, str):
        descriptor = FlightDescriptor.for_path(descriptor)
    if not isinstance(descriptor, FlightDescriptor):
        raise InvalidTypeError(
            f"invalid argument to {operation}: descriptor must be a FlightDescriptor or a str,"
            f" got {type(descriptor).__name__}",
            "InvalidArgument",
        )
    path = list(descriptor.path) if descriptor.path is not None else None
    return path, descriptor.command


def _info(raw: Tuple[Any, ...]) -> FlightInfo:
    schema, descriptor, endpoints, total_records, total_bytes, ordered, app_metadata = raw
    if descriptor is None:
        flight_descriptor = None
    else:
        path, command = descriptor
        flight_descriptor = FlightDescriptor(
            path=tuple(path) if path is not None else None, command=command
        )
    return FlightInfo(
        schema=schema,
        descriptor=flight_descriptor,
        endpoints=tuple(FlightEndpoint(t, tuple(uris), meta) for t, uris, meta in endpoints),
        total_records=total_records,
        total_bytes=total_bytes,
        ordered=ordered,
        app_metadata=app_metadata,
    )


class FlightClient(_FlightClient):
    """A Flight client whose ``DoGet`` lands record batches in device memory and whose
    ``DoPut`` and ``DoExchange`` send them from it.

    ``FlightClient(location, *, token=None, max_message_size=DEFAULT_MAX_MESSAGE_SIZE,
    connect_timeout=10.0)``: ``location`` is ``"grpc://host:port"`` or
    ``"grpc+tcp://host:port"`` (pyarrow.flight's spellings of plain gRPC); with a
    ``token`` every call sends ``authorization: Bearer <token>``. The connection is made
    at once, within ``connect_timeout`` seconds (``None``: no limit; Ctrl-C interrupts
    it). ``max_message_size`` bounds one incoming message (header and body): a larger
    one fails the call with ``FlightError`` (``RESOURCE_EXHAUSTED``, or tonic's
    ``OUT_OF_RANGE`` far over it) before anything is allocated for it.

    Each message body is copied once from gRPC's buffer into pinned staging memory of the
    context and uploaded on a stream of it while the next message arrives. Calls release
    the GIL; several threads may call one client at once (they share its connection).
    ``close()`` (or leaving a ``with`` block) closes it; calls already running finish.

    Raises:
        InvalidArgumentError: an unknown scheme or a malformed location, an empty or
            non-ASCII token, a ``max_message_size`` below 1.
        UnsupportedError: ``grpc+tls://`` and ``grpc+unix://`` locations.
        FlightUnavailableError: the connection could not be made.
    """

    def do_get(
        self, ticket: Union[bytes, str], ctx: Context, *, timeout: Optional[float] = None
    ) -> FlightBatches:
        """``DoGet`` of ``ticket`` (``str`` is sent as UTF-8) into the device of ``ctx``:
        every batch of the stream, in order, once all have landed.

        Raises:
            FlightError: the server's refusal (``FlightNotFoundError``,
                ``FlightUnauthenticatedError``, ...), a broken stream, a message over
                ``max_message_size``; ``FlightTimedOutError`` past ``timeout`` seconds.
            InvalidDataError: the server sent bytes that are no valid Flight stream.
            UnsupportedError: delta dictionary batches.
            ClosedError: the client is closed.
        """
        schema, batches = self._do_get(_as_bytes("do_get", "ticket", ticket), ctx, timeout)
        return FlightBatches(batches, schema)

    def get_flight_info(
        self, descriptor: Union[FlightDescriptor, str], *, timeout: Optional[float] = None
    ) -> FlightInfo:
        """``GetFlightInfo``: what the server says about the flight ``descriptor`` (a
        ``str`` is a one-part path).

        Raises:
            FlightError: the server's refusal (``FlightNotFoundError``, ...);
                ``FlightTimedOutError`` past ``timeout`` seconds.
            InvalidDataError: a schema that cannot be decoded.
            ClosedError: the client is closed.
        """
        path, command = _descriptor_parts("get_flight_info", descriptor)
        return _info(self._get_flight_info(path, command, timeout))

    def do_put(
        self,
        descriptor: Union[FlightDescriptor, str],
        batches: Sequence[DeviceRecordBatch],
        *,
        schema: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> List[bytes]:
        """``DoPut`` of ``batches`` (device record batches, on any context) under the
        flight ``descriptor`` (a ``str`` is a one-part path): returns the
        ``app_metadata`` of each ``PutResult`` the server answered with, once it has
        answered the whole stream.

        ``schema`` (a pyarrow ``Schema`` or any ``__arrow_c_schema__`` object) is the
        stream's; left out, the first batch's. An empty ``batches`` with a ``schema``
        sends a stream of the schema alone. Each batch is copied to the host (through
        pinned memory, one download ahead of the one being sent; a flat batch
        larger than 4 MiB about 4 MiB of rows at a time) and encoded by arrow-rs;
        dictionary-encoded columns travel as dictionary batches.

        Raises:
            InvalidArgumentError: no batches and no schema, or a batch of another schema.
            FlightError: the server's refusal (``FlightUnauthenticatedError``, ...), a
                broken stream; ``FlightTimedOutError`` past ``timeout`` seconds.
            ClosedError: the client is closed.
        """
        path, command = _descriptor_parts("do_put", descriptor)
        return self._do_put(path, command, list(batches), schema, timeout)

    def do_exchange(
        self,
        descriptor: Union[FlightDescriptor, str],
        batches: Sequence[DeviceRecordBatch],
        ctx: Context,
        *,
        schema: Optional[Any] = None,
        timeout: Optional[float] = None,
    ) -> FlightBatches:
        """``DoExchange`` under the flight ``descriptor`` (a ``str`` is a one-part path):
        sends ``batches`` as :meth:`do_put` does and lands the server's answer on the
        device of ``ctx`` as :meth:`do_get` does: every answer batch, in order, once the
        server has ended its stream. ``schema`` is the sent stream's, as for
        :meth:`do_put`; the answer's schema is :attr:`FlightBatches.schema`.

        Raises:
            InvalidArgumentError: no batches and no schema, or a batch of another schema.
            FlightError: the server's refusal (``FlightUnauthenticatedError``, ...), a
                broken stream, an answer message over ``max_message_size``;
                ``FlightTimedOutError`` past ``timeout`` seconds.
            InvalidDataError: the server answered bytes that are no valid Flight stream.
            UnsupportedError: an answer with delta dictionary batches.
            ClosedError: the client is closed.
        """
        path, command = _descriptor_parts("do_exchange", descriptor)
        answer_schema, answer = self._do_exchange(path, command, list(batches), ctx, schema, timeout)
        return FlightBatches(answer, answer_schema)

    def list_flights(
        self, criteria: Union[bytes, str] = b"", *, timeout: Optional[float] = None
    ) -> List[FlightInfo]:
        """``ListFlights``: every flight the server lists for ``criteria`` (opaque to
        Flight; cudabuf's server ignores it and lists all).

        Raises:
            FlightError: the server's refusal; ``FlightTimedOutError`` past ``timeout``.
            InvalidDataError: a schema that cannot be decoded.
            ClosedError: the client is closed.
        """
        raw = self._list_flights(_as_bytes("list_flights", "criteria", criteria), timeout)
        return [_info(r) for r in raw]

    def __enter__(self) -> FlightClient:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()


def do_get_to_device(
    location: str,
    ticket: Union[bytes, str],
    ctx: Context,
    *,
    token: Optional[str] = None,
    timeout: Optional[float] = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
) -> FlightBatches:
    """Connect to ``location``, ``DoGet`` ``ticket`` into the device of ``ctx`` and
    close: :meth:`FlightClient.do_get` in one call. ``timeout`` bounds the connection and
    the call, each.

    Raises:
        What :class:`FlightClient` and :meth:`FlightClient.do_get` raise.
    """
    connect_timeout = 10.0 if timeout is None else timeout
    with FlightClient(
        location, token=token, max_message_size=max_message_size, connect_timeout=connect_timeout
    ) as client:
        return client.do_get(ticket, ctx, timeout=timeout)


class FlightServer(_FlightServer):
    """A Flight server of device record batches, for Flight clients such as
    pyarrow.flight's and :class:`FlightClient`.

    ``FlightServer(ctx, *, token=None, host="127.0.0.1", port=0,
    max_message_size=DEFAULT_MAX_MESSAGE_SIZE)`` listens at once (``port=0``: a free port,
    see :attr:`port` and :attr:`location`) and serves from a tokio runtime of its own,
    in the background, until :meth:`shutdown` (or the end of a ``with`` block):

    - ``DoGet``: the ticket is a key; each batch is copied to the host (through pinned
      memory) and encoded by arrow-rs, in messages of about 2 MiB of body at most;
    - ``DoPut``: the stream lands on the device of ``ctx`` (bodies staged in pinned
      memory, uploaded while the next arrives), kept under its descriptor's key (a path
      ``["a", "b"]`` is ``b"a/b"``, a command its bytes), replacing what was there; read
      it with :meth:`get`;
    - ``GetFlightInfo``, ``GetSchema``, ``ListFlights``: one endpoint per flight, whose
      ticket is the key;
    - ``DoExchange``: each batch received lands on the device of ``ctx`` and is sent
      back as it came (an echo); a stream of a schema alone is answered with that
      schema. ``Handshake`` and actions are ``UNIMPLEMENTED``.

    With a ``token``, every call must carry ``authorization: Bearer <token>``
    (``UNAUTHENTICATED`` otherwise). There is no TLS: the token crosses the network in
    clear text, so serve on loopback or a trusted network. ``max_message_size`` bounds one
    incoming ``DoPut`` message (``RESOURCE_EXHAUSTED`` beyond it).

    Raises:
        FlightUnavailableError: the server cannot listen on ``host:port``.
        InvalidArgumentError: an empty or non-ASCII token, a ``max_message_size`` below 1.
    """

    def insert(
        self, key: Union[bytes, str], batches: Sequence[DeviceRecordBatch], schema: Optional[Any] = None
    ) -> None:
        """Serve ``batches`` (device record batches, on any context) under ``key``
        (``str`` as UTF-8), replacing what was there. ``schema`` (a pyarrow ``Schema`` or
        any ``__arrow_c_schema__`` object) is the flight's; left out, the first batch's.
        The server shares the batches' device memory (no copy).

        Raises:
            InvalidArgumentError: no batches and no schema, or a batch of another schema.
            ClosedError: the server was shut down.
        """
        self._insert(_as_bytes("FlightServer.insert", "key", key), list(batches), schema)

    def get(self, key: Union[bytes, str]) -> Optional[FlightBatches]:
        """The flight under ``key`` (inserted, or landed by a ``DoPut``), or ``None``:
        its batches share device memory with the server's.

        Raises:
            ClosedError: the server was shut down.
        """
        found = self._get(_as_bytes("FlightServer.get", "key", key))
        return None if found is None else FlightBatches(found[1], found[0])

    def remove(self, key: Union[bytes, str]) -> Optional[FlightBatches]:
        """Take the flight under ``key`` out of the server (``None`` if there is none).

        Raises:
            ClosedError: the server was shut down.
        """
        found = self._remove(_as_bytes("FlightServer.remove", "key", key))
        return None if found is None else FlightBatches(found[1], found[0])

    def __enter__(self) -> FlightServer:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.shutdown()
