"""gpu_python_checks.py's timing (no GPU, no cudabuf, PyTorch or CuPy needed)."""

from __future__ import annotations

import gpu_python_checks as gpc


def test_timed_takes_at_least_the_repetitions_and_the_minimum_time() -> None:
    calls = {"fn": 0, "sync": 0}

    def fn() -> None:
        calls["fn"] += 1

    def sync() -> None:
        calls["sync"] += 1

    gpc.timed(fn, sync, 5)
    # One untimed warm-up, then samples until 5 and at least MIN_SECONDS: a call this cheap
    # is timed many more than 5 times, but never more than MAX_SAMPLES.
    assert 5 + 1 < calls["fn"] <= gpc.MAX_SAMPLES + 1
    assert calls["sync"] == calls["fn"]


def test_timed_stops_at_the_repetitions_once_the_minimum_time_is_spent() -> None:
    import time

    calls = {"fn": 0}

    def slow() -> None:
        calls["fn"] += 1
        time.sleep(gpc.MIN_SECONDS)

    median = gpc.timed(slow, lambda: None, 3)
    assert calls["fn"] == 3 + 1, "each call outlasts the minimum time: the repetitions decide"
    assert median >= gpc.MIN_SECONDS


def _run(h2d_ours: float, h2d_torch: float, d2d_cupy: float | None) -> dict[str, object]:
    """A one-size bench.json: cudabuf and PyTorch, and CuPy unless ``d2d_cupy`` is None
    (not installed in that run)."""
    row: dict[str, object] = {
        "cudabuf": {"H2D pinned": h2d_ours, "D2D": 100.0},
        "torch": {"H2D pinned": h2d_torch, "D2D": 90.0},
        "cupy": None if d2d_cupy is None else {"H2D pinned": 1.0, "D2D": d2d_cupy},
    }
    return {"sizes": [4096], "results": {"4 KiB": row}, "notes": []}


def test_merge_takes_the_median_of_each_figure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Each run alone gives another verdict for H2D pinned at 4 KiB (ratios 0.90, 1.00,
    # 0.98): the merged table holds the medians (cudabuf 9.8, PyTorch 10.0: 0.98).
    runs = [_run(9.0, 10.0, 95.0), _run(10.0, 10.0, 120.0), _run(9.8, 10.0, None)]
    merged = gpc.median_of_runs(runs)
    figures = merged["results"]["4 KiB"]
    assert figures["cudabuf"]["H2D pinned"] == 9.8
    assert figures["torch"]["H2D pinned"] == 10.0
    # CuPy ran twice: the median of those two (95 and 120), the missing run left out.
    assert figures["cupy"]["D2D"] == 107.5
    assert merged["runs"] == 3
    table = gpc.render(merged, str(tmp_path))
    curve = {c["operation"]: c for c in table["curve"]}
    assert curve["H2D pinned"]["min_ratio"] == 0.98
    # D2D: cudabuf 100 against the faster peer's median, CuPy's 107.5.
    assert curve["D2D"]["min_ratio"] == round(100.0 / 107.5, 4)
    md = (tmp_path / "bench.md").read_text()
    assert md.startswith("Each figure is the median of 3 runs")
    assert "| H2D pinned | 0.980 | 4 KiB | yes |" in md


def test_merge_also_takes_the_median_of_each_runs_own_ratio(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # D2D, cudabuf 100 in every run: CuPy 95, 120, 105 (PyTorch 90): the medians' ratio
    # is 100/105; each run against its own faster peer: 100/95, 100/120, 100/105, whose
    # median is also 100/105. H2D pinned: ours 9.0, 10.0, 9.8 against PyTorch 10.0 and
    # 10 / 9.0 in turn: see below.
    runs = [_run(9.0, 10.0, 95.0), _run(10.0, 10.0, 120.0), _run(9.8, 10.0, 105.0)]
    runs[1]["results"]["4 KiB"]["torch"]["H2D pinned"] = 9.0
    runs[2]["results"]["4 KiB"]["torch"]["H2D pinned"] = 11.0
    merged = gpc.median_of_runs(runs)
    # H2D pinned: medians 9.8 against 10.0 (0.98); per run 9/10, 10/9, 9.8/11: median 0.9.
    assert merged["run_ratios"]["4 KiB"]["H2D pinned"] == 0.9
    assert merged["run_ratios"]["4 KiB"]["D2D"] == round(100.0 / 105.0, 4)
    table = gpc.render(merged, str(tmp_path))
    curve = {c["operation"]: c for c in table["curve"]}
    assert curve["H2D pinned"]["min_ratio"] == 0.98
    assert curve["H2D pinned"]["min_run_ratio"] == 0.9 and curve["H2D pinned"]["run_ratio_at"] == "4 KiB"
    md = (tmp_path / "bench.md").read_text()
    assert "| H2D pinned | 0.980 | 4 KiB | yes |" in md
    assert "| H2D pinned | 0.900 | 4 KiB | no |" in md
    # A run without CuPy: no per-run ratio there (it would be held to the slower peer).
    gaps = [_run(9.0, 10.0, 95.0), _run(10.0, 10.0, 120.0), _run(9.8, 10.0, None)]
    assert gpc.median_of_runs(gaps)["run_ratios"] == {}
    # One run alone, as it is or merged, has no per-run table.
    single = gpc.render(runs[0], str(tmp_path / "one"))
    assert all("min_run_ratio" not in c for c in single["curve"])
    alone = gpc.render(gpc.median_of_runs([runs[0]]), str(tmp_path / "alone"))
    assert all("min_run_ratio" not in c for c in alone["curve"])
    assert "per-run" not in (tmp_path / "alone" / "bench.md").read_text()


def test_merge_of_no_runs_is_an_error() -> None:
    import pytest

    with pytest.raises(ValueError):
        gpc.median_of_runs([])
