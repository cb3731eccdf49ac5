"""bench_compare.py's comparison (no GPU, no PyTorch or CuPy needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import bench_compare as bc

MIB, GIB = 1 << 20, 1 << 30


def fig(section: str, op: str, size: Optional[int], value: Optional[float], x: Optional[int] = None) -> dict[str, Any]:
    return bc.figure(section, op, size, value, "", 1, x=x) if value is not None else dict(
        section=section, op=op, size=size, x=x, value=None, unit="", samples=0)


def test_parse_sizes_binary_units() -> None:
    assert bc.parse_sizes("4K,1M,1G,300,64MiB") == [4096, MIB, GIB, 300, 64 * MIB]
    assert bc.parse_sizes(bc.CURVE_SIZES)[0] == 4096 and bc.parse_sizes(bc.CURVE_SIZES)[-1] == GIB


def test_find_matches_section_op_size_and_x() -> None:
    rows = [fig("alloc_live", "a", 256, 1.0, x=10), fig("alloc_live", "a", 256, 2.0), fig("copies", "a", 256, None)]
    assert bc.find(rows, "alloc_live", "a", 256, x=10) == 1.0
    assert bc.find(rows, "alloc_live", "a", 256) == 2.0
    assert bc.find(rows, "copies", "a", 256) is None


def test_best_host_memcpy_over_thread_counts() -> None:
    rows = [fig("copies", "host_memcpy_mt8", GIB, 30.0), fig("copies", "host_memcpy_mt16", GIB, 35.0),
            fig("copies", "host_memcpy_mt16_fresh", GIB, 9.0), fig("copies", "host_memcpy", GIB, 99.0)]
    assert bc.best_host_memcpy(rows, GIB) == 35.0
    assert bc.best_host_memcpy(rows, GIB, "_fresh") == 9.0
    assert bc.best_host_memcpy(rows, MIB) is None


def pageable_row(d2h_pageable: float, d2h_pinned: float, memcpy: Optional[float]) -> bc.Row:
    ours = [fig("copies", "d2h_pageable", GIB, d2h_pageable), fig("copies", "d2h_pinned", GIB, d2h_pinned)]
    if memcpy is not None:
        ours.append(fig("copies", "host_memcpy_mt12", GIB, memcpy))
    rows = bc.compare_copies(ours, [], [], [GIB])
    return next(r for r in rows if r.what == "d2h_pageable")


def test_pageable_target_is_pinned_or_the_host_bound() -> None:
    assert pageable_row(45.0, 55.0, None).met is True
    assert pageable_row(30.0, 55.0, 32.0).met is True, "within 10% of the host's memcpy"
    assert pageable_row(30.0, 55.0, 40.0).met is False
    row = pageable_row(30.0, 55.0, 40.0)
    assert row.bound == 40.0 and "memcpy" in row.bound_what


def test_alloc_compares_like_with_like() -> None:
    ours = [fig("alloc", "new_buffer+drop_uncached", 256, 85.0), fig("alloc", "new_buffer+drop_uncached_neighbour", 256, 3.0),
            fig("alloc", "cuMemAlloc+cuMemFree", 256, 84.0)]
    cupy = [fig("alloc", "cudaMalloc+cudaFree", 256, 88.0), fig("alloc", "cudaMalloc+cudaFree_neighbour", 256, 2.6),
            fig("alloc", "cudaMalloc+cudaFree_pool_holds_block", 256, 2.5)]
    rows = {r.what: r for r in bc.compare_alloc(ours, [], cupy) if r.size == 256}
    alone = rows["new_buffer+drop (cache off) vs cudaMalloc+cudaFree, alone"]
    assert (alone.ours, alone.cupy, alone.bound) == (85.0, 88.0, 84.0)
    near = rows["new_buffer+drop (cache off) vs cudaMalloc+cudaFree, beside a live 64 KiB allocation"]
    assert (near.ours, near.cupy) == (3.0, 2.6)
    assert rows["cudaMalloc+cudaFree beside a block CuPy's pool holds (the old peer column)"].cupy == 2.5


def arrow_doc() -> dict[str, Any]:
    return {"info": {"message_bytes": 64 * MIB}, "results": [
        {"op": "buffer_from_data (pageable)", "gbps": 40.0, "baseline": None, "ratio": None, "target": None},
        {"op": "serialize_record_batch", "gbps": 38.0, "baseline": "buffer_from_data (pageable)", "ratio": 0.95, "target": 0.9},
        {"op": "copy_to_host (existing memory)", "gbps": 36.0, "baseline": None, "ratio": None, "target": None},
        {"op": "read_record_batch + to_host", "gbps": 20.0, "baseline": "copy_to_host (existing memory)", "ratio": 0.55,
         "target": 0.8},
        {"op": "copy_from_host_batch (columns)", "gbps": 41.0, "baseline": "buffer_from_data (pageable)", "ratio": 1.02,
         "target": None},
    ]}


def test_arrow_rows_hold_each_figure_to_its_baseline() -> None:
    rows = {r.what: r for r in bc.compare_arrow(arrow_doc())}
    assert rows["arrow: serialize_record_batch"].met is True
    assert rows["arrow: serialize_record_batch"].bound == 40.0
    assert rows["arrow: read_record_batch + to_host"].met is False
    assert rows["arrow: copy_from_host_batch (columns)"].met is None
    assert bc.compare_arrow(None) == []


def test_table_has_a_line_per_row_and_marks_missed_targets() -> None:
    rows = [bc.Row("a", MIB, 1.0, 2.0, None, "GB/s", ">= 1x", False, bound=4.0, bound_what="b")]
    text = bc.table(rows)
    assert text.count("\n") == 2
    assert "**MISSED**" in text and "4.00 (b)" in text and "0.50" in text and "0.25" in text


def test_compare_only_writes_the_table_from_earlier_figures(tmp_path: Path) -> None:
    ours = tmp_path / "perf.json"
    ours.write_text(json.dumps({"info": {}, "results": [fig("copies", "d2h_pinned", GIB, 55.0)],
                                "not_run": {"peer": "needs 2 devices"}}))
    peers = tmp_path / "compare.json"
    peers.write_text(json.dumps({"info": {"torch": "2.11"}, "peers": {"torch": [fig("copies", "d2h_pinned", GIB, 54.0)],
                                                                     "cupy": []}}))
    arrow = tmp_path / "arrow.json"
    arrow.write_text(json.dumps(arrow_doc()))
    out = tmp_path / "out"
    assert bc.main(["--compare-only", "--ours", str(ours), "--peers", str(peers), "--arrow", str(arrow),
                    "--out", str(out), "--sizes", "1G", "--skip-peer"]) == 0
    md = (out / "compare.md").read_text()
    assert "| d2h_pinned | 1 GiB | 55.0 | 54.0 |" in md
    assert "arrow: serialize_record_batch" in md
    assert "peer section did not run: needs 2 devices" in md
    saved = json.loads((out / "compare.json").read_text())
    assert saved["peers"]["torch"][0]["value"] == 54.0


def test_rounds_take_the_median_of_each_figure() -> None:
    rounds = [[fig("copies", "h2d_pageable", 256 << 10, v), fig("copies", "d2d", GIB, 2000.0)] for v in (8.1, 9.9, 8.6)]
    rounds[1].append(fig("copies", "h2d_pinned", GIB, 55.0))  # only one round has it
    merged = bc.median_of_rounds(rounds)
    assert bc.find(merged, "copies", "h2d_pageable", 256 << 10) == 8.6
    assert bc.find(merged, "copies", "d2d", GIB) == 2000.0
    assert bc.find(merged, "copies", "h2d_pinned", GIB) == 55.0
    row = next(r for r in merged if r["op"] == "h2d_pageable")
    assert row["rounds"] == 3 and row["values"] == [8.1, 9.9, 8.6] and row["samples"] == 3
    assert bc.median_of_rounds([rounds[0]]) is rounds[0], "one round comes back as it is"


def test_compare_only_over_rounds_holds_medians_against_medians(tmp_path: Path) -> None:
    size = 256 << 10
    ours_paths, peer_paths = [], []
    # Each round alone would say something else: 0.83, 1.21, 0.98 of CuPy.
    for k, (ours_v, cupy_v) in enumerate(((8.1, 9.8), (9.9, 8.2), (8.6, 8.8))):
        ours = tmp_path / f"perf{k}.json"
        ours.write_text(json.dumps({"info": {"gpu": "x"}, "summary": {"one run's": k},
                                    "results": [fig("copies", "h2d_pageable", size, ours_v)],
                                    "not_run": {"peer": "needs 2 devices"} if k == 2 else {}}))
        peers = tmp_path / f"compare{k}.json"
        peers.write_text(json.dumps({"info": {"cupy": "14"}, "peers": {
            "torch": [fig("copies", "h2d_pageable", size, 6.0 + k)], "cupy": [fig("copies", "h2d_pageable", size, cupy_v)]}}))
        ours_paths.append(str(ours))
        peer_paths.append(str(peers))
    out = tmp_path / "out"
    assert bc.main(["--compare-only", "--ours", *ours_paths, "--peers", *peer_paths, "--out", str(out),
                    "--sizes", "256K", "--skip-peer"]) == 0
    saved = json.loads((out / "compare.json").read_text())
    point = next(p for p in saved["curve"] if p["op"] == "h2d_pageable")["points"][0]
    assert point["ours"] == 8.6 and point["faster_peer"] == 8.8
    assert abs(point["ratio"] - 8.6 / 8.8) < 1e-12
    assert saved["info"]["peer_rounds"] == 3 and saved["info"]["ours"]["rounds"] == 3
    assert saved["peers"]["torch"][0]["value"] == 7.0
    assert "peer section did not run: needs 2 devices" in (out / "compare.md").read_text()
    assert "the median of 3 runs of cudabuf's perf and 3 of the peers'" in (out / "compare.md").read_text()
    median_doc = json.loads((out / "perf-median.json").read_text())
    assert bc.find(median_doc["results"], "copies", "h2d_pageable", size) == 8.6
    assert median_doc["info"]["rounds"] == 3 and median_doc["not_run"] == {"peer": "needs 2 devices"}
    assert "summary" not in median_doc, "one run's summary does not pass for the medians'"


def write_rounds(tmp_path: Path, pairs: list[tuple[float, float]], size: int) -> tuple[list[str], list[str]]:
    """One perf.json and one compare.json per round: cudabuf's h2d_pageable figure and
    CuPy's (PyTorch slower in every round)."""
    ours_paths, peer_paths = [], []
    for k, (ours_v, cupy_v) in enumerate(pairs):
        ours = tmp_path / f"perf{k}.json"
        ours.write_text(json.dumps({"info": {}, "results": [fig("copies", "h2d_pageable", size, ours_v)]}))
        peers = tmp_path / f"compare{k}.json"
        peers.write_text(json.dumps({"info": {}, "peers": {
            "torch": [fig("copies", "h2d_pageable", size, 1.0)], "cupy": [fig("copies", "h2d_pageable", size, cupy_v)]}}))
        ours_paths.append(str(ours))
        peer_paths.append(str(peers))
    return ours_paths, peer_paths


