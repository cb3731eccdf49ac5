"""Interop of cudabuf-flight with pyarrow.flight, on the simulator, over loopback.

(a) a pyarrow.flight client DoGets from the cudabuf server (`--example serve`) and gets
    exactly the batches it holds; calls without the bearer token are refused;
(b) a pyarrow.flight client DoPuts (plain and LZ4_FRAME bodies) into the cudabuf server,
    whose device batches are read back through a DoGet;
(c) the cudabuf client (`--example get`) DoGets from a pyarrow.flight server (plain and
    LZ4_FRAME bodies) into device memory and writes what landed to an IPC file, compared
    with what the server sent;
(d) dictionary-encoded columns (a new dictionary in each batch: replacements on the
    wire) DoPut by pyarrow into the cudabuf server and DoGet back;
(e) a pyarrow.flight client DoExchanges with the cudabuf server (which echoes what lands
    on its device): plain, LZ4_FRAME and ZSTD bodies, dictionary columns, and a delta
    dictionary, refused with a message that says so;
(f) the cudabuf client (`--example send`) DoPuts device batches (dictionary columns
    included) into a pyarrow.flight server that checks the table it gets, and DoExchanges
    with it (answers plain, LZ4_FRAME, ZSTD, and computed by the server), each answer
    landed on the device and compared.

Run from the repository root: `python3 flight/tests/pyarrow_interop.py`. Every call is
bounded in time; the servers listen on 127.0.0.1 only.
"""

import os
import subprocess
import sys
import tempfile
import threading

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.flight as flight
import pyarrow.ipc as ipc

TOKEN = "interop-token"
CALL_TIMEOUT_S = 20
PROCESS_TIMEOUT_S = 120


def expected_numbers(start, rows):
    ids = list(range(start, start + rows))
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("score", pa.float64()),
            pa.field("name", pa.utf8(), nullable=False),
        ]
    )
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([None if i % 7 == 0 else i * 0.5 for i in ids], pa.float64()),
            pa.array([f"row-{i}" for i in ids], pa.utf8()),
        ],
        schema=schema,
    )


def options(token=TOKEN, write_options=None):
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return flight.FlightCallOptions(
        headers=headers, timeout=CALL_TIMEOUT_S, write_options=write_options
    )


def cargo_example(name, *args):
    return ["cargo", "run", "-q", "-p", "cudabuf-flight", "--example", name, "--", *args]


def start_cudabuf_server():
    proc = subprocess.Popen(
        cargo_example("serve", "--token", TOKEN),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))
    reader.start()
    reader.join(PROCESS_TIMEOUT_S)
    if not line or not line[0].startswith("PORT "):
        proc.kill()
        raise SystemExit(f"the cudabuf server did not start: {line!r}")
    return proc, int(line[0].split()[1])


def check_do_get_from_cudabuf(client):
    got = client.do_get(flight.Ticket(b"numbers"), options()).read_all()
    want = pa.Table.from_batches([expected_numbers(0, 1000), expected_numbers(1000, 24)])
    assert got.equals(want), (got.schema, got.num_rows)
    empty = client.do_get(flight.Ticket(b"empty"), options()).read_all()
    assert empty.num_rows == 0 and empty.schema.equals(want.schema), empty
    info = client.get_flight_info(flight.FlightDescriptor.for_path("numbers"), options())
    assert info.total_records == 1024 and info.schema.equals(want.schema), info
    assert info.endpoints[0].ticket == flight.Ticket(b"numbers")
    listed = sorted(i.descriptor.path[0] for i in client.list_flights(options=options()))
    assert listed[:2] == [b"empty", b"numbers"], listed
    for bad in (None, "wrong-token"):
        try:
            client.do_get(flight.Ticket(b"numbers"), options(token=bad)).read_all()
        except flight.FlightUnauthenticatedError:
            pass
        else:
            raise AssertionError(f"a call with token {bad!r} was admitted")
    print("(a) pyarrow DoGet from the cudabuf server: 1024 rows equal, schema-only flight, auth refused")


def put_table():
    n = 5000
    return pa.table(
        {
            "i32": pa.array(range(n), pa.int32()),
            "text": pa.array([None if i % 5 == 0 else "x" * (i % 13) for i in range(n)]),
            "flag": pa.array([i % 3 == 0 for i in range(n)]),
            "list": pa.array([[j for j in range(i % 4)] for i in range(n)], pa.list_(pa.int64())),
        }
    )


