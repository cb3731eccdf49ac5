#!/usr/bin/env python3
"""Curves from cudabuf's benchmark JSON: PNG plots for docs/PERFORMANCE.md.

Reads `perf --json` (cudabuf's figures; `--ours`) and, when given, `bench_compare.py`'s
compare.json (PyTorch's and CuPy's figures from the same run; `--peers`), and
writes these plots into `--out`:

- `perf-<label>-bandwidth.png`: GB/s against size (4 KiB to 1 GiB) for H2D and D2H from
  pinned and from pageable memory and D2D, cudabuf beside PyTorch and CuPy (and the
  driver's own pageable path, or on the simulator a plain memcpy), plus a panel with
  pageable D2H against what bounds it (pinned D2H, the host's multi-threaded memcpy, the
  same into fresh memory);
- `perf-<label>-alloc.png`: microseconds per allocation + free against the number of live
  allocations (0 to 10,000), at 256 B and 1 MiB: cudabuf with its caching allocator on
  and off, a plain `cuMemAlloc` + `cuMemFree`, PyTorch's caching allocator, CuPy's pool,
  `cudaMalloc` + `cudaFree`;
- `perf-<label>-ipc.png`: microseconds per IPC open against the number of handles open
  in the process (0 to 10,000): first open of a new handle, open + close, repeated open;
- `perf-<label>-ratio.png` (with `--peers`): per copy path, cudabuf against the faster of
  PyTorch and CuPy at each size (compare.json's `curve`), with the 0.95 target.

A plot whose figures are all missing is not written (and the script says so); a missing
series is left out of its panel.

Usage:
    python3 scripts/plot_perf.py --ours OUT/perf.json --peers OUT/compare.json --label h200 --out docs
    python3 scripts/plot_perf.py --ours target/bench-logs/sim.json --label sim --out docs
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30

Figure = dict[str, Any]
#: (x values, y values), sorted by x.
Series = tuple[list[float], list[float]]


def human(n: float) -> str:
    n = int(n)
    for unit, name in ((GIB, "G"), (MIB, "M"), (KIB, "K")):
        if n >= unit and n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def size_name(n: int) -> str:
    """`256 B`, `1 MiB`: a size for titles."""
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def series(rows: list[Figure], section: str, op: str, *, size: Optional[int] = None, by: str = "size") -> Series:
    """The figures of `section`/`op` as a curve over `by` (`size` or `x`), at `size` when
    the curve is over `x`; figures without a value are left out."""
    points: dict[float, float] = {}
    for r in rows:
        if r.get("section") != section or r.get("op") != op or r.get("value") is None:
            continue
        if by == "x" and size is not None and r.get("size") != size:
            continue
        at = r.get(by)
        if at is None:
            continue
        points[float(at)] = float(r["value"])
    xs = sorted(points)
    return xs, [points[x] for x in xs]


def best_of(rows: list[Figure], section: str, prefix: str, suffix: str = "") -> Series:
    """The best figure at each size over the ops `<prefix><digits><suffix>` (thread counts)."""
    points: dict[float, float] = {}
    for r in rows:
        op = r.get("op", "")
        if r.get("section") != section or r.get("value") is None or r.get("size") is None:
            continue
        if not (op.startswith(prefix) and op.endswith(suffix)):
            continue
        if not op[len(prefix):len(op) - len(suffix)].isdigit():
            continue
        size = float(r["size"])
        points[size] = max(points.get(size, 0.0), float(r["value"]))
    xs = sorted(points)
    return xs, [points[x] for x in xs]


def load(path: Optional[str]) -> Optional[dict[str, Any]]:
    if not path:
        return None
    if not os.path.exists(path):
        print(f"plot_perf: {path} does not exist; its series are left out", file=sys.stderr)
        return None
    with open(path) as fh:
        doc: dict[str, Any] = json.load(fh)
        return doc


def draw(ax: Axes, curves: list[tuple[str, Series, str]]) -> int:
    """Plot each non-empty (label, series, style); returns how many were drawn."""
    drawn = 0
    for label, (xs, ys), style in curves:
        if xs:
            ax.plot(xs, ys, style, label=label, markersize=4)
            drawn += 1
    if drawn:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    return drawn


def size_axis(ax: Axes, sizes: list[float]) -> None:
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes)
        ax.set_xticklabels([human(s) for s in sizes], fontsize=7, rotation=45)
    ax.set_xlabel("bytes")
    ax.grid(True, which="major", alpha=0.3)


def count_axis(ax: Axes, label: str) -> None:
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(left=0)
    ax.set_xlabel(label)
    ax.set_yscale("log")
    ax.grid(True, which="major", alpha=0.3)


def plot_bandwidth(ours: list[Figure], torch: list[Figure], cupy: list[Figure], title: str, path: str) -> bool:
    ops = [("h2d_pinned", "H2D pinned"), ("d2h_pinned", "D2H pinned"), ("h2d_pageable", "H2D pageable"),
           ("d2h_pageable", "D2H pageable"), ("d2d", "D2D (read + write)")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    drawn = 0
    sizes: set[float] = set()
    for ax, (op, name) in zip(axes.flat, ops):
        curves = [("cudabuf", series(ours, "copies", op), "o-"),
                  ("PyTorch", series(torch, "copies", op), "s--"),
                  ("CuPy", series(cupy, "copies", op), "^--")]
        if op.endswith("pageable"):
            curves.append(("cudabuf, driver's own path", series(ours, "copies", op + "_unstaged"), "x:"))
        if op != "d2d":
            curves.append(("host memcpy, 1 thread (simulator)", series(ours, "copies", "host_memcpy"), ".:"))
        for _, (xs, _), _ in curves:
            sizes.update(xs)
        drawn += draw(ax, curves)
        ax.set_title(name)
        ax.set_ylabel("GB/s (1 GB = 1e9 B)")
    ax = axes.flat[5]
    bound_curves = [("D2H pageable", series(ours, "copies", "d2h_pageable"), "o-"),
                    ("D2H pinned", series(ours, "copies", "d2h_pinned"), "s-"),
                    ("host memcpy, multi-threaded (best)", best_of(ours, "copies", "host_memcpy_mt"), "d--"),
                    ("D2H into a new vector", series(ours, "copies", "d2h_pageable_fresh"), "o:"),
                    ("host memcpy into new memory (best)", best_of(ours, "copies", "host_memcpy_mt", "_fresh"), "d:")]
    drawn += draw(ax, bound_curves)
    ax.set_title("cudabuf's pageable D2H and what bounds it")
    ax.set_ylabel("GB/s")
    for ax in axes.flat:
        size_axis(ax, sorted(sizes))
        ax.set_ylim(bottom=0)
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, path, drawn)


def plot_alloc(ours: list[Figure], torch: list[Figure], cupy: list[Figure], title: str, path: str) -> bool:
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    drawn = 0
    for ax, size in zip(axes.flat, (256, MIB)):
        curves = [
            ("cudabuf new_buffer+drop, cache on", series(ours, "alloc_live", "new_buffer+drop_cached", size=size, by="x"), "o-"),
            ("cudabuf new_buffer+drop, cache off", series(ours, "alloc_live", "new_buffer+drop_uncached", size=size, by="x"), "o--"),
            ("cuMemAlloc+cuMemFree (Rust)", series(ours, "alloc_live", "cuMemAlloc+cuMemFree", size=size, by="x"), "x:"),
            ("PyTorch caching allocator", series(torch, "alloc_live", "caching_allocator_alloc+delete", size=size, by="x"), "s-"),
            ("CuPy pool", series(cupy, "alloc_live", "pool.malloc+del", size=size, by="x"), "^-"),
            ("cudaMalloc+cudaFree (CuPy)", series(cupy, "alloc_live", "cudaMalloc+cudaFree", size=size, by="x"), "^--"),
        ]
        drawn += draw(ax, curves)
        count_axis(ax, "live 64 KiB allocations")
        ax.set_ylabel("us per allocation + free")
        ax.set_title(f"{size_name(size)} allocations")
    fig.suptitle(title)
    fig.tight_layout()
    return save(fig, path, drawn)


def plot_ipc(ours: list[Figure], title: str, path: str) -> bool:
    fig, ax = plt.subplots(1, 1, figsize=(7.5, 5))
    curves = [("first open of a new handle", series(ours, "ipc_scale", "first_open", by="x"), "o-"),
              ("open + close of a new handle", series(ours, "ipc_scale", "open+close", by="x"), "s-"),
              ("repeated open (mapping cache)", series(ours, "ipc_scale", "repeated_open", by="x"), "^-")]
    drawn = draw(ax, curves)
    count_axis(ax, "IPC handles open in the process")
    ax.set_ylabel("us")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save(fig, path, drawn)


def plot_ratio(curve: list[dict[str, Any]], title: str, path: str) -> bool:
    """cudabuf / the faster of PyTorch and CuPy against size, one line per copy path, with the
    0.95 target."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    drawn = 0
    sizes: list[float] = []
    for path_curve in curve:
        points = path_curve.get("points", [])
        if not points:
            continue
        xs = [float(p["size"]) for p in points]
        ax.plot(xs, [float(p["ratio"]) for p in points], marker="o", label=path_curve["op"])
        sizes += xs
        drawn += 1
    if drawn:
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=1, label="0.95 (target)")
        ax.axhline(1.0, color="black", linewidth=0.5)
        size_axis(ax, sizes)
        ax.set_ylabel("cudabuf / faster peer")
        ax.set_title(title)
        ax.legend(fontsize=8)
    return save(fig, path, drawn)


