"""Tests of scripts/streams_overlap_torch.py's pure parts (no GPU, no PyTorch needed):
`python3 -m pytest scripts/test_streams_overlap_torch.py`."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import streams_overlap_torch as so  # noqa: E402

MIB, GIB = so.MIB, so.GIB


def test_parse_size_takes_binary_units() -> None:
    assert so.parse_size("64M") == 64 * MIB
    assert so.parse_size("1G") == GIB
    assert so.parse_size("8MiB") == 8 * MIB
    assert so.parse_size(" 4096 ") == 4096
    for bad in ["", "lots", "0", "-1M"]:
        with pytest.raises(ValueError):
            so.parse_size(bad)


def test_human_names_whole_units() -> None:
    assert so.human(256 * MIB) == "256 MiB"
    assert so.human(GIB) == "1 GiB"
    assert so.human(1000) == "1000 B"


def test_time_median_respects_the_budget() -> None:
    ticks = iter(range(10_000))
    calls = []

    def clock() -> float:
        return float(next(ticks)) * 0.001

    n_warm, lo, hi, _ = so.budget(64 * MIB)
    secs, n = so.time_median(64 * MIB, lambda: calls.append(1), clock)
    assert lo <= n <= hi
    assert len(calls) == n + n_warm
    assert secs == pytest.approx(0.001)


def rates(h2d: float, d2h: float, both: float, size: int = 64 * MIB) -> list[so.Record]:
    return [
        so.Record("one_way", "h2d", size, h2d, "GB/s", 10),
        so.Record("one_way", "d2h", size, d2h, "GB/s", 10),
        so.Record("bidirectional", "two_streams", size, both, "GB/s", 10),
    ]


def test_derived_ratio_divides_by_the_faster_direction() -> None:
    records = rates(50.0, 55.0, 99.0)
    records += [
        so.Record("upload", "pipelined", GIB, 52.0, "GB/s", 5),
        so.Record("upload", "serial", GIB, 48.0, "GB/s", 5),
    ]
    so.derived(records, [64 * MIB], GIB, 10)
    assert so.find(records, "bidirectional", "ratio_to_one_way", 64 * MIB) == pytest.approx(99 / 55)
    assert so.find(records, "upload", "pipelined_over_serial", GIB) == pytest.approx(52 / 48)
    assert so.find(records, "upload", "pipelined_over_one_way_h2d", GIB) == pytest.approx(52 / 50)


def test_compare_marks_the_target_met_or_missed() -> None:
    ours = rates(50.0, 50.0, 95.0)
    theirs = rates(50.0, 50.0, 80.0)
    so.derived(ours, [64 * MIB], GIB, 10)
    so.derived(theirs, [64 * MIB], GIB, 10)
    rows = {(r.section, r.op): r for r in so.compare(ours, theirs)}
    ratio = rows[("bidirectional", "ratio_to_one_way")]
    assert ratio.ours == pytest.approx(1.9)
    assert ratio.torch == pytest.approx(1.6)
    assert ratio.met == "yes (torch no)"
    assert ratio.target == ">= 1.7x"
    assert rows[("one_way", "h2d")].ratio == pytest.approx(1.0)
    missed = so.compare(rates(50.0, 50.0, 60.0) + [so.Record("bidirectional", "ratio_to_one_way", 64 * MIB, 1.2, "x", 1)], [])
    assert [r.met for r in missed if r.op == "ratio_to_one_way"] == ["**MISSED**"]
    assert all(r.torch is None and r.ratio is None for r in missed)


def test_markdown_has_one_line_per_row() -> None:
    rows = so.compare(rates(50.0, 50.0, 95.0), [])
    table = so.markdown(rows, "heading")
    lines = table.strip().splitlines()
    assert lines[0] == "heading"
    assert len([line for line in lines if line.startswith("| one_way")]) == 2
    assert "| 64 MiB | 50.0 | - |" in table


def test_main_uses_the_benchs_sizes_and_writes_the_table(tmp_path: Path) -> None:
    ours = {
        "info": {"sizes": [8 * MIB], "upload": 64 * MIB, "chunk": 4 * MIB, "device": "NVIDIA H200"},
        "results": [
            {"section": "one_way", "op": "h2d", "size": 8 * MIB, "value": 40.0, "unit": "GB/s", "samples": 10},
            {"section": "bidirectional", "op": "ratio_to_one_way", "size": 8 * MIB, "value": 1.8, "unit": "x", "samples": 10},
        ],
        "not_run": {},
    }
    path = tmp_path / "ours.json"
    path.write_text(json.dumps(ours))
    seen = []

    def fake(sizes: Sequence[int], upload: int, chunk: int) -> list[so.Record]:
        seen.append((list(sizes), upload, chunk))
        return [so.Record("one_way", "h2d", 8 * MIB, 50.0, "GB/s", 10)]

    status = so.main(["--ours", str(path), "--out", str(tmp_path)], measure=fake)
    assert status == 0
    assert seen == [([8 * MIB], 64 * MIB, 4 * MIB)]
    table = (tmp_path / "streams_compare.md").read_text()
    assert "NVIDIA H200" in table
    assert "| one_way | h2d | 8 MiB | 40.0 | 50.0 | GB/s | 0.80 |" in table
    assert "| bidirectional | ratio_to_one_way | 8 MiB | 1.80 | - | x | - | >= 1.7x | yes |" in table
    assert json.loads((tmp_path / "streams_torch.json").read_text())["results"][0]["value"] == 50.0


def test_main_reports_a_side_that_did_not_run(tmp_path: Path) -> None:
    path = tmp_path / "ours.json"
    path.write_text(json.dumps({"info": {}, "results": [], "not_run": {"all": "no CUDA driver"}}))

    def broken(sizes: Sequence[int], upload: int, chunk: int) -> list[so.Record]:
        raise RuntimeError("torch.cuda.is_available() is False")

    status = so.main(["--ours", str(path), "--out", str(tmp_path)], measure=broken)
    assert status == 1
    table = (tmp_path / "streams_compare.md").read_text()
    assert "no CUDA driver" in table
    assert "PyTorch side did not run: RuntimeError" in table
    assert json.loads((tmp_path / "streams_torch.json").read_text())["not_run"].startswith("RuntimeError")


class FakeTensor:
    """Enough of a uint8 `torch.Tensor` (over NumPy) for `measure_torch`'s code paths."""

    def __init__(self, array: "np.ndarray[Any, Any]") -> None:
        self.a = array

    def fill_(self, value: int) -> "FakeTensor":
        self.a[...] = value
        return self

    def copy_(self, src: "FakeTensor", non_blocking: bool = False) -> "FakeTensor":
        assert non_blocking, "the pattern uses non-blocking copies"
        self.a[...] = src.a
        return self

    def __getitem__(self, key: slice) -> "FakeTensor":
        return FakeTensor(self.a[key])

    def __eq__(self, other: object) -> "FakeTensor":  # type: ignore[override]
        return FakeTensor(self.a == other)

    def all(self) -> bool:
        return bool(self.a.all())