def check_do_put_into_cudabuf(client):
    table = put_table()
    for name, compression in (("plain", None), ("lz4", "lz4")):
        write_options = pa.ipc.IpcWriteOptions(compression=compression)
        descriptor = flight.FlightDescriptor.for_path("uploaded", name)
        writer, _ = client.do_put(
            descriptor, table.schema, options(write_options=write_options)
        )
        writer.write_table(table, max_chunksize=1500)
        writer.close()
        back = client.do_get(flight.Ticket(f"uploaded/{name}".encode()), options()).read_all()
        assert back.equals(table), (name, back.num_rows)
    print(f"(b) pyarrow DoPut into the cudabuf server (plain and LZ4): {table.num_rows} rows read back equal")


class PyServer(flight.FlightServerBase):
    def __init__(self, tables, expected_puts=None):
        super().__init__("grpc://127.0.0.1:0")
        self.tables = tables
        self.expected_puts = expected_puts or {}
        self.received = {}

    def do_put(self, context, descriptor, reader, writer):
        name = "/".join(p.decode() for p in descriptor.path)
        got = reader.read_all()
        want = self.expected_puts.get(name)
        if want is None or not got.equals(want):
            raise flight.FlightServerError(f"DoPut {name!r}: not the expected table ({got.num_rows} rows)")
        self.received[name] = got

    def do_exchange(self, context, descriptor, reader, writer):
        # In step: each batch answered as it comes (echoed, or with `id` doubled).
        command = descriptor.command.decode()
        compression = {"echo-lz4": "lz4", "echo-zstd": "zstd"}.get(command)
        started = False
        for chunk in reader:
            batch = chunk.data
            if command == "double":
                batch = batch.set_column(0, "id", pa.compute.multiply(batch.column(0), 2))
            if not started:
                writer.begin(batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression))
                started = True
            writer.write_batch(batch)
        if not started:
            writer.begin(reader.schema)

    def do_get(self, context, ticket):
        name = ticket.ticket.decode()
        compression = "lz4" if name.startswith("lz4") else None
        return flight.RecordBatchStream(
            self.tables[name], options=pa.ipc.IpcWriteOptions(compression=compression)
        )


def check_cudabuf_do_get_from_pyarrow():
    table = pa.Table.from_batches(put_table().to_batches(max_chunksize=1500))
    # "lz4-empty": pyarrow sends the schema and no batch message.
    tables = {"plain": table, "lz4": table, "lz4-empty": table.slice(0, 0)}
    server = PyServer(tables)
    try:
        url = f"grpc://127.0.0.1:{server.port}".replace("grpc://", "http://")
        with tempfile.TemporaryDirectory() as tmp:
            for name in tables:
                out = os.path.join(tmp, f"{name}.arrow")
                run = subprocess.run(
                    cargo_example("get", url, name, out),
                    capture_output=True,
                    text=True,
                    timeout=PROCESS_TIMEOUT_S,
                )
                assert run.returncode == 0, run.stderr
                got = ipc.open_file(out).read_all()
                assert got.equals(tables[name]), (name, got.num_rows)
                print(f"    {name}: {run.stdout.strip()}")
    finally:
        server.shutdown()
    print("(c) cudabuf DoGet from a pyarrow.flight server (plain, LZ4, schema-only) equal")


WORDS = [["alpha", "beta", "gamma"], ["delta", "epsilon"], ["zeta", "eta", "theta", "iota"]]


def dict_batches(rows=800):
    """Three batches, each with its own dictionary for `tag` (replacements on the wire)."""
    batches = []
    for k, words in enumerate(WORDS):
        ids = list(range(k * rows, (k + 1) * rows))
        tags = pa.DictionaryArray.from_arrays(
            pa.array([None if i % 11 == 0 else i % len(words) for i in ids], pa.int32()),
            pa.array(words),
        )
        notes = pa.array([None if i % 6 == 0 else f"n{i}" for i in ids])
        batches.append(
            pa.record_batch({"id": pa.array(ids, pa.int64()), "tag": tags, "note": notes})
        )
    return batches


def check_dictionaries_into_cudabuf_and_back(client):
    batches = dict_batches()
    descriptor = flight.FlightDescriptor.for_path("dictionaries")
    writer, _ = client.do_put(descriptor, batches[0].schema, options())
    for batch in batches:
        writer.write_batch(batch)
    writer.close()
    back = client.do_get(flight.Ticket(b"dictionaries"), options()).read_all()
    want = pa.Table.from_batches(batches)
    assert back.equals(want), (back.schema, back.num_rows)
    assert [c.dictionary.to_pylist() for c in back.column("tag").chunks] == WORDS
    print(f"(d) dictionary columns DoPut into cudabuf and DoGet back: {want.num_rows} rows, 3 dictionaries, equal")


