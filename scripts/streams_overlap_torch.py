#!/usr/bin/env python3
"""The streams overlap patterns through PyTorch, next to cudabuf's `streams_overlap` bench.

Run after `streams_overlap --json OURS` in the same GPU run (`scripts/gpu` runs both).
Measures, with the bench's method (wall clock from issue to synchronize,
median over repetitions, GB/s with 1 GB = 1e9 bytes, pinned host tensors from
`pin_memory=True`, `non_blocking=True` copies on `torch.cuda.Stream`s, which PyTorch
creates non-blocking):

- `one_way`: H2D alone and D2H alone at each size;
- `bidirectional`: H2D on one stream with D2H on another (`two_streams`, both directions'
  bytes counted), its `ratio_to_one_way` (over the faster one-way rate; target >= 1.7x),
  and both on one stream (`same_stream`);
- `upload`: the chunked double-buffered upload (two pinned staging tensors, two device
  staging tensors, chunk H2D on a copy stream, D2D into place on a second stream after
  `wait_event`, `torch.cuda.Event`s guarding each slot's reuse), `pipelined` and
  `serial` (one stream), and their ratios;

with the sizes, upload and chunk that cudabuf's JSON names (so both measure the same
thing), then writes one table with cudabuf / PyTorch ratios and the target met or missed:
streams_torch.json, streams_compare.json and streams_compare.md in `--out`.

Usage:
    python3 scripts/streams_overlap_torch.py --ours OUT/streams_ours.json --out OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
TARGET_RATIO = 1.7
DEFAULT_SIZES = [64 * MIB, 256 * MIB]
DEFAULT_UPLOAD = GIB
DEFAULT_CHUNK = 8 * MIB


@dataclass(frozen=True)
class Record:
    """One figure, as in the bench's JSON `results`."""

    section: str
    op: str
    size: int
    value: float
    unit: str
    samples: int


@dataclass(frozen=True)
class Row:
    """One line of the comparison table."""

    section: str
    op: str
    size: int
    unit: str
    ours: Optional[float]
    torch: Optional[float]
    ratio: Optional[float]
    target: str
    met: str


def log(msg: str) -> None:
    print(f"[streams-torch] {msg}", file=sys.stderr, flush=True)


def parse_size(text: str) -> int:
    """`64M`, `1G`, `4096`, `8MiB` (binary units) as bytes; ValueError otherwise."""
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
            break
    shift = {"K": 10, "M": 20, "G": 30, "T": 40}.get(t[-1:], 0)
    digits = t[:-1] if shift else t
    n = int(digits)
    if n <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return n << shift


