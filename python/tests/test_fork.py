"""A forked child is refused its parent's simulator, as CUDA refuses a forked child its
parent's contexts; a simulator the child makes works."""

from __future__ import annotations

import multiprocessing
import os
import warnings
from typing import Callable, List, Tuple

import pytest

import cudabuf
from cudabuf import cuda, sim

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="needs os.fork (POSIX)"
)


def refusal(call: Callable[[], object]) -> str:
    """``"refused"`` when ``call`` raises the simulator's fork error, else what happened."""
    try:
        call()
    except cudabuf.NoDriverError as e:
        text = str(e)
        for words in ("CUDA_ERROR_NOT_INITIALIZED", "forked", "Simulator()", "spawn"):
            if words not in text:
                return f"NoDriverError without {words!r}: {text}"
        return "refused"
    except BaseException as e:  # reported to the parent, which fails the test
        return f"{type(e).__name__}: {e}"
    return "worked"


def run_in_forked_child(body: Callable[[], List[str]]) -> Tuple[int, List[str]]:
    """Run ``body`` in a child made by ``os.fork``; its exit code and lines."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork in a process with threads (this one may have
        # the simulator's or pytest's).
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 3
        try:
            os.close(read_end)
            lines = body()
            os.write(write_end, "\n".join(lines).encode())
            code = 0
        except BaseException as e:
            os.write(write_end, f"child raised {type(e).__name__}: {e}".encode())
            code = 2
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode().splitlines()


def test_a_forked_child_is_refused_the_parents_simulator_and_makes_its_own() -> None:
    s = sim.Simulator(devices=2)
    ctx = s.context(0)
    buf = ctx.new_buffer(8)
    buf.copy_from_host(b"parent!!")
    host = s.new_host_buffer(8)

    def child() -> List[str]:
        own = sim.Simulator(devices=1)
        mine = own.context(0).new_buffer(4)
        mine.copy_from_host(b"kid!")
        return [
            "to_pybytes " + refusal(buf.to_pybytes),
            "copy_from_host " + refusal(lambda: buf.copy_from_host(b"x")),
            "new_buffer " + refusal(lambda: ctx.new_buffer(8)),
            "context(1) " + refusal(lambda: s.context(1)),
            "new_host_buffer " + refusal(lambda: s.new_host_buffer(8)),
            "buffer_from_data " + refusal(lambda: ctx.buffer_from_data(host)),
            "own simulator " + mine.to_pybytes().decode(),
        ]

    code, lines = run_in_forked_child(child)
    assert code == 0, lines
    assert lines == [
        "to_pybytes refused",
        "copy_from_host refused",
        "new_buffer refused",
        "context(1) refused",
        "new_host_buffer refused",
        "buffer_from_data refused",
        "own simulator kid!",
    ]
    # The parent's simulator goes on.
    assert buf.to_pybytes() == b"parent!!"
    assert ctx.new_buffer(4).size == 4
    del buf, host
    s.assert_clean()


def test_the_global_backend_in_a_forked_child() -> None:
    if cudabuf.get_backend() != "sim":
        pytest.skip("the simulator's fork rule (the backend under test is not the simulator)")
    parent_ctx = cuda.Context(0)
    parent_buf = parent_ctx.new_buffer(16)

    def child() -> List[str]:
        lines = [
            "parent buffer " + refusal(parent_buf.to_pybytes),
            "Context(0) " + refusal(lambda: cuda.Context(0).new_buffer(1)),
        ]
        cudabuf.set_backend("sim")  # the child's own simulator
        fresh = cuda.Context(0).buffer_from_data(b"fresh")
        lines.append("after set_backend " + fresh.to_pybytes().decode())
        return lines

    code, lines = run_in_forked_child(child)
    assert code == 0, lines
    assert lines == [
        "parent buffer refused",
        "Context(0) refused",
        "after set_backend fresh",
    ]
    assert parent_buf.size == 16 and len(parent_buf.to_pybytes()) == 16


def test_multiprocessing_fork_start_method_is_refused() -> None:
    s = sim.Simulator(devices=1)
    buf = s.context(0).buffer_from_data(b"shared?")
    mp = multiprocessing.get_context("fork")
    results = mp.SimpleQueue()

    def work() -> None:
        results.put(refusal(buf.to_pybytes))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child = mp.Process(target=work)
        child.start()
    child.join(60)
    assert child.exitcode == 0
    assert results.get() == "refused"
    assert buf.to_pybytes() == b"shared?"
