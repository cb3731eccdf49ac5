"""plot_perf.py on JSON shaped like perf's and bench_compare's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import plot_perf

MIB = 1 << 20


def fig(section: str, op: str, size: Optional[int], value: Optional[float], x: Optional[int] = None) -> dict[str, Any]:
    return dict(section=section, op=op, size=size, x=x, value=value, unit="", samples=1)


def ours_doc() -> dict[str, Any]:
    rows = []
    for size in (4096, MIB, 64 * MIB):
        for op in ("h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable", "d2d", "d2h_pageable_fresh"):
            rows.append(fig("copies", op, size, size / MIB + 1))
        rows.append(fig("copies", "host_memcpy_mt4", size, 10.0))
        rows.append(fig("copies", "host_memcpy_mt16", size, 20.0))
    for live in (0, 1, 10):
        for size in (256, MIB):
            rows.append(fig("alloc_live", "new_buffer+drop_cached", size, 0.2, x=live))
            rows.append(fig("alloc_live", "new_buffer+drop_uncached", size, 80.0 + live, x=live))
        rows.append(fig("ipc_scale", "first_open", 64 * 1024, 100.0 + live, x=live))
    return {"info": {"device": "test GPU", "backend": "cuda", "host_cpus": 16}, "results": rows}


def peers_doc() -> dict[str, Any]:
    torch = [fig("copies", "h2d_pinned", s, 50.0) for s in (4096, MIB, 64 * MIB)]
    torch += [fig("alloc_live", "caching_allocator_alloc+delete", 256, 4.0, x=x) for x in (0, 1, 10)]
    cupy = [fig("alloc_live", "cudaMalloc+cudaFree", MIB, 88.0, x=x) for x in (0, 1, 10)]
    return {"info": {}, "peers": {"torch": torch, "cupy": cupy}, "rows": []}


def test_series_picks_one_op_sorted_and_skips_missing_values() -> None:
    rows = [fig("copies", "d2d", 8, 3.0), fig("copies", "d2d", 2, 1.0), fig("copies", "d2d", 4, None),
            fig("copies", "h2d_pinned", 4, 9.0), fig("other", "d2d", 16, 5.0)]
    assert plot_perf.series(rows, "copies", "d2d") == ([2.0, 8.0], [1.0, 3.0])
    assert plot_perf.series(rows, "copies", "missing") == ([], [])


def test_series_over_x_keeps_one_size() -> None:
    rows = [fig("alloc_live", "a", 256, 1.0, x=10), fig("alloc_live", "a", MIB, 7.0, x=10),
            fig("alloc_live", "a", 256, 2.0, x=0)]
    assert plot_perf.series(rows, "alloc_live", "a", size=256, by="x") == ([0.0, 10.0], [2.0, 1.0])


def test_best_of_takes_the_best_thread_count_only_from_numbered_ops() -> None:
    rows = [fig("copies", "host_memcpy_mt4", MIB, 10.0), fig("copies", "host_memcpy_mt16", MIB, 20.0),
            fig("copies", "host_memcpy_mt16_fresh", MIB, 99.0), fig("copies", "host_memcpy", MIB, 50.0)]
    assert plot_perf.best_of(rows, "copies", "host_memcpy_mt") == ([float(MIB)], [20.0])
    assert plot_perf.best_of(rows, "copies", "host_memcpy_mt", "_fresh") == ([float(MIB)], [99.0])


def test_main_writes_the_three_plots(tmp_path: Path) -> None:
    ours, peers = tmp_path / "perf.json", tmp_path / "compare.json"
    ours.write_text(json.dumps(ours_doc()))
    peers.write_text(json.dumps(peers_doc()))
    out = tmp_path / "docs"
    assert plot_perf.main(["--ours", str(ours), "--peers", str(peers), "--out", str(out), "--label", "t"]) == 0
    for name in ("bandwidth", "alloc", "ipc"):
        png = out / f"perf-t-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_main_without_peers_or_figures(tmp_path: Path) -> None:
    ours = tmp_path / "perf.json"
    ours.write_text(json.dumps(ours_doc()))
    out = tmp_path / "docs"
    assert plot_perf.main(["--ours", str(ours), "--peers", str(tmp_path / "absent.json"), "--out", str(out)]) == 0
    assert (out / "perf-h200-bandwidth.png").exists()
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"info": {}, "results": []}))
    assert plot_perf.main(["--ours", str(empty), "--out", str(tmp_path / "none"), "--label", "e"]) == 1
    assert not (tmp_path / "none" / "perf-e-bandwidth.png").exists()
    assert plot_perf.main(["--ours", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
