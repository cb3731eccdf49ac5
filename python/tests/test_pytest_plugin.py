"""The pytest plugin (``cudabuf.pytest_plugin``), run on user test files through pytester.

Races are not exercised here: the Python API issues no stream work yet, so a Python
test cannot race; the race half of the teardown check is the same call
(``Simulator.assert_clean``) whose leak half is tested below.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

import cudabuf

pytest_plugins = ["pytester"]


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_user=source)
    return pytester.runpytest("-p", "no:cacheprovider", "-rs", *args)


def cuda_present() -> bool:
    previous = cudabuf.get_backend()
    try:
        cudabuf.set_backend("cuda")
        return cudabuf.cuda.Context.get_num_devices() > 0
    except cudabuf.CudaError:
        return False
    finally:
        cudabuf.set_backend(previous)


def pytest11_entry_points() -> list[importlib.metadata.EntryPoint]:
    if sys.version_info >= (3, 10):
        return list(importlib.metadata.entry_points(group="pytest11"))
    # Python 3.9: entry_points() is a dict of groups (no `group=` keyword yet).
    return list(importlib.metadata.entry_points().get("pytest11", []))


def test_plugin_is_registered_by_entry_point(request: pytest.FixtureRequest) -> None:
    points = pytest11_entry_points()
    assert [p.value for p in points if p.name == "cudabuf"] == ["cudabuf.pytest_plugin"]
    assert request.config.pluginmanager.has_plugin("cudabuf")


def test_leak_fails_the_test_and_clean_test_passes(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        kept = []

        def test_leaks(cudabuf_sim):
            kept.append(cudabuf_sim.context(0).new_buffer(100))

        def test_clean(cudabuf_sim):
            buf = cudabuf_sim.context(1).new_buffer(100)
            buf.copy_from_host(b"x" * 100)
            assert buf.to_pybytes() == b"x" * 100
        """,
    )
    result.assert_outcomes(passed=2, errors=1)
    assert result.ret != 0
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks*",
            "*SimulatorNotCleanError*",
            "*1 live allocation(s), 100 bytes*",
        ]
    )
    assert "test_clean" not in "".join(
        line for line in result.stdout.lines if "ERROR at teardown" in line
    )


def test_an_expected_failure_skips_the_check_like_a_failure(
    pytester: pytest.Pytester,
) -> None:
    # The failing frame's buffer is alive in the traceback pytest keeps; an xfail is
    # reported as skipped, and the check must not turn it into an error at teardown.
    result = run(
        pytester,
        """
        import pytest

        def divide_on_device(ctx, a, b):
            buf = ctx.new_buffer(64)
            return a / b

        @pytest.mark.xfail(raises=ZeroDivisionError, reason="known bug", strict=True)
        def test_known_bug(cudabuf_sim):
            divide_on_device(cudabuf_sim.context(0), 1, 0)

        @pytest.mark.xfail(reason="known bug")
        def test_known_bug_plain(cudabuf_sim):
            divide_on_device(cudabuf_sim.context(0), 1, 0)
        """,
    )
    result.assert_outcomes(xfailed=2)
    assert result.ret == 0
    assert "SimulatorNotCleanError" not in result.stdout.str()


def test_each_test_gets_a_fresh_simulator(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        seen = []

        def test_one(cudabuf_sim):
            seen.append(cudabuf_sim)
            assert cudabuf_sim.leak_report() == []

        def test_two(cudabuf_sim):
            assert cudabuf_sim is not seen[0]
            assert cudabuf_sim.op_count("allocate") == 0
        """,
    )
    result.assert_outcomes(passed=2)


def test_user_fixtures_are_torn_down_before_the_check(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        import pytest

        @pytest.fixture
        def staging(cudabuf_sim):
            buf = cudabuf_sim.context(0).new_buffer(4096)
            yield buf
            del buf

        def test_uses_staging(staging):
            staging.copy_from_host(b"abcd")
        """,
    )
    result.assert_outcomes(passed=1)


def test_marker_configures_the_simulator(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        import pytest
        import cudabuf

        @pytest.mark.cudabuf_sim(devices=1, capacity=1024, seed=9)
        def test_small(cudabuf_sim):
            assert (cudabuf_sim.devices, cudabuf_sim.capacity, cudabuf_sim.seed) == (1, 1024, 9)
            with pytest.raises(cudabuf.OutOfMemoryError):
                cudabuf_sim.context(0).new_buffer(2048)
        """,
        "--strict-markers",
    )
    result.assert_outcomes(passed=1)


def readme_block(start: str) -> str:
    """The README's ```python block that begins with ``start``."""
    text = (Path(__file__).parent.parent / "README.md").read_text()
    begin = text.index("```python\n" + start) + len("```python\n")
    return text[begin : text.index("```", begin)]


def test_readme_worked_example(pytester: pytest.Pytester) -> None:
    # The README's pipeline and its tests, as written there: the injected out of memory
    # is handled (pass), the forgotten spare buffer is a leak (error at teardown).
    pytester.makepyfile(pipeline=readme_block("# pipeline.py"))
    pytester.syspathinsert()
    result = run(pytester, readme_block("# test_pipeline.py"))
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_upload*",
            "*SimulatorNotCleanError: the simulator is not clean:",
            "E   * no data races",
            "E   * cudabuf simulated device: 1 live allocation(s), 1048576 bytes:",
            "E   *   device 0 device      0x* 1048576 bytes",
        ]
    )
    assert "ERROR at teardown of test_upload_survives" not in result.stdout.str()


def test_a_failed_test_is_not_also_reported_as_leaking(pytester: pytest.Pytester) -> None:
    result = run(
        pytester,
        """
        def test_fails(cudabuf_sim):
            buf = cudabuf_sim.context(0).new_buffer(10)
            assert buf.size == 11
        """,
    )
    result.assert_outcomes(failed=1)
    assert "SimulatorNotCleanError" not in result.stdout.str()


CUDA_TEST = """
import pytest
import cudabuf

@pytest.mark.cudabuf_cuda
def test_on_gpu():
    assert cudabuf.get_backend() == "cuda"
    cudabuf.cuda.Context(0).new_buffer(8)

def test_after():
    assert cudabuf.get_backend() == "BACKEND"
"""


def test_cuda_marker_skips_visibly_without_cuda(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDABUF_REQUIRE_CUDA", raising=False)
    source = CUDA_TEST.replace("BACKEND", cudabuf.get_backend())
    result = run(pytester, source, "--strict-markers")
    if cuda_present():
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["SKIPPED*needs CUDA*"])


def test_cuda_marker_fails_when_cuda_is_required(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    if cuda_present():
        pytest.skip("CUDA is present here: the marked test runs")
    monkeypatch.setenv("CUDABUF_REQUIRE_CUDA", "1")
    source = CUDA_TEST.replace("BACKEND", cudabuf.get_backend())
    result = run(pytester, source)
    # The marked test errors at setup (nothing skipped), so the run fails.
    result.assert_outcomes(passed=1, errors=1, skipped=0)
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*ERROR at setup of test_on_gpu*", "CUDABUF_REQUIRE_CUDA=1 but needs CUDA*"])
