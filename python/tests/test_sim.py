"""``cudabuf.sim``: a simulator of one's own, its reports and fault injection.

These tests make their own simulators, so they run on either backend (no GPU needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cudabuf
from cudabuf import cuda, sim


def test_defaults_are_documented_and_applied() -> None:
    s = sim.Simulator()
    assert (s.devices, s.capacity) == (sim.DEFAULT_DEVICES, sim.DEFAULT_CAPACITY)
    assert (s.devices, s.capacity) == (2, 1 << 30)
    assert s.name == "cudabuf simulated device"
    assert "devices=2" in repr(s)
    # New device memory holds the documented fill byte, not zeros.
    buf = s.context(0).new_buffer(16)
    assert buf.to_pybytes() == bytes([sim.UNINIT_FILL]) * 16 == b"\xa5" * 16


def test_configuration_is_kept() -> None:
    s = sim.Simulator(3, 4096, seed=7, schedule="threaded", races="log", name="mine")
    assert (s.devices, s.capacity, s.seed, s.schedule, s.races, s.name) == (
        3,
        4096,
        7,
        "threaded",
        "log",
        "mine",
    )
    assert sim.Simulator(schedule="deterministic", races="off").races == "off"
    assert s.context(2).device_number == 2
    with pytest.raises(cudabuf.InvalidDeviceError):
        s.context(3)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"schedule": "sometimes"},
        {"races": "maybe"},
        {"devices": -1},
        {"capacity": -5},
        {"devices": 1_000_000},
    ],
)
def test_bad_configuration_raises(kwargs: dict[str, object]) -> None:
    with pytest.raises(cudabuf.InvalidArgumentError):
        sim.Simulator(**kwargs)  # type: ignore[arg-type]


def test_capacity_is_enforced() -> None:
    s = sim.Simulator(devices=1, capacity=1024)
    ctx = s.context()
    kept = ctx.new_buffer(1000)
    with pytest.raises(cudabuf.OutOfMemoryError):
        ctx.new_buffer(100)
    del kept
    ctx.new_buffer(1024)


def test_contexts_are_this_simulators() -> None:
    a, b = sim.Simulator(), sim.Simulator()
    buf = a.context(1).new_buffer(300)
    assert a.bytes_in_use(1) == 300
    assert a.bytes_in_use(0) == 0
    assert b.bytes_in_use(1) == 0
    assert b.leak_report() == []
    # Whatever the global backend is, the context is the simulator's.
    assert isinstance(a.context(0), cuda.Context)
    del buf
    assert a.bytes_in_use(1) == 0


def test_bytes_in_use_of_a_device_not_there_is_invalid_device() -> None:
    s = sim.Simulator(devices=2)
    for device in (2, 7, 2**40):
        with pytest.raises(cudabuf.InvalidDeviceError, match="2 device"):
            s.bytes_in_use(device)


def test_leak_report_is_structured_and_printable() -> None:
    s = sim.Simulator()
    ctx = s.context(1)
    dev = ctx.new_buffer(100)
    host = s.new_host_buffer(64, device=0)
    report = s.leak_report()
    assert sorted((leak.device, leak.kind, leak.size) for leak in report) == [
        (0, "pinned", 64),
        (1, "device", 100),
    ]
    assert report.total_bytes == 164
    assert all(leak.address > 0 for leak in report)
    text = str(report)
    assert "2 live allocation(s), 164 bytes" in text, text
    device_leak = next(leak for leak in report if leak.kind == "device")
    assert str(device_leak) == f"device 1 device {device_leak.address:#x} 100 bytes"
    del dev, host
    empty = s.leak_report()
    assert empty == [] and empty.total_bytes == 0
    assert str(empty) == "cudabuf simulated device: no live allocations"


def test_race_report_starts_empty() -> None:
    # Python issues no stream work yet, so nothing it does can race.
    s = sim.Simulator()
    ctx = s.context()
    buf = ctx.new_buffer(8)
    buf.copy_from_host(b"12345678")
    assert buf.to_pybytes() == b"12345678"
    report = s.race_report()
    assert report == [] and report.dropped == 0
    assert str(report) == "no data races detected"
    s.clear_race_report()


def test_assert_clean_names_the_leak() -> None:
    s = sim.Simulator()
    buf = s.context(0).new_buffer(100)
    with pytest.raises(sim.SimulatorNotCleanError) as info:
        s.assert_clean()
    err = info.value
    assert isinstance(err, cudabuf.CudaError) and isinstance(err, AssertionError)
    assert err is not None and cudabuf.SimulatorNotCleanError is sim.SimulatorNotCleanError
    assert "1 live allocation(s), 100 bytes" in str(err)
    assert "no data races" in str(err)
    assert [leak.size for leak in err.leaks] == [100] and err.races == []
    del buf
    s.assert_clean()


def test_assert_clean_names_races(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python cannot issue racing work yet: a report stands in for one, to check that
    # assert_clean raises on races alone and names them.
    s = sim.Simulator()
    race = sim.Race("read by B", "write by A", "bytes 0..4", "Wait.", "data race on bytes 0..4")
    report = sim.RaceReport([race], 2, "3 data race(s) detected: ...")
    monkeypatch.setattr(s, "race_report", lambda: report)
    with pytest.raises(sim.SimulatorNotCleanError) as info:
        s.assert_clean()
    assert "3 data race(s) detected" in str(info.value)
    assert "no allocations held" in str(info.value)
    assert info.value.races == [race] and info.value.leaks == []


def test_assert_clean_collects_cycles_first() -> None:
    s = sim.Simulator()
    holder: list[object] = [s.context(0).new_buffer(10)]
    holder.append(holder)
    del holder
    s.assert_clean()


def test_out_of_memory_at_the_second_allocation() -> None:
    s = sim.Simulator()
    ctx = s.context(0)
    before = s.op_count("allocate")
    s.fail_nth("allocate", 2)
    first = ctx.new_buffer(10)
    with pytest.raises(cudabuf.OutOfMemoryError) as info:
        ctx.new_buffer(20)
    # The injected error names the request that failed.
    assert "cannot allocate 20 bytes" in str(info.value)
    assert "Simulator.fail_nth" in str(info.value)
    third = ctx.new_buffer(30)  # fires once
    assert s.op_count("allocate") == before + 3
    assert sorted(leak.size for leak in s.leak_report()) == [10, 30]
    del first, third
    s.assert_clean()


def test_failing_copy_changes_nothing() -> None:
    s = sim.Simulator()
    buf = s.context(0).new_buffer(4)
    s.fail_nth("copy", 1)
    with pytest.raises(cudabuf.DriverError) as info:
        buf.copy_from_host(b"abcd")
    assert info.value.cuda_name == "CUDA_ERROR_UNKNOWN"
    assert buf.to_pybytes() == b"\xa5" * 4
    buf.copy_from_host(b"abcd")
    assert buf.to_pybytes() == b"abcd"


def test_fault_error_can_be_chosen() -> None:
    s = sim.Simulator()
    s.fail_nth("allocate", 1, error="driver")
    with pytest.raises(cudabuf.DriverError):
        s.context(0).new_buffer(8)
    s.fail_nth("alloc_host", 1)
    with pytest.raises(cudabuf.OutOfMemoryError):
        s.new_host_buffer(8)
    s.assert_clean()


def test_random_faults_are_reproducible_and_clearable() -> None:
    def pattern(seed: int) -> list[bool]:
        s = sim.Simulator()
        ctx = s.context(0)
        s.fail_randomly("allocate", 0.5, seed=seed)
        out = []
        for _ in range(40):
            try:
                ctx.new_buffer(1)
                out.append(True)
            except cudabuf.OutOfMemoryError:
                out.append(False)
        return out

    a = pattern(3)
    assert a == pattern(3)
    assert a != pattern(4)
    assert 5 < a.count(False) < 35
    s = sim.Simulator()
    s.fail_randomly("allocate", 1.0)
    with pytest.raises(cudabuf.OutOfMemoryError):
        s.context(0).new_buffer(1)
    s.clear_faults()
    s.context(0).new_buffer(1)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.fail_nth("alocate", 1),
        lambda s: s.fail_nth("allocate", 0),
        lambda s: s.fail_nth("allocate", -1),
        lambda s: s.fail_nth("copy", 1, error="boom"),
        lambda s: s.fail_randomly("copy", 1.5),
        lambda s: s.fail_randomly("copy", float("nan")),
        lambda s: s.op_count("nothing"),
    ],
)
def test_bad_fault_arguments_raise_and_arm_nothing(call: object) -> None:
    s = sim.Simulator()
    with pytest.raises(cudabuf.InvalidArgumentError):
        call(s)  # type: ignore[operator]
    s.context(0).new_buffer(1).copy_from_host(b"x")


def test_fault_ops_constant_lists_what_is_accepted() -> None:
    s = sim.Simulator()
    for op in sim.FAULT_OPS:
        assert s.op_count(op) == 0  # type: ignore[arg-type]


def test_contexts_ignore_the_allocator_cache_setting(tmp_path: Path) -> None:
    # CUDABUF_ALLOCATOR_CACHE is read once per process: a child process with it on.
    script = """