def test_rounds_pair_up_for_the_median_of_per_round_ratios(tmp_path: Path) -> None:
    size = MIB
    # Medians 10 against 10 (ratio 1.0); each round against its own peer: 9/11, 10/9, 11/10,
    # whose median is 1.1. Paired any other way the figures would give another median.
    ours_paths, peer_paths = write_rounds(tmp_path, [(9.0, 11.0), (10.0, 9.0), (11.0, 10.0)], size)
    out = tmp_path / "out"
    assert bc.main(["--compare-only", "--ours", *ours_paths, "--peers", *peer_paths, "--out", str(out),
                    "--sizes", "1M", "--skip-peer"]) == 0
    path = next(p for p in json.loads((out / "compare.json").read_text())["curve"] if p["op"] == "h2d_pageable")
    assert abs(path["points"][0]["ratio"] - 1.0) < 1e-12
    assert abs(path["points"][0]["round_ratio"] - 1.1) < 1e-12
    assert abs(path["min_round_ratio"] - 1.1) < 1e-12 and path["min_round_at"] == size and path["met_rounds"]
    md = (out / "compare.md").read_text()
    assert "| h2d_pageable | 1.100 | 1 MiB | 1 MiB 1.10 | yes |" in md


def test_rounds_that_do_not_pair_up_give_no_per_round_ratios(tmp_path: Path) -> None:
    ours_paths, peer_paths = write_rounds(tmp_path, [(9.0, 11.0), (10.0, 9.0), (11.0, 10.0)], MIB)
    out = tmp_path / "out"
    # One peer file missing: the rounds left cannot be paired by position.
    assert bc.main(["--compare-only", "--ours", *ours_paths, "--peers", peer_paths[0], str(tmp_path / "gone.json"),
                    peer_paths[2], "--out", str(out), "--sizes", "1M", "--skip-peer"]) == 0
    path = next(p for p in json.loads((out / "compare.json").read_text())["curve"] if p["op"] == "h2d_pageable")
    assert "min_round_ratio" not in path and "round_ratio" not in path["points"][0]
    assert "per-round ratios" not in (out / "compare.md").read_text()


