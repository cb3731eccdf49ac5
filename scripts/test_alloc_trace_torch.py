"""Tests of scripts/alloc_trace_torch.py that need neither PyTorch nor a GPU:
`python3 -m pytest scripts/test_alloc_trace_torch.py`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alloc_trace_torch as att  # noqa: E402

TRACE = """# cudabuf allocation trace v1 seed=42 allocs=3 min=256 max=67108864 max_live=200
a 0 256
a 1 4096
f 0
a 2 67108864
f 2
f 1
"""

OURS = {
    "backend": "sim",
    "trace_header": "cudabuf allocation trace v1 seed=42 allocs=3 min=256 max=67108864 max_live=200",
    "op_median_us": 0.37,
    "op_p99_us": 0.9,
    "alloc_median_us": 0.18,
    "alloc_p99_us": 0.46,
    "free_median_us": 0.19,
    "free_p99_us": 0.57,
    "hit_rate": 0.9988,
    "hits": 99880,
    "misses": 120,
    "peak_reserved_bytes": 1928 << 20,
    "peak_requested_bytes": 1626 << 20,
    "reserved_over_requested": 1.186,
    "wall_s": 6.3,
    "timer_overhead_ns": 20.0,
}


def test_parse_trace_reads_events_and_header() -> None:
    header, events = att.parse_trace(TRACE.splitlines())
    assert header.startswith("cudabuf allocation trace v1 seed=42")
    assert events[0] == att.Event(True, 0, 256)
    assert events[2] == att.Event(False, 0)
    assert [e.alloc for e in events] == [True, True, False, True, False, False]
    assert sum(e.size for e in events) == 256 + 4096 + (64 << 20)


@pytest.mark.parametrize(
    "lines, what",
    [
        (["a 1 10"], "count up"),
        (["a 0 10", "f 0", "f 0"], "not live"),
        (["f 0"], "not live"),
        (["a 0"], "not an event"),
        (["a 0 0"], "no size"),
        (["a 0 x"], "no size"),
        (["z 0 1"], "not an event"),
        (["f"], "not an event"),
    ],
)
def test_parse_trace_refuses_malformed_traces(lines: list[str], what: str) -> None:
    with pytest.raises(att.TraceError, match=what):
        att.parse_trace(lines)


def test_quantile_is_nearest_rank_like_the_rust_replay() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert att.quantile(samples, 0.5) == 50.0
    assert att.quantile(samples, 0.99) == 99.0
    assert att.quantile(samples, 1.0) == 100.0
    assert att.quantile([7.0], 0.99) == 7.0
    assert att.quantile([], 0.5) != att.quantile([], 0.5)  # NaN


def test_timings_summary_in_microseconds() -> None:
    t = att.Timings(op_ns=[3000.0, 1000.0, 2000.0], alloc_ns=[500.0] * 3, free_ns=[1500.0] * 3)
    s = t.summary()
    assert s["op_median_us"] == 2.0
    assert s["op_p99_us"] == 3.0
    assert s["alloc_median_us"] == 0.5
    assert s["ops"] == 3.0


def test_markdown_table_judges_cudabuf_against_the_targets() -> None:
    torch_figures = dict(OURS, op_median_us=4.6, reserved_over_requested=1.28, hit_rate=0.95)
    table = att.markdown_table(OURS, torch_figures)
    assert "| alloc+free median | 0.370 us | 4.600 us | <= 1.0 us | met |" in table
    assert "| hit rate | 99.88% (120 misses) | 95.00% (120 misses) | >= 90% | met |" in table
    assert "1.186 (1928.0 / 1626.0 MiB)" in table
    slow = dict(OURS, op_median_us=1.5, reserved_over_requested=1.4)
    table = att.markdown_table(slow, None, "PyTorch did NOT run: no GPU")
    assert "| alloc+free median | 1.500 us | - | <= 1.0 us | MISSED |" in table
    ratio_row = next(r for r in table.splitlines() if r.startswith("| peak reserved"))
    assert ratio_row.endswith("| <= 1.3 | MISSED |")
    assert table.rstrip().endswith("PyTorch did NOT run: no GPU")


def test_main_without_pytorch_says_why_and_keeps_our_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text(TRACE)
    ours = tmp_path / "ours.json"
    ours.write_text(json.dumps(OURS))
    md = tmp_path / "table.md"

    def no_torch(events: object, device: str) -> dict[str, object]:
        raise RuntimeError("PyTorch is not installed (test)")

    monkeypatch.setattr(att, "replay_torch", no_torch)
    status = att.main(["--trace", str(trace), "--ours", str(ours), "--markdown", str(md)])
    assert status == 2
    err = capsys.readouterr().err
    assert "PyTorch did NOT run: PyTorch is not installed (test)" in err
    text = md.read_text()
    assert "0.370 us | - |" in text
    assert "PyTorch did NOT run" in text