def save(fig: Any, path: str, drawn: int) -> bool:
    if drawn == 0:
        plt.close(fig)
        print(f"plot_perf: nothing measured for {path}: not written", file=sys.stderr)
        return False
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot_perf: wrote {path}")
    return True


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True, help="perf --json output")
    ap.add_argument("--peers", help="bench_compare.py's compare.json (PyTorch and CuPy)")
    ap.add_argument("--out", default="docs", help="where the PNG files go")
    ap.add_argument("--label", default="h200", help="in the file names: perf-<label>-*.png")
    args = ap.parse_args(argv)
    ours_doc = load(args.ours)
    if ours_doc is None:
        return 2
    peers_doc = load(args.peers) or {}
    ours = ours_doc.get("results", [])
    peers = peers_doc.get("peers", {})
    torch, cupy = peers.get("torch", []), peers.get("cupy", [])
    info = ours_doc.get("info", {})
    where = f"{info.get('device', '?')} ({info.get('backend', '?')} backend, {info.get('host_cpus', '?')} host CPUs)"
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"perf-{args.label}")
    written = [
        plot_bandwidth(ours, torch, cupy, f"Copy bandwidth against size\n{where}", base + "-bandwidth.png"),
        plot_alloc(ours, torch, cupy, f"Allocation against live allocations\n{where}", base + "-alloc.png"),
        plot_ipc(ours, f"IPC opens against handles open\n{where}", base + "-ipc.png"),
        plot_ratio(peers_doc.get("curve", []), f"cudabuf against the faster of PyTorch and CuPy\n{where}",
                   base + "-ratio.png"),
    ]
    return 0 if any(written) else 1


if __name__ == "__main__":
    sys.exit(main())