def test_a_measuring_run_without_compare_only_writes_its_table(tmp_path: Path) -> None:
    # No peers measured (both skipped): cudabuf's figures alone, through the whole of main.
    ours_paths, _ = write_rounds(tmp_path, [(9.0, 11.0)], MIB)
    out = tmp_path / "out"
    assert bc.main(["--ours", ours_paths[0], "--skip-torch", "--skip-cupy", "--skip-peer", "--out", str(out),
                    "--sizes", "1M"]) == 0
    saved = json.loads((out / "compare.json").read_text())
    assert saved["peers"] == {"torch": [], "cupy": []} and saved["curve"] == []


def test_a_round_without_the_figure_gives_no_per_round_ratio(tmp_path: Path) -> None:
    ours_paths, peer_paths = write_rounds(tmp_path, [(9.0, 11.0), (10.0, 9.0), (11.0, 10.0)], MIB)
    Path(ours_paths[1]).write_text(json.dumps({"info": {}, "results": [fig("copies", "h2d_pageable", MIB, None)]}))
    out = tmp_path / "out"
    assert bc.main(["--compare-only", "--ours", *ours_paths, "--peers", *peer_paths, "--out", str(out),
                    "--sizes", "1M", "--skip-peer"]) == 0
    path = next(p for p in json.loads((out / "compare.json").read_text())["curve"] if p["op"] == "h2d_pageable")
    assert path["points"][0]["round_ratio"] is None and "min_round_ratio" not in path