def exchange(client, descriptor, batches, write_options=None):
    """DoExchange `batches` (a reader thread reads the answer while they are written);
    returns the answer table, or raises the first error of either side."""
    writer, reader = client.do_exchange(descriptor, options())
    answer, errors = [], []

    def read():
        try:
            answer.append(reader.read_all())
        except Exception as e:  # reported below, in the caller's thread
            errors.append(e)

    thread = threading.Thread(target=read)
    thread.start()
    try:
        writer.begin(batches[0].schema, options=write_options)
        for batch in batches:
            writer.write_batch(batch)
        writer.done_writing()
    except Exception as e:
        errors.append(e)
    thread.join(CALL_TIMEOUT_S + 5)
    assert not thread.is_alive(), "the answer did not come in time"
    try:
        writer.close()
    except Exception as e:
        errors.append(e)
    if errors:
        raise errors[0]
    return answer[0]


def check_exchange_with_cudabuf(client):
    descriptor = flight.FlightDescriptor.for_command(b"echo")
    for name, batches in (("mixed", put_table().to_batches(max_chunksize=1500)), ("dictionaries", dict_batches())):
        want = pa.Table.from_batches(batches)
        for compression in (None, "lz4", "zstd"):
            got = exchange(client, descriptor, batches, pa.ipc.IpcWriteOptions(compression=compression))
            assert got.equals(want), (name, compression, got.num_rows)
    # A delta dictionary (the second batch's grows the first's) is refused, saying so.
    grow = [
        pa.record_batch({"tag": pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array(words))})
        for words in (["a", "b"], ["a", "b", "c"])
    ]
    try:
        exchange(client, descriptor, grow, pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True))
    except pa.ArrowException as e:
        assert "delta" in str(e), e
    else:
        raise AssertionError("a delta dictionary was accepted")
    print("(e) pyarrow DoExchange with the cudabuf server (plain, LZ4, ZSTD; dictionaries) equal; a delta dictionary refused")


def check_cudabuf_put_and_exchange_with_pyarrow():
    batches = dict_batches()
    table = pa.Table.from_batches(batches)
    server = PyServer({}, expected_puts={"from/cudabuf": table})
    try:
        url = f"http://127.0.0.1:{server.port}"
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "in.arrows")
            with pa.ipc.new_stream(source, batches[0].schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            run = subprocess.run(
                cargo_example("send", "put", url, "from/cudabuf", source),
                capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
            )
            assert run.returncode == 0, run.stderr
            assert server.received["from/cudabuf"].equals(table)
            print(f"    put: {run.stdout.strip()}")
            doubled = table.set_column(0, "id", pa.compute.multiply(table.column(0), 2))
            for command, want in (("echo", table), ("echo-lz4", table), ("echo-zstd", table), ("double", doubled)):
                out = os.path.join(tmp, f"{command}.arrows")
                run = subprocess.run(
                    cargo_example("send", "exchange", url, command, source, out),
                    capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
                )
                assert run.returncode == 0, run.stderr
                got = ipc.open_stream(out).read_all()
                assert got.equals(want), (command, got.num_rows)
                print(f"    exchange {command}: {run.stdout.strip().splitlines()[-1]}")
    finally:
        server.shutdown()
    print("(f) cudabuf DoPut into and DoExchange with a pyarrow.flight server (dictionaries; plain, LZ4, ZSTD, computed answers) equal")


def main():
    subprocess.run(
        ["cargo", "build", "-q", "-p", "cudabuf-flight", "--examples"], check=True
    )
    proc, port = start_cudabuf_server()
    try:
        client = flight.connect(f"grpc://127.0.0.1:{port}")
        check_do_get_from_cudabuf(client)
        check_do_put_into_cudabuf(client)
        check_dictionaries_into_cudabuf_and_back(client)
        check_exchange_with_cudabuf(client)
        client.close()
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=CALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.returncode
    check_cudabuf_do_get_from_pyarrow()
    check_cudabuf_put_and_exchange_with_pyarrow()
    print("flight interop with pyarrow", pa.__version__, "passed")


if __name__ == "__main__":
    sys.exit(main())
