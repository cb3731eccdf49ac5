#!/usr/bin/env python3
"""The curves of files to the device: GB/s against file size, warm and cold, cudabuf
beside the bound measured in the same run (the host's parallel read) and the peers.

Reads the JSON of `cargo bench --bench files` (``--ours``) and of
`scripts/bench_files.py` (``--peers``, any number), writes ``OUT/files-LABEL-read.png``.

Usage:
    python3 scripts/plot_files.py --ours files.json --peers files_py.json --label h200 --out docs
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MIB = 1 << 20

# (label in the plot, path names in the JSON: the first one found is drawn)
CURVES = {
    "warm": [
        ("host parallel pread (the bound)", ["host pread, parallel, into one buffer (warm)"]),
        ("cudabuf read_file_at", ["cudabuf read_file_at (warm)"]),
        ("cudabuf, first call of a context", ["cudabuf read_file_at, first call of a context (warm)"]),
        ("no pinning: pread + pageable copy", ["no pinning: pread + pageable copy, parallel (warm)"]),
        ("no pinning, on a new context", ["no pinning, on a new context (warm)"]),
        ("KvikIO CuFile.pread (defaults)", ["KvikIO CuFile.pread (warm)"]),
        ("KvikIO, 8 threads, 8 MiB tasks", ["KvikIO CuFile.pread, 8 threads, 8 MiB tasks (warm)"]),
        ("torch.from_file().cuda()", ["torch.from_file().cuda() (warm)"]),
        ("cupy.asarray(np.fromfile())", ["cupy.asarray(np.fromfile()) (warm)"]),
    ],
    "cold": [
        ("host parallel pread (the disk)", ["host pread, parallel (cold)"]),
        ("cudabuf, page cache", ["cudabuf read_file_at (cold, page cache)"]),
        ("cudabuf, O_DIRECT", ["cudabuf read_file_at (cold, O_DIRECT if supported)"]),
        ("KvikIO CuFile.pread (defaults)", ["KvikIO CuFile.pread (cold)"]),
        ("torch.from_file().cuda()", ["torch.from_file().cuda() (cold)"]),
    ],
}


def points(records: list[dict[str, Any]], names: list[str]) -> list[tuple[int, float]]:
    for name in names:
        found = {r["size"]: r["gbs"] for r in records if r["path"] == name}
        if found:
            return sorted(found.items())
    return []


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", type=Path, required=True)
    ap.add_argument("--peers", type=Path, nargs="*", default=[])
    ap.add_argument("--label", default="h200")
    ap.add_argument("--out", type=Path, default=Path("docs"))
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records: list[dict[str, Any]] = list(json.loads(args.ours.read_text())["records"])
    for p in args.peers:
        records += json.loads(p.read_text())["records"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (condition, curves) in zip(axes, CURVES.items()):
        for label, names in curves:
            pts = points(records, names)
            if pts:
                ax.plot([s / MIB for s, _ in pts], [g for _, g in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("file size (MiB)")
        ax.set_ylabel("GB/s (1 GB = 1e9 B)")
        ax.set_title(f"file -> device, page cache {condition} ({args.label})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"files-{args.label}-read.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
