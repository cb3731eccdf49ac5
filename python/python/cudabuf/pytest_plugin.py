"""The pytest plugin of cudabuf (registered through the ``pytest11`` entry point, so it is
active wherever cudabuf is installed; ``-p no:cudabuf`` turns it off).

- ``cudabuf_sim``: a fixture giving each test a fresh :class:`cudabuf.sim.Simulator`,
  checked at teardown: a leak (an allocation still live once the test and its fixtures
  are done) or a data race makes the test fail with
  :class:`~cudabuf.SimulatorNotCleanError` naming each one (reported by pytest as an
  error at teardown), once every fixture is torn down. The check is skipped when the
  test (or its setup) already failed, or failed as expected (``xfail``): its traceback
  may be what keeps buffers alive.
  Configure the simulator with the marker ``@pytest.mark.cudabuf_sim(devices=1,
  capacity=1 << 20, ...)``, which takes :class:`~cudabuf.sim.Simulator`'s arguments.
- ``@pytest.mark.cudabuf_cuda``: run the test on the CUDA backend (``cudabuf.cuda``
  contexts made in it are on the GPU; the previous backend is restored afterwards). It
  is skipped, with the reason, when no CUDA driver or device is present, and errors at
  setup instead when ``CUDABUF_REQUIRE_CUDA=1`` (a GPU CI job that must not skip).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Optional

import pytest

import cudabuf
from cudabuf import cuda
from cudabuf.sim import Simulator

__all__ = ["cudabuf_sim", "REQUIRE_CUDA_VAR"]

REQUIRE_CUDA_VAR = "CUDABUF_REQUIRE_CUDA"
"""Set to ``1`` to make ``cudabuf_cuda`` tests error, not skip, without CUDA."""

_SIMULATOR = pytest.StashKey[Simulator]()
# The node ids of tests whose setup or call failed, until their teardown.
_FAILED_TESTS: set[str] = set()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "cudabuf_sim(**kwargs): arguments of the cudabuf.sim.Simulator the cudabuf_sim "
        "fixture makes (devices, capacity, seed, schedule, races, name)",
    )
    config.addinivalue_line(
        "markers",
        "cudabuf_cuda: run the test on cudabuf's CUDA backend; skipped without a CUDA "
        f"driver and device (errors at setup instead with {REQUIRE_CUDA_VAR}=1)",
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Called after each phase, before the next: the teardown check below sees whether
    # the setup or the call failed.
    # An expected failure (``xfail``) is reported as skipped, with ``wasxfail`` set: its
    # traceback may keep buffers alive just the same.
    expected_failure = report.skipped and hasattr(report, "wasxfail")
    if (report.failed or expected_failure) and report.when in ("setup", "call"):
        _FAILED_TESTS.add(report.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    # The check of `cudabuf_sim` runs here, after pytest's own teardown hook has torn
    # every fixture down (those that hold the simulator's buffers included), not in the
    # fixture's own teardown: pytest keeps the test's arguments (fixture values) in
    # `funcargs` until after this hook, and a buffer a fixture yielded would look live.
    # Plain hooks (no hook wrappers), so that any pytest from 7.0 loads the plugin.
    failed = item.nodeid in _FAILED_TESTS
    _FAILED_TESTS.discard(item.nodeid)
    simulator = item.stash.get(_SIMULATOR, None)
    if simulator is None:
        return
    del item.stash[_SIMULATOR]
    if failed:
        # The failure is reported; its traceback may be what keeps buffers alive.
        return
    if isinstance(item, pytest.Function):
        # What pytest drops right after this hook.
        item.funcargs.clear()
    simulator.assert_clean()


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_CUDA_VAR, "") == "1":
        pytest.fail(f"{REQUIRE_CUDA_VAR}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _cudabuf_cuda_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Switch a ``cudabuf_cuda`` test to the CUDA backend, or skip it."""
    if request.node.get_closest_marker("cudabuf_cuda") is None:
        yield
        return
    previous = cudabuf.get_backend()
    missing: Optional[str] = None
    try:
        cudabuf.set_backend("cuda")
    except cudabuf.NoDriverError as e:
        missing = str(e)
    if missing is not None:
        _unavailable(f"needs CUDA: {missing}")
    try:
        if cuda.Context.get_num_devices() == 0:
            _unavailable("needs CUDA: the driver reports no device")
        yield
    finally:
        cudabuf.set_backend(previous)


@pytest.fixture
def cudabuf_sim(request: pytest.FixtureRequest) -> Simulator:
    """A fresh simulator for this test, which must end clean: no allocation left and
    no data race (else ``SimulatorNotCleanError`` at teardown)."""
    marker = request.node.get_closest_marker("cudabuf_sim")
    kwargs: dict[str, Any] = dict(marker.kwargs) if marker is not None else {}
    simulator = Simulator(**kwargs)
    request.node.stash[_SIMULATOR] = simulator
    return simulator
