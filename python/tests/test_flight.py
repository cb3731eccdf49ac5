"""cudabuf.flight on the simulator, over loopback gRPC: the cudabuf client (DoGet, DoPut,
DoExchange) against the cudabuf server and against a pyarrow.flight server,
pyarrow.flight's client (DoGet, DoPut) against the cudabuf server; dictionary columns; bearer tokens, bad locations, typed errors, shutdown while a
client reads, several threads at once, Ctrl-C and timeouts; nothing left allocated."""

from __future__ import annotations

import _thread
import gc
import os
import signal
import threading
import time
import warnings
from typing import Any, Iterator, List

import numpy as np
import pyarrow as pa
import pytest

import cudabuf
from cudabuf import cuda, flight, sim

# pip's pyarrow wheels ship pyarrow.flight; a pyarrow built without it skips this module.
pa_flight = pytest.importorskip("pyarrow.flight", reason="pyarrow.flight is not available in this pyarrow build")


def sample_table(rows: int = 3000) -> pa.Table:
    rng = np.random.default_rng(11)
    mask = rng.random(rows) < 0.1
    return pa.table(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "score": pa.array(rng.random(rows), mask=mask),
            "name": pa.array([f"row-{i}" if i % 7 else None for i in range(rows)]),
            "tags": pa.array([[i, i + 1] if i % 5 else [] for i in range(rows)], type=pa.list_(pa.int16())),
        }
    )


def to_device(batch: pa.RecordBatch, ctx: cuda.Context) -> cuda.DeviceRecordBatch:
    return cuda.read_record_batch(cuda.serialize_record_batch(batch, ctx), batch.schema)


def device_batches(table: pa.Table, ctx: cuda.Context, chunk: int = 1000) -> List[cuda.DeviceRecordBatch]:
    return [to_device(b, ctx) for b in table.to_batches(max_chunksize=chunk)]


def big_table(mib: int) -> pa.Table:
    rows = (mib << 20) // 8
    return pa.table({"v": pa.array(np.arange(rows, dtype=np.int64))})


def pyarrow_put(client: Any, descriptor: Any, table: pa.Table, options: Any = None, max_chunksize: Any = None) -> None:
    """``DoPut`` of ``table`` with pyarrow.flight's client (its schema alone when it has no
    rows). The writer and reader are dropped before this returns or raises: pyarrow 21
    keeps the call open until they are, which a server's graceful shutdown waits for."""
    writer, reader = client.do_put(descriptor, table.schema, options or pa_flight.FlightCallOptions())
    try:
        if table.num_rows:
            writer.write_table(table, max_chunksize=max_chunksize)
        writer.close()
    finally:
        del writer, reader


@pytest.fixture
def sim_ctx(cudabuf_sim: sim.Simulator) -> cuda.Context:
    """Device 0 of a fresh simulator, checked for leaks and races after the test."""
    return cudabuf_sim.context(0)


class PyarrowServer(pa_flight.FlightServerBase):  # type: ignore[misc]
    """A pyarrow.flight server of host tables (plain or LZ4 bodies), with a ticket that
    stalls until ``release`` is set."""

    def __init__(self, tables: dict[bytes, pa.Table], compression: Any = None) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.tables = tables
        self.options = pa.ipc.IpcWriteOptions(compression=compression)
        self.release = threading.Event()

    def do_get(self, context: Any, ticket: Any) -> Any:
        if ticket.ticket == b"stall":
            self.release.wait(30)
            raise pa_flight.FlightCancelledError("released")
        table = self.tables.get(ticket.ticket)
        if table is None:
            raise KeyError(ticket.ticket)
        return pa_flight.RecordBatchStream(table, options=self.options)

    def get_flight_info(self, context: Any, descriptor: Any) -> Any:
        key = b"/".join(descriptor.path)
        table = self.tables[key]
        endpoint = pa_flight.FlightEndpoint(key, [f"grpc://127.0.0.1:{self.port}"])
        return pa_flight.FlightInfo(table.schema, descriptor, [endpoint], table.num_rows, table.nbytes)

    def list_flights(self, context: Any, criteria: Any) -> Iterator[Any]:
        for key in sorted(self.tables):
            yield self.get_flight_info(context, pa_flight.FlightDescriptor.for_path(key))


@pytest.fixture
def pyarrow_server() -> Iterator[PyarrowServer]:
    server = PyarrowServer({b"numbers": sample_table(), b"empty": sample_table(0)})
    yield server
    server.release.set()
    server.shutdown()