import cudabuf
from cudabuf import sim
s = sim.Simulator()
ctx = s.context(0)
buf = ctx.new_buffer(1000)
del buf
assert s.leak_report() == [], str(s.leak_report())
s.fail_nth("allocate", 1)
try:
    ctx.new_buffer(1000)
except cudabuf.OutOfMemoryError:
    print("oom")
"""
    env = dict(os.environ, CUDABUF_ALLOCATOR_CACHE="1")
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "oom"


def test_arrow_files_through_a_simulator_leave_nothing(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    feather = pytest.importorskip("pyarrow.feather")
    path = tmp_path / "t.arrow"
    feather.write_feather(pa.table({"x": list(range(1000))}), str(path), compression="zstd")
    s = sim.Simulator()
    batches = cuda.read_ipc_file(path, s.context(0))
    assert s.leak_report() != []
    assert batches[0].to_host().column(0).to_pylist() == list(range(1000))
    del batches
    s.assert_clean()


@pytest.mark.parametrize("fill", [0x00, 0x3C, 0xFF])
def test_the_fill_byte_of_new_device_memory_is_configurable(fill: int) -> None:
    s = sim.Simulator(devices=1, fill=fill)
    assert s.fill == fill
    assert f"fill={fill:#04x}" in repr(s)
    ctx = s.context(0)
    buf = ctx.new_buffer(32)
    assert buf.to_pybytes() == bytes([fill]) * 32
    buf.copy_from_host(b"\x11" * 32)
    del buf
    # New memory again (not the bytes just freed), and pinned memory is zeroed.
    assert ctx.new_buffer(32).to_pybytes() == bytes([fill]) * 32
    assert s.new_host_buffer(8).to_pybytes() == bytes(8)
    s.assert_clean()


def test_the_default_fill_is_uninit_fill() -> None:
    assert sim.Simulator().fill == sim.UNINIT_FILL == 0xA5


@pytest.mark.parametrize("fill", [-1, 256, 1 << 40])
def test_a_fill_that_is_no_byte_raises(fill: int) -> None:
    with pytest.raises(cudabuf.InvalidArgumentError, match="fill"):
        sim.Simulator(fill=fill)
