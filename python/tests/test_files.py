"""Files to device memory and back: ``Context.read_file``, ``CudaBuffer.read_file`` and
``CudaBuffer.write_file``, the context's file options, and bad input as ``FileError``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

import cudabuf
from cudabuf import cuda


def random_bytes(size: int, seed: int = 1) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("size", [0, 1, 4095, 4097, 300_001])
@pytest.mark.parametrize("threads", [1, 3])
def test_read_file_whole_and_ranges(ctx: cuda.Context, tmp_path: Path, size: int, threads: int) -> None:
    ctx.set_file_options(chunk_size=4096, threads=threads)
    data = random_bytes(size)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    assert ctx.read_file(path).to_pybytes() == data
    assert ctx.read_file(str(path)).size == size
    offset = size // 3
    assert ctx.read_file(path, offset).to_pybytes() == data[offset:]
    length = (size - offset) // 2
    assert ctx.read_file(path, offset, length).to_pybytes() == data[offset : offset + length]


def test_buffer_read_and_write_with_paths_file_objects_and_descriptors(
    ctx: cuda.Context, tmp_path: Path
) -> None:
    data = random_bytes(100_000, seed=2)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    buf = ctx.new_buffer(50_000)
    buf.read_file(src, 1234)
    assert buf.to_pybytes() == data[1234:51234]
    with open(src, "rb") as f:
        buf.read_file(f, 7)
    assert buf.to_pybytes() == data[7:50007]
    fd = os.open(src, os.O_RDONLY)
    try:
        buf.read_file(fd)
    finally:
        os.close(fd)
    assert buf.to_pybytes() == data[:50000]

    out = tmp_path / "out.bin"
    assert buf.write_file(out) == 50_000
    assert out.read_bytes() == data[:50000]
    # Not truncated: writing at an offset keeps what is before it.
    assert ctx.new_buffer(0).write_file(out, 10) == 0
    ctx.buffer_from_data(b"XY").write_file(out, 2)
    assert out.read_bytes()[:4] == data[:2] + b"XY"
    assert len(out.read_bytes()) == 50_000
    with open(tmp_path / "fobj.bin", "wb") as f:
        buf.write_file(f, 3)
    assert (tmp_path / "fobj.bin").read_bytes() == b"\0\0\0" + data[:50000]


def test_options_round_trip_and_are_checked(ctx: cuda.Context) -> None:
    before = ctx.file_options()
    assert set(before) == {"chunk_size", "threads", "direct_io"}
    assert before["direct_io"] == "never"
    ctx.set_file_options(chunk_size=1 << 16, threads=2, direct_io="if_supported")
    assert ctx.file_options() == {"chunk_size": 1 << 16, "threads": 2, "direct_io": "if_supported"}
    ctx.set_file_options(threads=1)
    assert ctx.file_options()["chunk_size"] == 1 << 16
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.set_file_options(chunk_size=1000)
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.set_file_options(threads=0)
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.set_file_options(direct_io="sometimes")  # type: ignore[arg-type]
    ctx.set_file_options(chunk_size=before["chunk_size"], threads=before["threads"], direct_io="never")


def test_direct_io_gives_the_same_bytes(ctx: cuda.Context, tmp_path: Path) -> None:
    data = random_bytes(200_003, seed=3)
    path = tmp_path / "direct.bin"
    path.write_bytes(data)
    ctx.set_file_options(chunk_size=1 << 14, direct_io="if_supported")
    try:
        assert ctx.read_file(path, 11).to_pybytes() == data[11:]
    finally:
        ctx.set_file_options(direct_io="never")


def test_bad_files_are_file_errors_and_leak_nothing(ctx: cuda.Context, tmp_path: Path) -> None:
    path = tmp_path / "ten.bin"
    path.write_bytes(b"0123456789")
    baseline = ctx.bytes_allocated
    with pytest.raises(cudabuf.FileError, match="ten.bin") as info:
        ctx.read_file(path, 8, 3)
    assert isinstance(info.value, OSError)
    assert info.value.kind == "File"
    with pytest.raises(cudabuf.FileError):
        ctx.read_file(path, 11)
    with pytest.raises(cudabuf.FileError, match="directory"):
        ctx.read_file(tmp_path)
    with pytest.raises(cudabuf.FileError):
        ctx.read_file(tmp_path / "missing")
    with pytest.raises(cudabuf.FileError):
        ctx.read_file("/dev/zero")
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(cudabuf.FileError):
            ctx.read_file(tmp_path / "fifo")  # refused at once, not blocked on a writer
    with pytest.raises(cudabuf.FileError):
        ctx.new_buffer(4).read_file(path, 7)
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.read_file(path, -1)
    with pytest.raises(cudabuf.InvalidArgumentError):
        ctx.new_buffer(4).read_file(object())  # type: ignore[arg-type]
    with pytest.raises(cudabuf.FileError):
        ctx.buffer_from_data(b"x").write_file(tmp_path)
    assert ctx.bytes_allocated == baseline


def test_threads_read_and_write_their_own_files(ctx: cuda.Context, tmp_path: Path) -> None:
    ctx.set_file_options(chunk_size=4096, threads=2)
    failures: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for r in range(10):
                data = random_bytes(10_000 + 997 * r, seed=100 * t + r)
                path = tmp_path / f"t{t}-{r}.bin"
                path.write_bytes(data)
                buf = ctx.read_file(path)
                assert buf.to_pybytes() == data
                out = tmp_path / f"t{t}-{r}.out"
                buf.write_file(out)
                assert out.read_bytes() == data
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


def test_file_objects_descriptors_and_fifos_behave_as_files(ctx: cuda.Context, tmp_path: Path) -> None:
    buf = ctx.buffer_from_data(b"0123456789")
    # Bytes a Python file object still buffers are flushed before the read.
    path = tmp_path / "buffered.bin"
    with open(path, "wb+") as f:
        f.write(b"abcdefghij")  # not flushed by us
        buf.read_file(f)
        assert buf.to_pybytes() == b"abcdefghij"
    # A read-only descriptor cannot be written; a file open for appending is refused.
    with open(path, "rb") as f:
        with pytest.raises(cudabuf.FileError):
            buf.write_file(f)
    with open(path, "ab") as f:
        with pytest.raises(cudabuf.FileError, match="appending"):
            buf.write_file(f)
    assert path.read_bytes() == b"abcdefghij"
    # A FIFO with no peer: refused at once, never blocking (the GIL would be held).
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        with pytest.raises(cudabuf.FileError):
            buf.read_file(fifo)
        with pytest.raises(cudabuf.FileError):
            buf.write_file(fifo)
    with pytest.raises(cudabuf.InvalidArgumentError):
        buf.read_file(True)  # type: ignore[arg-type]
    with pytest.raises(cudabuf.FileError):
        buf.read_file(10_000)  # not an open descriptor


def test_file_errors_are_the_builtin_oserror_of_their_cause(ctx: cuda.Context, tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError) as info:
        ctx.read_file(missing)
    assert isinstance(info.value, cudabuf.MissingFileError)
    assert isinstance(info.value, cudabuf.FileError)
    assert info.value.filename == str(missing)
    with pytest.raises(FileNotFoundError):
        ctx.new_buffer(4).read_file(missing)