def fake_torch() -> types.ModuleType:
    """A `torch` module whose streams run copies at once (enough to run the code paths)."""
    torch = types.ModuleType("torch")
    cuda = types.ModuleType("torch.cuda")
    torch.uint8 = np.uint8  # type: ignore[attr-defined]

    def empty(size: int, dtype: Any, pin_memory: bool = False, device: str = "cpu") -> FakeTensor:
        assert pin_memory or device == "cuda", "host tensors are pinned"
        return FakeTensor(np.full(size, 0xA5, dtype=np.uint8))

    def full(shape: tuple[int], value: int, dtype: Any, device: str) -> FakeTensor:
        return FakeTensor(np.full(shape, value, dtype=np.uint8))

    def zeros(size: int, dtype: Any, device: str) -> FakeTensor:
        return FakeTensor(np.zeros(size, dtype=np.uint8))

    class Stream:
        def synchronize(self) -> None: ...

        def wait_event(self, event: "Event") -> None:
            assert event.recorded, "waits for a recorded event"

    class Event:
        recorded = False

        def record(self, stream: Stream) -> None:
            assert isinstance(stream, Stream)
            self.recorded = True

        def synchronize(self) -> None: ...

    @contextlib.contextmanager
    def stream(s: Stream) -> Iterator[None]:
        assert isinstance(s, Stream)
        yield

    torch.empty = empty  # type: ignore[attr-defined]
    torch.full = full  # type: ignore[attr-defined]
    torch.zeros = zeros  # type: ignore[attr-defined]
    cuda.Stream = Stream  # type: ignore[attr-defined]
    cuda.Event = Event  # type: ignore[attr-defined]
    cuda.stream = stream  # type: ignore[attr-defined]
    cuda.is_available = lambda: True  # type: ignore[attr-defined]
    cuda.synchronize = lambda: None  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    return torch


def test_measure_torch_runs_every_pattern_and_checks_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch())
    records = so.measure_torch([1 * MIB, 2 * MIB], 5 * MIB + 3, MIB)
    ops = {(r.section, r.op, r.size) for r in records}
    for size in (MIB, 2 * MIB):
        for section, op in [
            ("one_way", "h2d"),
            ("one_way", "d2h"),
            ("bidirectional", "two_streams"),
            ("bidirectional", "same_stream"),
            ("bidirectional", "ratio_to_one_way"),
        ]:
            assert (section, op, size) in ops
    for op in ["pipelined", "serial", "pipelined_over_serial", "pipelined_over_one_way_h2d"]:
        assert ("upload", op, 5 * MIB + 3) in ops
    assert all(r.value > 0 for r in records)
