"""Arrow IPC files (Feather v2), IPC stream files and Parquet files written by pyarrow,
read into device memory by cudabuf: equal to what pyarrow reads on the host; projection;
cudabuf's own IPC files read back by pyarrow; bad files as typed errors, nothing leaked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

import cudabuf
from cudabuf import cuda


def sample_table(rows: int = 10_000) -> pa.Table:
    rng = np.random.default_rng(7)
    ints = pa.array(rng.integers(-(2**40), 2**40, rows), type=pa.int64())
    floats = pa.array(rng.random(rows))
    mask = rng.random(rows) < 0.1
    nullable = pa.array(rng.integers(0, 1000, rows).astype(np.int32), mask=mask)
    strings = pa.array([f"row-{i}" if i % 7 else None for i in range(rows)])
    lists = pa.array([[i, i + 1] if i % 5 else [] for i in range(rows)], type=pa.list_(pa.int16()))
    return pa.table({"ints": ints, "floats": floats, "nullable": nullable, "strings": strings, "lists": lists})


def on_host(batches: list[cuda.DeviceRecordBatch]) -> pa.Table:
    return pa.Table.from_batches([b.to_host() for b in batches])


@pytest.mark.parametrize("compression", ["uncompressed", "lz4", "zstd"])
def test_feather_v2_files_land_equal_to_pyarrow(ctx: cuda.Context, tmp_path: Path, compression: str) -> None:
    table = sample_table()
    path = tmp_path / f"{compression}.feather"
    # Feather v2 is the IPC file format; write_feather compresses with LZ4 by default.
    feather.write_feather(table, path, compression=compression, chunksize=3000)
    batches = cuda.read_ipc_file(path, ctx)
    assert len(batches) == 4
    assert all(isinstance(b, cuda.DeviceRecordBatch) for b in batches)
    assert on_host(batches).equals(feather.read_table(path))
    assert sum(b.num_rows for b in batches) == table.num_rows


def test_feather_default_compression_is_read(ctx: cuda.Context, tmp_path: Path) -> None:
    path = tmp_path / "default.feather"
    feather.write_feather(sample_table(2000), path)  # LZ4, pyarrow's default
    assert on_host(cuda.read_ipc_file(path, ctx)).equals(feather.read_table(path))


def test_projection_by_name_and_index(ctx: cuda.Context, tmp_path: Path) -> None:
    table = sample_table(5000)
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table, max_chunksize=2000)
    by_name = on_host(cuda.read_ipc_file(path, ctx, columns=["strings", "ints"]))
    assert by_name.column_names == ["strings", "ints"]  # in the order asked for
    assert by_name.column("ints").equals(table.column("ints"))
    assert by_name.column("strings").equals(table.column("strings"))
    by_index = on_host(cuda.read_ipc_file(path, ctx, columns=[1]))
    assert by_index.column_names == ["floats"]
    assert by_index.column("floats").equals(table.column("floats"))
    with pytest.raises(cudabuf.InvalidArgumentError):
        cuda.read_ipc_file(path, ctx, columns=["nope"])
    with pytest.raises(cudabuf.CudaError):
        cuda.read_ipc_file(path, ctx, columns=[99])
    with pytest.raises(cudabuf.InvalidArgumentError):
        cuda.read_ipc_file(path, ctx, columns="ints")


def test_stream_files(ctx: cuda.Context, tmp_path: Path) -> None:
    table = sample_table(4000)
    dictionary = pa.table({"d": pa.array(["a", "b", "a", None] * 250).dictionary_encode()})
    for name, t in [("plain", table), ("dict", dictionary)]:
        path = tmp_path / f"{name}.arrows"
        with ipc.new_stream(path, t.schema) as w:
            w.write_table(t, max_chunksize=1500)
        got = on_host(cuda.read_ipc_stream_file(path, ctx))
        with ipc.open_stream(path) as r:
            assert got.equals(r.read_all())


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd"])
def test_parquet_files_land_equal_to_pyarrow(ctx: cuda.Context, tmp_path: Path, compression: str) -> None:
    table = sample_table(6000)
    path = tmp_path / f"{compression}.parquet"
    pq.write_table(table, path, compression=compression, row_group_size=2500)
    batches = cuda.read_parquet(path, ctx)
    assert len(batches) == 3  # one per row group
    assert on_host(batches).equals(pq.read_table(path))
    projected = on_host(cuda.read_parquet(path, ctx, columns=["floats"]))
    assert projected.column_names == ["floats"]
    assert projected.column("floats").equals(table.column("floats"))


def test_parquet_decompression_limit_is_a_keyword(ctx: cuda.Context, tmp_path: Path) -> None:
    # Pages past the limit are refused before anything is decompressed, naming the
    # setting; a limit that fits reads what pyarrow reads.
    table = sample_table(6000)
    path = tmp_path / "limit.parquet"
    pq.write_table(table, path, compression="zstd", row_group_size=2500)
    before = ctx.bytes_allocated
    with pytest.raises(cudabuf.InvalidDataError, match="set_decompression_limit"):
        cuda.read_parquet(path, ctx, decompression_limit=1)
    assert ctx.bytes_allocated == before
    got = on_host(cuda.read_parquet(path, ctx, decompression_limit=64 << 20))
    assert got.equals(pq.read_table(path))
    assert on_host(cuda.read_parquet(path, ctx, decompression_limit=None)).equals(got)
    with pytest.raises(OverflowError):
        cuda.read_parquet(path, ctx, decompression_limit=-1)
    with pytest.raises(TypeError):
        cuda.read_parquet(path, ctx, None, 1 << 20)  # type: ignore[misc]  # keyword only


@pytest.mark.parametrize("threads", [1, 2, 8])
def test_files_decoded_by_several_threads_equal_pyarrow(ctx: cuda.Context, tmp_path: Path, threads: int) -> None:
    # Compressed IPC bodies and Parquet row groups are decoded by up to the context's
    # file threads at once; every count lands what pyarrow reads.
    table = sample_table(12_000)
    lz4 = tmp_path / "t.feather"
    feather.write_feather(table, lz4, compression="lz4", chunksize=1000)
    parquet = tmp_path / "t.parquet"
    pq.write_table(table, parquet, row_group_size=1000)
    saved = ctx.file_options()
    ctx.set_file_options(threads=threads, chunk_size=64 << 10)
    try:
        before = ctx.bytes_allocated
        batches = cuda.read_ipc_file(lz4, ctx)
        assert len(batches) == 12
        assert on_host(batches).equals(feather.read_table(lz4))
        row_groups = cuda.read_parquet(parquet, ctx)
        assert len(row_groups) == 12
        assert on_host(row_groups).equals(pq.read_table(parquet))
        del batches, row_groups
        assert ctx.bytes_allocated == before
    finally:
        ctx.set_file_options(threads=saved["threads"], chunk_size=saved["chunk_size"])


def test_write_ipc_file_is_read_by_pyarrow(ctx: cuda.Context, tmp_path: Path) -> None:
    table = sample_table(3000)
    src = tmp_path / "src.arrow"
    feather.write_feather(table, src, compression="uncompressed", chunksize=1000)
    batches = cuda.read_ipc_file(src, ctx)
    out = tmp_path / "out.arrow"
    cuda.write_ipc_file(out, batches)
    with ipc.open_file(out) as r:
        assert r.num_record_batches == 3
        assert r.read_all().equals(feather.read_table(src))
    with pytest.raises(cudabuf.InvalidArgumentError):
        cuda.write_ipc_file(tmp_path / "none.arrow", [])
    # No batches, with a schema: an empty file pyarrow opens.
    empty = tmp_path / "empty.arrow"
    cuda.write_ipc_file(empty, [], schema=table.schema)
    with ipc.open_file(empty) as r:
        assert r.num_record_batches == 0
        assert r.schema.equals(table.schema)


def test_bad_files_are_typed_errors_and_leak_nothing(ctx: cuda.Context, tmp_path: Path) -> None:
    good = tmp_path / "good.arrow"
    feather.write_feather(sample_table(1000), good, compression="lz4")
    data = good.read_bytes()
    pq_good = tmp_path / "good.parquet"
    pq.write_table(sample_table(1000), pq_good)
    pq_data = pq_good.read_bytes()
    baseline = ctx.bytes_allocated
    for cut in [0, 5, 8, len(data) // 2, len(data) - 10, len(data) - 1]:
        bad = tmp_path / f"cut{cut}.arrow"
        bad.write_bytes(data[:cut])
        with pytest.raises(cudabuf.InvalidDataError):
            cuda.read_ipc_file(bad, ctx)
    expected = feather.read_table(good)
    refused = 0
    for at in range(len(data) - 200, len(data) - 10, 7):
        flipped = bytearray(data)
        flipped[at] ^= 0x5A
        bad = tmp_path / "flip.arrow"
        bad.write_bytes(bytes(flipped))
        try:
            got = on_host(cuda.read_ipc_file(bad, ctx))
        except cudabuf.CudaError:
            refused += 1  # typed
            continue
        # Read: then the flip was in bytes that do not change the data (padding), or
        # in values pyarrow reads the same way.
        try:
            theirs = feather.read_table(bad)
        except Exception:  # noqa: BLE001 - pyarrow refusing what we read is a finding
            theirs = None
        assert theirs is not None and got.equals(theirs), f"byte {at}: read, but not as pyarrow reads it"
    assert refused > 0, "flips in the footer are refused"
    for cut in [0, 4, len(pq_data) // 2, len(pq_data) - 5]:
        bad = tmp_path / f"cut{cut}.parquet"
        bad.write_bytes(pq_data[:cut])
        with pytest.raises(cudabuf.InvalidDataError):
            cuda.read_parquet(bad, ctx)
    with pytest.raises(cudabuf.FileError):
        cuda.read_ipc_file(tmp_path / "missing.arrow", ctx)
    with pytest.raises(cudabuf.FileError):
        cuda.read_parquet(tmp_path, ctx)
    with pytest.raises(cudabuf.FileError):
        cuda.read_ipc_stream_file(tmp_path, ctx)
    assert ctx.bytes_allocated == baseline