def human(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def budget(size: int) -> tuple[int, int, int, float]:
    """(warmup, min, max samples, seconds): the bench's budgets."""
    if size >= 256 * MIB:
        return 1, 5, 20, 0.8
    return 2, 10, 100, 0.4


def time_median(
    size: int, f: Callable[[], None], clock: Callable[[], float] = time.perf_counter
) -> tuple[float, int]:
    """Median seconds of `f` after warm-up, and the number of samples."""
    warmup, lo, hi, seconds = budget(size)
    for _ in range(warmup):
        f()
    samples: list[float] = []
    start = clock()
    while len(samples) < hi and (len(samples) < lo or clock() - start < seconds):
        t = clock()
        f()
        samples.append(clock() - t)
    return statistics.median(samples), len(samples)


def gbps(nbytes: int, secs: float) -> float:
    return nbytes / secs / 1e9


def find(records: Sequence[Record], section: str, op: str, size: int) -> Optional[float]:
    for r in records:
        if (r.section, r.op, r.size) == (section, op, size):
            return r.value
    return None


def derived(records: list[Record], sizes: Sequence[int], upload: int, samples: int) -> None:
    """Add the ratio rows the bench adds (from the rates already in `records`)."""
    for size in sizes:
        up = find(records, "one_way", "h2d", size)
        down = find(records, "one_way", "d2h", size)
        both = find(records, "bidirectional", "two_streams", size)
        if up and down and both:
            records.append(
                Record("bidirectional", "ratio_to_one_way", size, both / max(up, down), "x", samples)
            )
    pipelined = find(records, "upload", "pipelined", upload)
    serial = find(records, "upload", "serial", upload)
    if pipelined and serial:
        records.append(Record("upload", "pipelined_over_serial", upload, pipelined / serial, "x", samples))
    one_way = find(records, "one_way", "h2d", max(sizes)) if sizes else None
    if pipelined and one_way:
        records.append(
            Record("upload", "pipelined_over_one_way_h2d", upload, pipelined / one_way, "x", samples)
        )


def measure_torch(sizes: Sequence[int], upload: int, chunk: int) -> list[Record]:
    """The bench's patterns through PyTorch (needs a CUDA device)."""
    # Imported here: the pure helpers above are tested without PyTorch.
    import torch  # type: ignore[import-not-found, unused-ignore]

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    records: list[Record] = []

    def push(section: str, op: str, size: int, value: float, unit: str, n: int) -> None:
        log(f"  {section:<14} {op:<22} {human(size):>8} {value:9.3f} {unit:<5} ({n} samples)")
        records.append(Record(section, op, size, value, unit, n))

    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for size in sizes:
        host_in = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
        host_out = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(0)
        dev_in = torch.empty(size, dtype=torch.uint8, device="cuda")
        dev_out = torch.full((size,), 2, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()

        def h2d(stream: Any) -> None:
            with torch.cuda.stream(stream):
                dev_in.copy_(host_in, non_blocking=True)

        def d2h(stream: Any) -> None:
            with torch.cuda.stream(stream):
                host_out.copy_(dev_out, non_blocking=True)

        h2d(s1)
        d2h(s2)
        s1.synchronize()
        s2.synchronize()
        if not bool((dev_in == 1).all()) or not bool((host_out == 2).all()):
            raise RuntimeError(f"PyTorch's bidirectional copies of {human(size)} moved wrong bytes")

        def one_up() -> None:
            h2d(s1)
            s1.synchronize()

        def one_down() -> None:
            d2h(s1)
            s1.synchronize()

        def both() -> None:
            h2d(s1)
            d2h(s2)
            s1.synchronize()
            s2.synchronize()

        def same() -> None:
            h2d(s1)
            d2h(s1)
            s1.synchronize()

        t, n = time_median(size, one_up)
        push("one_way", "h2d", size, gbps(size, t), "GB/s", n)
        t, n = time_median(size, one_down)
        push("one_way", "d2h", size, gbps(size, t), "GB/s", n)
        t, n = time_median(size, both)
        push("bidirectional", "two_streams", size, gbps(2 * size, t), "GB/s", n)
        t, n = time_median(size, same)
        push("bidirectional", "same_stream", size, gbps(2 * size, t), "GB/s", n)
        del host_in, host_out, dev_in, dev_out

    stage = [
        torch.empty(chunk, dtype=torch.uint8, pin_memory=True).fill_(3),
        torch.empty(chunk, dtype=torch.uint8, pin_memory=True).fill_(4),
    ]
    dev_stage = [torch.empty(chunk, dtype=torch.uint8, device="cuda") for _ in range(2)]
    target = torch.zeros(upload, dtype=torch.uint8, device="cuda")
    copy_s, place_s = torch.cuda.Stream(), torch.cuda.Stream()
    copied = [torch.cuda.Event(), torch.cuda.Event()]
    placed = [torch.cuda.Event(), torch.cuda.Event()]
    chunks = (upload + chunk - 1) // chunk
    torch.cuda.synchronize()

    def run(place: Any) -> None:
        for i in range(chunks):
            k = i % 2
            n = min(chunk, upload - i * chunk)
            if i >= 2:
                copied[k].synchronize()
                copy_s.wait_event(placed[k])
            with torch.cuda.stream(copy_s):
                dev_stage[k][:n].copy_(stage[k][:n], non_blocking=True)
                copied[k].record(copy_s)
            place.wait_event(copied[k])
            with torch.cuda.stream(place):
                target[i * chunk : i * chunk + n].copy_(dev_stage[k][:n], non_blocking=True)
                placed[k].record(place)
        place.synchronize()
        copy_s.synchronize()

    run(place_s)
    for i in range(chunks):
        piece = target[i * chunk : min(upload, (i + 1) * chunk)]
        if not bool((piece == 3 + i % 2).all()):
            raise RuntimeError(f"PyTorch's pipelined upload put wrong bytes in chunk {i}")

    def pipelined() -> None:
        run(place_s)

    def serial() -> None:
        run(copy_s)

    t, n = time_median(upload, pipelined)
    push("upload", "pipelined", upload, gbps(upload, t), "GB/s", n)
    t, n = time_median(upload, serial)
    push("upload", "serial", upload, gbps(upload, t), "GB/s", n)
    derived(records, sizes, upload, n)
    return records


def ours_records(ours: dict[str, Any]) -> list[Record]:
    out = []
    for r in ours.get("results", []):
        if r.get("value") is None:
            continue
        out.append(
            Record(r["section"], r["op"], int(r["size"]), float(r["value"]), r["unit"], int(r["samples"]))
        )
    return out


def compare(ours: Sequence[Record], theirs: Sequence[Record]) -> list[Row]:
    """One row per figure of either side, in the bench's order (ours first)."""
    keys: list[tuple[str, str, int, str]] = []
    for r in list(ours) + list(theirs):
        key = (r.section, r.op, r.size, r.unit)
        if key not in keys:
            keys.append(key)
    rows = []
    for section, op, size, unit in keys:
        a = find(ours, section, op, size)
        b = find(theirs, section, op, size)
        ratio = a / b if a is not None and b else None
        target, met = "", ""
        if (section, op) == ("bidirectional", "ratio_to_one_way"):
            target = f">= {TARGET_RATIO}x"
            parts = []
            if a is not None:
                parts.append("yes" if a >= TARGET_RATIO else "**MISSED**")
            if b is not None:
                parts.append(f"(torch {'yes' if b >= TARGET_RATIO else 'no'})")
            met = " ".join(parts)
        rows.append(Row(section, op, size, unit, a, b, ratio, target, met))
    return rows


def fmt(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def markdown(rows: Sequence[Row], heading: str) -> str:
    lines = [
        heading,
        "",
        "| section | op | size | cudabuf | PyTorch | unit | ours/torch | target | met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.section} | {r.op} | {human(r.size)} | {fmt(r.ours)} | {fmt(r.torch)} | "
            f"{r.unit} | {fmt(r.ratio)} | {r.target} | {r.met} |"
        )
    return "\n".join(lines) + "\n"


def main(
    argv: Optional[Sequence[str]] = None,
    measure: Callable[[Sequence[int], int, int], list[Record]] = measure_torch,
) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ours", help="cudabuf's streams_overlap --json output")
    p.add_argument("--out", default=".", help="folder for streams_torch.json, streams_compare.{json,md}")
    p.add_argument("--sizes", help="override the sizes (default: cudabuf's, else 64M,256M)")
    p.add_argument("--upload", help="override the upload size (default: cudabuf's, else 1G)")
    p.add_argument("--chunk", help="override the chunk size (default: cudabuf's, else 8M)")
    args = p.parse_args(argv)

    ours: dict[str, Any] = {}
    why_not_ours = ""
    if args.ours:
        try:
            with open(args.ours) as f:
                ours = json.load(f)
        except (OSError, ValueError) as e:
            why_not_ours = f"cannot read {args.ours}: {e}"
    else:
        why_not_ours = "no --ours given"
    if ours.get("not_run"):
        why_not_ours = f"cudabuf's bench did not run: {ours['not_run']}"
    info = ours.get("info", {})
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else list(info.get("sizes") or DEFAULT_SIZES)
    upload = parse_size(args.upload) if args.upload else int(info.get("upload") or DEFAULT_UPLOAD)
    chunk = parse_size(args.chunk) if args.chunk else int(info.get("chunk") or DEFAULT_CHUNK)
    os.makedirs(args.out, exist_ok=True)

    status = 0
    theirs: list[Record] = []
    torch_not_run = ""
    log(f"sizes {[human(s) for s in sizes]}, upload {human(upload)} in {human(chunk)} chunks")
    try:
        theirs = measure(sizes, upload, chunk)
    except Exception as e:  # report and still write what there is
        torch_not_run = f"{type(e).__name__}: {e}"
        log(f"PyTorch side did NOT run: {torch_not_run}")
        status = 1
    with open(os.path.join(args.out, "streams_torch.json"), "w") as f:
        json.dump(
            {"results": [asdict(r) for r in theirs], "not_run": torch_not_run, "sizes": sizes,
             "upload": upload, "chunk": chunk},
            f,
            indent=2,
        )
    if why_not_ours:
        log(why_not_ours)
        status = 1
    rows = compare(ours_records(ours), theirs)
    heading = (
        f"Streams overlap on {info.get('device', 'the GPU')}: medians, GB/s with 1 GB = 1e9 bytes; "
        f"sizes {', '.join(human(s) for s in sizes)}; upload {human(upload)} in {human(chunk)} chunks."
    )
    for why in (why_not_ours, torch_not_run and f"PyTorch side did not run: {torch_not_run}"):
        if why:
            heading += f"\n\n{why}"
    table = markdown(rows, heading)
    with open(os.path.join(args.out, "streams_compare.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "streams_compare.json"), "w") as f:
        json.dump({"rows": [asdict(r) for r in rows], "info": info, "torch_not_run": torch_not_run,
                   "ours_not_run": why_not_ours}, f, indent=2)
    print(table)
    return status


if __name__ == "__main__":
    sys.exit(main())