def test_a_round_without_its_faster_peer_gives_no_per_round_ratio(tmp_path: Path) -> None:
    ours_paths, peer_paths = write_rounds(tmp_path, [(9.0, 11.0), (10.0, 9.0), (11.0, 10.0)], MIB)
    doc = json.loads(Path(peer_paths[0]).read_text())
    doc["peers"]["cupy"] = []  # CuPy did not run in round 1: held to PyTorch it would read 9.0
    Path(peer_paths[0]).write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert bc.main(["--compare-only", "--ours", *ours_paths, "--peers", *peer_paths, "--out", str(out),
                    "--sizes", "1M", "--skip-peer"]) == 0
    path = next(p for p in json.loads((out / "compare.json").read_text())["curve"] if p["op"] == "h2d_pageable")
    assert path["points"][0]["round_ratio"] is None


def test_copies_warm_up_for_calls_and_for_time(monkeypatch: Any) -> None:
    # A copy warms up for its warm-up calls and then for the least warm-up time, as perf's do.
    calls = 0

    def f() -> None:
        nonlocal calls
        calls += 1

    bc.time_calls(f, warmup=2, min_reps=1, max_reps=1, budget_s=0.0)
    assert calls == 3  # two warm-up calls and one timed call
    calls = 0
    bc.time_calls(f, warmup=2, min_reps=1, max_reps=1, budget_s=0.0, warm_s=0.02)
    assert calls > 3  # warm-up calls went on for 20 ms
    monkeypatch.setenv(bc.COPY_WARM_VAR, "0")
    assert bc.copy_budget(MIB)["warm_s"] == 0.0
    monkeypatch.setenv(bc.COPY_WARM_VAR, "25")
    assert bc.copy_budget(GIB)["warm_s"] == 0.025
    monkeypatch.delenv(bc.COPY_WARM_VAR)
    assert bc.copy_budget(MIB)["warm_s"] == bc.COPY_WARM_MS / 1000.0