def test_client_gets_what_the_server_serves(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        server.insert("numbers", device_batches(table, sim_ctx))
        server.insert(b"schema-only", [], schema=table.schema)
        assert server.keys() == [b"numbers", b"schema-only"]
        assert server.location == f"grpc://127.0.0.1:{server.port}" and server.port > 0
        with flight.FlightClient(server.location) as client:
            batches = client.do_get("numbers", sim_ctx)
            again = client.do_get(b"numbers", sim_ctx)
            empty = client.do_get("schema-only", sim_ctx)
        assert client.closed
    assert isinstance(batches, flight.FlightBatches) and isinstance(batches, list)
    assert [b.num_rows for b in batches] == [1000, 1000, 1000]
    assert all(isinstance(b, cuda.DeviceRecordBatch) for b in batches)
    assert batches.schema.equals(table.schema)
    for got, sent in zip(batches, table.to_batches(max_chunksize=1000)):
        assert got.to_host().equals(sent)
        schema_capsule, array_capsule = got.__arrow_c_device_array__()
        assert type(schema_capsule).__name__ == "PyCapsule" and type(array_capsule).__name__ == "PyCapsule"
        assert got.context.device_number == 0
    assert batches.to_host().equals(table)
    assert again.to_host().equals(table)
    assert empty == [] and empty.schema.equals(table.schema)
    assert empty.to_host().num_rows == 0


def test_nothing_is_left_allocated(sim_ctx: cuda.Context) -> None:
    baseline = sim_ctx.bytes_allocated
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        server.insert("t", device_batches(table, sim_ctx))
        served = sim_ctx.bytes_allocated
        assert served > baseline
        with flight.FlightClient(server.location) as client:
            for _ in range(3):
                got = client.do_get("t", sim_ctx)
                assert got.to_host().equals(table)
                assert sim_ctx.bytes_allocated > served  # the client's copy lives on the device
                del got
                gc.collect()
                assert sim_ctx.bytes_allocated == served
        pa_client = pa_flight.connect(server.location)
        pyarrow_put(pa_client, pa_flight.FlightDescriptor.for_path("up"), table, max_chunksize=700)
        pa_client.close()
        assert server.get("up") is not None
    # shutdown dropped the server's flights, the one DoPut landed included
    gc.collect()
    assert sim_ctx.bytes_allocated == baseline


def test_pyarrow_client_gets_from_the_cudabuf_server(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        server.insert("numbers", device_batches(table, sim_ctx))
        client = pa_flight.connect(server.location)
        try:
            got = client.do_get(pa_flight.Ticket(b"numbers")).read_all()
            assert got.equals(table)
            infos = list(client.list_flights())
            assert [i.descriptor.path for i in infos] == [[b"numbers"]]
            assert infos[0].total_records == table.num_rows
            assert infos[0].schema.equals(table.schema)
            assert [e.ticket.ticket for e in infos[0].endpoints] == [b"numbers"]
            schema = client.get_schema(pa_flight.FlightDescriptor.for_path("numbers")).schema
            assert schema.equals(table.schema)
            with pytest.raises(KeyError):  # pyarrow's error for NOT_FOUND
                client.do_get(pa_flight.Ticket(b"nothing")).read_all()
        finally:
            client.close()


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_pyarrow_client_puts_into_device_memory(sim_ctx: cuda.Context, compression: Any) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        client = pa_flight.connect(server.location)
        options = pa_flight.FlightCallOptions(write_options=pa.ipc.IpcWriteOptions(compression=compression))
        try:
            pyarrow_put(client, pa_flight.FlightDescriptor.for_path("dir", "up"), table, options, max_chunksize=800)
            no_rows = table.slice(0, 0)
            pyarrow_put(client, pa_flight.FlightDescriptor.for_command(b"\xff\x00cmd"), no_rows, options)
        finally:
            client.close()
        assert server.keys() == [b"dir/up", b"\xff\x00cmd"]  # in byte order
        landed = server.get("dir/up")
        assert landed is not None
        assert [b.num_rows for b in landed] == [800, 800, 800, 600]
        assert all(b.context.device_number == 0 for b in landed)
        assert landed.to_host().equals(table)
        schema_only = server.get(b"\xff\x00cmd")
        assert schema_only == [] and schema_only is not None and schema_only.schema.equals(table.schema)
        # What pyarrow put, the cudabuf client gets back, device to device.
        with flight.FlightClient(server.location) as cb:
            assert cb.do_get("dir/up", sim_ctx).to_host().equals(table)
            info = cb.get_flight_info(flight.FlightDescriptor.for_path("dir", "up"))
        assert info.total_records == table.num_rows
        assert info.descriptor == flight.FlightDescriptor.for_path("dir", "up")
        assert info.endpoints == (flight.FlightEndpoint(b"dir/up"),)
        removed = server.remove("dir/up")
        assert removed is not None and removed.to_host().equals(table)
        assert server.get("dir/up") is None and server.remove("dir/up") is None


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_client_gets_from_a_pyarrow_server(sim_ctx: cuda.Context, compression: Any) -> None:
    table = sample_table()
    server = PyarrowServer({b"numbers": table, b"empty": table.slice(0, 0)}, compression)
    try:
        with flight.FlightClient(f"grpc+tcp://127.0.0.1:{server.port}") as client:
            got = client.do_get("numbers", sim_ctx)
            assert got.to_host().equals(table)
            assert got.schema.equals(table.schema)
            empty = client.do_get("empty", sim_ctx)
            assert empty.to_host().num_rows == 0 and empty.schema.equals(table.schema)
            info = client.get_flight_info("numbers")
            assert info.schema.equals(table.schema)
            assert info.total_records == table.num_rows and info.total_bytes == table.nbytes
            assert info.descriptor == flight.FlightDescriptor.for_path("numbers")
            assert info.endpoints == (flight.FlightEndpoint(b"numbers", (f"grpc://127.0.0.1:{server.port}",)),)
            listed = client.list_flights()
            assert [i.descriptor.path for i in listed if i.descriptor] == [("empty",), ("numbers",)]
            # The endpoint's ticket fetches the flight, from the location it names.
            endpoint = info.endpoints[0]
            again = flight.do_get_to_device(endpoint.locations[0], endpoint.ticket, sim_ctx, timeout=30)
            assert again.to_host().equals(table)
            with pytest.raises(cudabuf.FlightError) as raised:
                client.do_get("nothing", sim_ctx)
            assert raised.value.code != 0 and isinstance(raised.value, cudabuf.CudaError)
    finally:
        server.shutdown()


def test_bearer_token(sim_ctx: cuda.Context) -> None:
    table = sample_table(100)
    with flight.FlightServer(sim_ctx, token="s3cret") as server:
        server.insert("t", device_batches(table, sim_ctx))
        for token in (None, "wrong", "s3cre", "s3cret2"):
            with flight.FlightClient(server.location, token=token) as client:
                with pytest.raises(flight.FlightUnauthenticatedError) as raised:
                    client.do_get("t", sim_ctx)
                assert raised.value.code == 16 and raised.value.code_name == "UNAUTHENTICATED"
                assert raised.value.kind == "Flight"
                with pytest.raises(cudabuf.FlightUnauthenticatedError):
                    client.get_flight_info("t")
                with pytest.raises(cudabuf.FlightUnauthenticatedError):
                    client.list_flights()
        with flight.FlightClient(server.location, token="s3cret") as client:
            assert client.do_get("t", sim_ctx).to_host().equals(table)
            assert [i.descriptor for i in client.list_flights()] == [flight.FlightDescriptor.for_path("t")]
        # pyarrow.flight: the token as a header, or refused.
        pa_client = pa_flight.connect(server.location)
        try:
            with pytest.raises(pa_flight.FlightUnauthenticatedError):
                pa_client.do_get(pa_flight.Ticket(b"t")).read_all()
            with pytest.raises(pa_flight.FlightUnauthenticatedError):
                pyarrow_put(pa_client, pa_flight.FlightDescriptor.for_path("sneaky"), table)
            options = pa_flight.FlightCallOptions(headers=[(b"authorization", b"Bearer s3cret")])
            assert pa_client.do_get(pa_flight.Ticket(b"t"), options).read_all().equals(table)
        finally:
            pa_client.close()
        assert server.keys() == [b"t"]  # the refused DoPut landed nothing
    for bad in ("", "new\nline", "caf\u00e9"):
        with pytest.raises(cudabuf.InvalidArgumentError):
            flight.FlightClient("grpc://127.0.0.1:1", token=bad)
        with pytest.raises(cudabuf.InvalidArgumentError):
            flight.FlightServer(sim_ctx, token=bad)


def test_bad_locations() -> None:
    for location in ("http://127.0.0.1:1", "127.0.0.1:1", "grpc://", "grpc://host:1/path", "ftp://x:1"):
        with pytest.raises(cudabuf.InvalidArgumentError):
            flight.FlightClient(location)
    for location in ("grpc+tls://127.0.0.1:1", "grpc+unix:///tmp/socket"):
        with pytest.raises(cudabuf.UnsupportedError):
            flight.FlightClient(location)
    # Nothing listens on port 1: refused at once.
    with pytest.raises(flight.FlightUnavailableError) as raised:
        flight.FlightClient("grpc://127.0.0.1:1")
    assert raised.value.code == 14 and raised.value.code_name == "UNAVAILABLE"
    with pytest.raises(cudabuf.InvalidArgumentError):
        flight.FlightClient("grpc://127.0.0.1:1", max_message_size=0)
    with pytest.raises(cudabuf.InvalidArgumentError):
        flight.FlightClient("grpc://127.0.0.1:1", connect_timeout=-1)
    with pytest.raises(flight.FlightUnavailableError):
        flight.FlightClient("grpc://127.0.0.1:1", connect_timeout=1e15)


def test_errors_are_typed(sim_ctx: cuda.Context) -> None:
    table = sample_table(100)
    with flight.FlightServer(sim_ctx) as server:
        with pytest.raises(cudabuf.InvalidArgumentError):
            server.insert("none", [])  # no batches, no schema
        other = to_device(pa.record_batch([pa.array([1.5])], names=["f"]), sim_ctx)
        with pytest.raises(cudabuf.InvalidArgumentError):
            server.insert("mixed", [to_device(table.to_batches()[0], sim_ctx), other])
        with pytest.raises(cudabuf.InvalidTypeError):
            server.insert(3, [other])  # type: ignore[arg-type]
        server.insert("small", device_batches(table, sim_ctx, chunk=100))
        with flight.FlightClient(server.location) as client:
            with pytest.raises(flight.FlightNotFoundError) as raised:
                client.do_get("nothing", sim_ctx)
            assert raised.value.code == 5 and "nothing" in str(raised.value)
            assert isinstance(raised.value, KeyError) and str(raised.value).startswith("Flight call failed")
            with pytest.raises(flight.FlightNotFoundError):
                client.get_flight_info(flight.FlightDescriptor.for_command(b"nothing"))
            with pytest.raises(cudabuf.InvalidTypeError):
                client.do_get(5, sim_ctx)  # type: ignore[arg-type]
            for bad in (0, -1.0, float("nan"), float("inf"), 1e300):
                with pytest.raises(cudabuf.InvalidArgumentError):
                    client.do_get("small", sim_ctx, timeout=bad)
            # A huge but valid timeout is no limit in practice (and no overflow).
            assert client.do_get("small", sim_ctx, timeout=1e15).to_host().equals(table)
        # A message over the client's limit: refused before it is allocated.
        with flight.FlightClient(server.location, max_message_size=256) as client:
            assert client.max_message_size == 256
            with pytest.raises(cudabuf.FlightError) as raised:
                client.do_get("small", sim_ctx)
            assert raised.value.code_name in ("RESOURCE_EXHAUSTED", "OUT_OF_RANGE")
    # A DoPut message over the server's limit.
    with flight.FlightServer(sim_ctx, max_message_size=1024) as server:
        assert server.max_message_size == 1024
        client = pa_flight.connect(server.location)
        try:
            with pytest.raises(pa.ArrowException):
                pyarrow_put(client, pa_flight.FlightDescriptor.for_path("big"), table)
        finally:
            client.close()
        assert server.keys() == []
    with pytest.raises(cudabuf.InvalidArgumentError):
        flight.FlightDescriptor()
    with pytest.raises(cudabuf.InvalidArgumentError):
        flight.FlightDescriptor(path=("a",), command=b"b")
    assert flight.FlightDescriptor.for_path("a", b"b").key == b"a/b"
    assert flight.FlightDescriptor.for_command("c").descriptor_type == "cmd"
    assert flight.DEFAULT_MAX_MESSAGE_SIZE == 64 << 20


def test_closed_client_and_server(sim_ctx: cuda.Context) -> None:
    server = flight.FlightServer(sim_ctx)
    server.insert("t", device_batches(sample_table(10), sim_ctx))
    client = flight.FlightClient(server.location)
    client.close()
    client.close()
    with pytest.raises(cudabuf.ClosedError):
        client.do_get("t", sim_ctx)
    assert "closed" in repr(client)
    location = server.location
    server.shutdown()
    server.shutdown()  # idempotent
    assert server.closed
    for call in (lambda: server.keys(), lambda: server.get("t"), lambda: server.insert("t", [], schema=pa.schema([]))):
        with pytest.raises(cudabuf.ClosedError):
            call()
    # Nobody listens there any more.
    with pytest.raises(flight.FlightUnavailableError):
        flight.FlightClient(location, connect_timeout=5)
    for bad in (-1.0, float("nan"), float("inf"), 1e300):
        with pytest.raises(cudabuf.InvalidArgumentError):
            flight.FlightServer(sim_ctx).shutdown(grace=bad)
    for port in (-1, 65536):
        with pytest.raises(cudabuf.InvalidArgumentError):
            flight.FlightServer(sim_ctx, port=port)


def test_a_port_in_use_is_an_error(sim_ctx: cuda.Context) -> None:
    with flight.FlightServer(sim_ctx) as server:
        with pytest.raises(flight.FlightUnavailableError):
            flight.FlightServer(sim_ctx, port=server.port)


def test_shutdown_while_a_cudabuf_client_reads(sim_ctx: cuda.Context) -> None:
    baseline = sim_ctx.bytes_allocated
    table = big_table(16)
    server = flight.FlightServer(sim_ctx)
    server.insert("big", device_batches(table, sim_ctx, chunk=table.num_rows // 8))
    outcomes: List[str] = []
    started = threading.Event()

    def read() -> None:
        try:
            with flight.FlightClient(server.location) as client:
                for _ in range(50):
                    started.set()
                    got = client.do_get("big", sim_ctx, timeout=60)
                    assert got.to_host().equals(table)
                    outcomes.append("complete")
        except cudabuf.FlightError as e:
            outcomes.append(f"FlightError {e.code_name}")
        except BaseException as e:  # reported below
            outcomes.append(f"unexpected {type(e).__name__}: {e}")

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(30)
    time.sleep(0.2)
    t0 = time.monotonic()
    server.shutdown(grace=0)
    assert time.monotonic() - t0 < 10
    reader.join(60)
    assert not reader.is_alive()
    # Every read either got the whole flight or failed with a FlightError; the last one
    # (cut by the shutdown or refused a connection) failed.
    assert outcomes and outcomes[-1].startswith("FlightError"), outcomes
    assert all(o == "complete" or o.startswith("FlightError") for o in outcomes), outcomes
    gc.collect()
    assert sim_ctx.bytes_allocated == baseline


def test_shutdown_while_a_pyarrow_client_reads(sim_ctx: cuda.Context) -> None:
    table = big_table(64)
    server = flight.FlightServer(sim_ctx)
    server.insert("big", device_batches(table, sim_ctx, chunk=table.num_rows // 16))
    client = pa_flight.connect(server.location)
    try:
        reader = client.do_get(pa_flight.Ticket(b"big"))
        first = reader.read_chunk()  # the stream is open, most of it unread
        assert first.data.num_rows > 0
        t0 = time.monotonic()
        server.shutdown(grace=0.2)
        assert time.monotonic() - t0 < 10
        with pytest.raises(pa.ArrowException):
            reader.read_all()
    finally:
        client.close()


def test_threads_get_at_once(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        server.insert("t", device_batches(table, sim_ctx))
        shared = flight.FlightClient(server.location)
        results: List[bool] = []
        errors: List[BaseException] = []

        def work(i: int) -> None:
            try:
                own = flight.FlightClient(server.location) if i % 2 else None
                for _ in range(5):
                    got = (own or shared).do_get("t", sim_ctx, timeout=60)
                    results.append(got.to_host().equals(table))
                if own is not None:
                    own.close()
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        shared.close()
        assert not errors, errors
        assert results == [True] * 40


def test_calls_release_the_gil(sim_ctx: cuda.Context) -> None:
    # The pyarrow server's handler needs the GIL while the cudabuf client waits for it:
    # with the GIL held, this would deadlock; released, a counter runs meanwhile too.
    server = PyarrowServer({b"big": big_table(8)})
    stop = threading.Event()
    ticks = [0]

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    try:
        with flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as client:
            before = ticks[0]
            got = client.do_get("big", sim_ctx, timeout=60)
            progressed = ticks[0] - before
        assert sum(b.num_rows for b in got) == (8 << 20) // 8
        assert progressed > 1000
    finally:
        stop.set()
        counter.join()
        server.shutdown()


def test_timeout_and_ctrl_c_end_a_stalled_call(sim_ctx: cuda.Context, pyarrow_server: PyarrowServer) -> None:
    with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_server.port}") as client:
        t0 = time.monotonic()
        with pytest.raises(flight.FlightTimedOutError) as raised:
            client.do_get("stall", sim_ctx, timeout=0.3)
        assert 0.25 < time.monotonic() - t0 < 10
        assert raised.value.code == 4 and raised.value.code_name == "DEADLINE_EXCEEDED"
        # Ctrl-C: a KeyboardInterrupt in the main thread ends the wait. The interrupt is
        # repeated every 0.5 s until the wait has ended (one that lands between two
        # bytecodes of the test rather than in the wait is still a KeyboardInterrupt).
        # Python's own SIGINT handler is installed for this half: a process started with
        # SIGINT ignored (a background job of a non-interactive shell) keeps SIG_IGN, and
        # there `_thread.interrupt_main()` does nothing, as a real Ctrl-C does nothing.
        previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            waited = threading.Event()

            def interrupt_until_waited() -> None:
                while not waited.wait(0.5):
                    _thread.interrupt_main()

            interrupter = threading.Thread(target=interrupt_until_waited, daemon=True)
            t0 = time.monotonic()
            interrupter.start()
            try:
                with pytest.raises(KeyboardInterrupt):
                    client.do_get("stall", sim_ctx)
            finally:
                waited.set()
            assert time.monotonic() - t0 < 10
            try:
                interrupter.join()
                time.sleep(0.05)  # an interrupt sent just before `waited` was set lands here
            except KeyboardInterrupt:
                pass
        finally:
            signal.signal(signal.SIGINT, previous_handler)
        # The client still works after both.
        assert client.do_get("numbers", sim_ctx).to_host().equals(sample_table())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
def test_a_client_and_server_made_before_fork_refuse_in_the_child(sim_ctx: cuda.Context) -> None:
    with flight.FlightServer(sim_ctx) as server:
        client = flight.FlightClient(server.location)
        read_end, write_end = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            outcome = b"worked"
            try:
                for call in (lambda: client.do_get("t", sim_ctx), server.keys):
                    try:
                        call()
                        outcome = b"worked"
                        break
                    except cudabuf.UnsupportedError as e:
                        outcome = b"refused" if "fork()" in str(e) else str(e).encode()
            except BaseException as e:
                outcome = f"{type(e).__name__}: {e}".encode()
            os.write(write_end, outcome)
            os._exit(0)
        os.close(write_end)
        outcome = os.read(read_end, 4096)
        os.close(read_end)
        os.waitpid(pid, 0)
        assert outcome == b"refused"
        client.close()


class PyarrowPeer(pa_flight.FlightServerBase):  # type: ignore[misc]
    """A pyarrow.flight server that keeps what ``DoPut`` sends (answering one
    ``PutResult`` with the row count) and answers ``DoExchange``: command ``echo`` with
    what it got, command ``count`` with one row per received batch; path ``stall`` waits
    for ``release``."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.received: dict[bytes, pa.Table] = {}
        self.release = threading.Event()

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        if descriptor.path == [b"stall"]:
            self.release.wait(30)
            return
        table = reader.read_all()
        self.received[b"/".join(descriptor.path)] = table
        writer.write(pa.py_buffer(f"rows={table.num_rows}".encode()))

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        batches = [chunk.data for chunk in reader]
        if descriptor.command == b"count":
            answer = pa.table({"rows": pa.array([b.num_rows for b in batches], pa.int64())})
        else:
            answer = pa.Table.from_batches(batches, schema=reader.schema)
        writer.begin(answer.schema)
        writer.write_table(answer)


@pytest.fixture
def pyarrow_peer() -> Iterator[PyarrowPeer]:
    server = PyarrowPeer()
    yield server
    server.release.set()
    server.shutdown()


def test_do_put_into_the_cudabuf_server(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server, flight.FlightClient(server.location) as client:
        results = client.do_put("up", device_batches(table, sim_ctx, chunk=700), timeout=60)
        assert results == [b""]  # cudabuf's server answers one empty PutResult
        got = server.get("up")
        assert got is not None and [b.num_rows for b in got] == [700, 700, 700, 700, 200]
        assert got.to_host().equals(table)
        # Descriptors: a path of several parts is the key a/b, a command its bytes.
        client.do_put(flight.FlightDescriptor.for_path("a", "b"), device_batches(table, sim_ctx))
        client.do_put(flight.FlightDescriptor.for_command(b"cmd"), device_batches(table, sim_ctx))
        # A schema alone.
        assert client.do_put("empty", [], schema=table.schema) == [b""]
        empty = server.get("empty")
        assert empty == [] and empty is not None and empty.schema.equals(table.schema)
        assert server.keys() == [b"a/b", b"cmd", b"empty", b"up"]
        assert server.get("a/b").to_host().equals(table)  # type: ignore[union-attr]
        assert server.get("cmd").to_host().equals(table)  # type: ignore[union-attr]
        # Bad input: typed errors, nothing sent.
        with pytest.raises(cudabuf.InvalidArgumentError, match="no batches and no schema"):
            client.do_put("nothing", [])
        other = device_batches(pa.table({"x": pa.array([1, 2], pa.int32())}), sim_ctx)
        with pytest.raises(cudabuf.InvalidArgumentError, match="batch 1's schema differs"):
            client.do_put("mixed", device_batches(table, sim_ctx)[:1] + other)
        with pytest.raises(cudabuf.InvalidArgumentError, match="batch 0's schema differs"):
            client.do_put("mixed", other, schema=table.schema)
        with pytest.raises(cudabuf.InvalidTypeError):
            client.do_put(b"bytes", other)  # type: ignore[arg-type]
        with pytest.raises(cudabuf.InvalidArgumentError):
            client.do_put("t", other, timeout=-1)
        assert server.keys() == [b"a/b", b"cmd", b"empty", b"up"]


def test_do_put_into_a_pyarrow_server(sim_ctx: cuda.Context, pyarrow_peer: PyarrowPeer) -> None:
    table = sample_table()
    with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_peer.port}") as client:
        results = client.do_put("up", device_batches(table, sim_ctx), timeout=60)
        assert results == [b"rows=3000"]
        assert pyarrow_peer.received[b"up"].equals(table)
        assert client.do_put("empty", [], schema=table.schema) == [b"rows=0"]
        received = pyarrow_peer.received[b"empty"]
        assert received.num_rows == 0 and received.schema.equals(table.schema)


def test_do_exchange_with_the_cudabuf_server_echoes(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server, flight.FlightClient(server.location) as client:
        answer = client.do_exchange(
            flight.FlightDescriptor.for_command("echo"), device_batches(table, sim_ctx), sim_ctx, timeout=60
        )
        assert isinstance(answer, flight.FlightBatches)
        assert [b.num_rows for b in answer] == [1000, 1000, 1000]
        assert all(b.context.device_number == 0 for b in answer)
        assert answer.schema.equals(table.schema)
        assert answer.to_host().equals(table)
        # A schema alone is answered with that schema and no batch.
        empty = client.do_exchange("e", [], sim_ctx, schema=table.schema)
        assert empty == [] and empty.schema.equals(table.schema)
        assert server.keys() == []  # an exchange keeps nothing
        with pytest.raises(cudabuf.InvalidArgumentError, match="no batches and no schema"):
            client.do_exchange("e", [], sim_ctx)


def test_do_exchange_with_a_pyarrow_server(sim_ctx: cuda.Context, pyarrow_peer: PyarrowPeer) -> None:
    table = sample_table()
    with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_peer.port}") as client:
        sent = device_batches(table, sim_ctx, chunk=700)
        echoed = client.do_exchange(flight.FlightDescriptor.for_command("echo"), sent, sim_ctx, timeout=60)
        assert echoed.to_host().equals(table)
        counted = client.do_exchange(flight.FlightDescriptor.for_command("count"), sent, sim_ctx, timeout=60)
        assert counted.schema.equals(pa.schema([("rows", pa.int64())]))
        assert counted.to_host().column("rows").to_pylist() == [700, 700, 700, 700, 200]


def dictionary_table() -> pa.Table:
    return pa.table(
        {
            "d": pa.array(["a", "b", "a", None] * 25).dictionary_encode(),
            "n": pa.array(np.arange(100, dtype=np.int32)),
        }
    )


def test_dictionary_columns_round_trip_both_ways(sim_ctx: cuda.Context, pyarrow_peer: PyarrowPeer) -> None:
    table = dictionary_table()
    with flight.FlightServer(sim_ctx) as ours:
        # pyarrow.flight's client into the cudabuf server: the batches land on the device.
        pa_client = pa_flight.connect(ours.location)
        try:
            pyarrow_put(pa_client, pa_flight.FlightDescriptor.for_path("dict"), table, max_chunksize=40)
            assert pa_client.do_get(pa_flight.Ticket(b"dict")).read_all().equals(table)
        finally:
            pa_client.close()
        landed = ours.get("dict")
        assert landed is not None and landed.to_host().equals(table)
        on_device = list(landed)
        with flight.FlightClient(ours.location) as client:
            # cudabuf to cudabuf: DoGet, DoPut, DoExchange.
            got = client.do_get("dict", sim_ctx)
            assert got.schema.equals(table.schema) and got.to_host().equals(table)
            client.do_put("again", on_device)
            assert ours.get("again").to_host().equals(table)  # type: ignore[union-attr]
            assert client.do_exchange("x", on_device, sim_ctx).to_host().equals(table)
        # cudabuf's client with a pyarrow.flight server: DoPut, DoExchange, DoGet.
        with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_peer.port}") as client:
            assert client.do_put("dict", on_device) == [b"rows=100"]
            assert pyarrow_peer.received[b"dict"].equals(table)
            echoed = client.do_exchange(flight.FlightDescriptor.for_command("echo"), on_device, sim_ctx)
            assert echoed.to_host().equals(table)
    server = PyarrowServer({b"dict": table})
    try:
        with flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as client:
            assert client.do_get("dict", sim_ctx).to_host().equals(table)
    finally:
        server.shutdown()


@pytest.mark.skipif(
    int(pa.__version__.split(".")[0]) < 26,
    reason=f"pyarrow {pa.__version__}: its Flight server sends no delta dictionary (pyarrow 21 sends "
    "the dictionary whole; checked with 26); the refusal is also tested in Rust (flight/tests/exchange.rs)",
)
def test_delta_dictionaries_are_refused(sim_ctx: cuda.Context) -> None:
    dictionary = pa.array(["a", "b", "c"])
    first = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), dictionary[:2])
    second = pa.DictionaryArray.from_arrays(pa.array([2, 1, 0], pa.int32()), dictionary)
    table = pa.Table.from_batches(
        [pa.record_batch([first], names=["d"]), pa.record_batch([second], names=["d"])]
    )
    # The stream pyarrow writes has a delta dictionary batch (checked, so the test is real).
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)) as w:
        w.write_table(table)
    assert w.stats.num_dictionary_deltas == 1
    server = PyarrowServer({b"delta": table})
    server.options = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    try:
        with flight.FlightClient(f"grpc://127.0.0.1:{server.port}") as client:
            with pytest.raises(cudabuf.UnsupportedError, match="delta dictionary"):
                client.do_get("delta", sim_ctx)
            # The same batches with the dictionary sent whole again (a replacement) land.
            server.options = pa.ipc.IpcWriteOptions()
            assert client.do_get("delta", sim_ctx).to_host().equals(table)
    finally:
        server.shutdown()


def test_put_and_exchange_need_the_token(sim_ctx: cuda.Context) -> None:
    table = sample_table(100)
    with flight.FlightServer(sim_ctx, token="s3cret") as server:
        for token in (None, "wrong"):
            with flight.FlightClient(server.location, token=token) as client:
                with pytest.raises(flight.FlightUnauthenticatedError) as raised:
                    client.do_put("sneaky", device_batches(table, sim_ctx))
                assert raised.value.code == 16
                with pytest.raises(flight.FlightUnauthenticatedError):
                    client.do_exchange("sneaky", device_batches(table, sim_ctx), sim_ctx)
        assert server.keys() == []  # the refused DoPut landed nothing
        with flight.FlightClient(server.location, token="s3cret") as client:
            assert client.do_put("t", device_batches(table, sim_ctx)) == [b""]
            assert client.do_exchange("t", device_batches(table, sim_ctx), sim_ctx).to_host().equals(table)
        assert server.get("t").to_host().equals(table)  # type: ignore[union-attr]


def test_do_put_timeout(sim_ctx: cuda.Context, pyarrow_peer: PyarrowPeer) -> None:
    table = sample_table(100)
    with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_peer.port}") as client:
        t0 = time.monotonic()
        with pytest.raises(flight.FlightTimedOutError) as raised:
            client.do_put("stall", device_batches(table, sim_ctx), timeout=0.3)
        assert 0.25 < time.monotonic() - t0 < 10
        assert raised.value.code == 4
        pyarrow_peer.release.set()
        # The client still works after it.
        assert client.do_put("after", device_batches(table, sim_ctx), timeout=60) == [b"rows=100"]


def test_threads_put_at_once(sim_ctx: cuda.Context) -> None:
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server:
        shared = flight.FlightClient(server.location)
        errors: List[BaseException] = []

        def work(i: int) -> None:
            try:
                own = flight.FlightClient(server.location) if i % 2 else None
                for j in range(4):
                    (own or shared).do_put(f"t{i}-{j}", device_batches(table, sim_ctx, chunk=600), timeout=60)
                if own is not None:
                    own.close()
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        shared.close()
        assert not errors, errors
        assert len(server.keys()) == 32
        for key in server.keys():
            assert server.get(key).to_host().equals(table)  # type: ignore[union-attr]


def test_put_and_exchange_leave_nothing_allocated(sim_ctx: cuda.Context, pyarrow_peer: PyarrowPeer) -> None:
    baseline = sim_ctx.bytes_allocated
    table = sample_table()
    with flight.FlightServer(sim_ctx) as server, flight.FlightClient(server.location) as client:
        sent = device_batches(table, sim_ctx)
        with_sent = sim_ctx.bytes_allocated
        for _ in range(3):
            client.do_put("t", sent)
            answer = client.do_exchange("x", sent, sim_ctx)
            assert answer.to_host().equals(table)
            assert sim_ctx.bytes_allocated > with_sent
            del answer
            gc.collect()
        with flight.FlightClient(f"grpc://127.0.0.1:{pyarrow_peer.port}") as other:
            other.do_put("t", sent)
            assert other.do_exchange(flight.FlightDescriptor.for_command("echo"), sent, sim_ctx).to_host().equals(table)
            gc.collect()
        assert server.remove("t") is not None
        gc.collect()
        assert sim_ctx.bytes_allocated == with_sent
        del sent
        gc.collect()
    gc.collect()
    assert sim_ctx.bytes_allocated == baseline
