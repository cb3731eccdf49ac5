#!/usr/bin/env python3
"""Replay cudabuf's allocation trace with PyTorch's caching allocator, side by side.

The trace is the file `alloc_trace generate` writes (benches/alloc_trace.rs): one event a
line, `a <id> <bytes>` (allocate) and `f <id>` (free), after `#` header lines. Each
allocation is `torch.empty(bytes, dtype=torch.uint8, device=DEVICE)` and each free drops
the last reference (`del`), each timed with `time.perf_counter_ns()` around the call. An
op is an allocation plus the later free of its tensor: the median and p99 per op are
reported, with the hit rate (allocations that did not allocate a new segment:
1 - segment.all.allocated / allocation.all.allocated of `torch.cuda.memory_stats`) and
peak reserved against peak requested bytes (`reserved_bytes.all.peak`,
`requested_bytes.all.peak`). The figures include the interpreter's own cost of a call.

    python3 scripts/alloc_trace_torch.py --trace TRACE [--json torch.json]
        [--ours ours.json] [--markdown table.md] [--device cuda:0]

With `--ours` (the JSON of `alloc_trace replay --json`), a markdown table puts cudabuf's
and PyTorch's figures side by side with their targets (median <= 1 us, hit
rate >= 90%, peak reserved <= 1.3x peak requested); without PyTorch or a GPU it says why,
shows cudabuf's column alone, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

MIB = 1 << 20

TARGET_MEDIAN_US = 1.0
TARGET_HIT_RATE = 0.90
TARGET_RATIO = 1.3


class TraceError(ValueError):
    """A trace file that is not a well-formed allocation trace."""


@dataclass(frozen=True)
class Event:
    """One line of a trace: an allocation (`size` > 0) or a free (`size` == 0)."""

    alloc: bool
    id: int
    size: int = 0


def parse_trace(lines: Iterable[str], name: str = "trace") -> tuple[str, list[Event]]:
    """The header and the events of a trace, checked as the Rust replay checks them: ids
    allocated once, counting up from 0, and freed once after their allocation."""
    header = ""
    events: list[Event] = []
    state: list[int] = []  # 1 live, 2 freed
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if line.startswith("#"):
            if not header:
                header = line[1:].strip()
            continue
        if not line:
            continue
        parts = line.split()

        def bad(what: str) -> TraceError:
            return TraceError(f"{name}:{number}: {what}: {line!r}")

        try:
            ident = int(parts[1]) if len(parts) > 1 else -1
        except ValueError:
            raise bad("not an event") from None
        if parts[0] == "a" and len(parts) == 3:
            try:
                size = int(parts[2])
            except ValueError:
                raise bad("no size") from None
            if size <= 0:
                raise bad("no size")
            if ident != len(state):
                raise bad("ids must count up from 0")
            state.append(1)
            events.append(Event(True, ident, size))
        elif parts[0] == "f" and len(parts) == 2:
            if not 0 <= ident < len(state) or state[ident] != 1:
                raise bad("free of an id that is not live")
            state[ident] = 2
            events.append(Event(False, ident))
        else:
            raise bad("not an event")
    return header, events


def read_trace(path: Path) -> tuple[str, list[Event]]:
    """The header and events of the trace file at `path`."""
    with path.open() as f:
        return parse_trace(f, str(path))


def quantile(sorted_samples: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile of sorted samples (as the Rust replay computes it)."""
    if not sorted_samples:
        return math.nan
    rank = min(max(math.ceil(q * len(sorted_samples)), 1), len(sorted_samples))
    return sorted_samples[rank - 1]


@dataclass
class Timings:
    """Per-op, per-allocation and per-free latencies in ns."""

    op_ns: list[float] = field(default_factory=list)
    alloc_ns: list[float] = field(default_factory=list)
    free_ns: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Medians and p99s in microseconds."""
        out: dict[str, float] = {"ops": float(len(self.op_ns))}
        for key, samples in (("op", self.op_ns), ("alloc", self.alloc_ns), ("free", self.free_ns)):
            s = sorted(samples)
            out[f"{key}_median_us"] = quantile(s, 0.5) / 1e3
            out[f"{key}_p99_us"] = quantile(s, 0.99) / 1e3
        return out


def timer_overhead_ns() -> float:
    """The median cost of a `perf_counter_ns()` pair."""
    samples = []
    for _ in range(10_000):
        t = time.perf_counter_ns()
        samples.append(float(time.perf_counter_ns() - t))
    samples.sort()
    return quantile(samples, 0.5)


def replay_torch(events: Sequence[Event], device: str) -> dict[str, Any]:
    """Replay `events` with `torch.empty` and `del` on `device`; the figures as a dict.

    Raises RuntimeError when PyTorch or the device is not there.
    """
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ImportError as err:
        raise RuntimeError(f"PyTorch is not installed ({err})") from None
    if not torch.cuda.is_available():
        raise RuntimeError("PyTorch sees no CUDA device")
    dev = torch.device(device)
    torch.cuda.set_device(dev)
    # Start the context, then start cold: no cached segment, counters and peaks reset.
    torch.empty(1, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.reset_accumulated_memory_stats(dev)
    timings = Timings()
    live: dict[int, tuple[Any, int]] = {}
    uint8 = torch.uint8
    empty = torch.empty
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for e in events:
        if e.alloc:
            t0 = clock()
            x = empty(e.size, dtype=uint8, device=dev)
            t1 = clock()
            live[e.id] = (x, t1 - t0)
            del x
        else:
            x, a = live.pop(e.id)
            t0 = clock()
            del x
            t1 = clock()
            f = t1 - t0
            timings.alloc_ns.append(float(a))
            timings.free_ns.append(float(f))
            timings.op_ns.append(float(a + f))
    torch.cuda.synchronize(dev)
    wall = time.perf_counter() - start
    stats = torch.cuda.memory_stats(dev)
    allocations = int(stats.get("allocation.all.allocated", 0))
    segments = int(stats.get("segment.all.allocated", 0))
    reserved = int(stats["reserved_bytes.all.peak"])
    requested = int(stats["requested_bytes.all.peak"])
    out: dict[str, Any] = dict(timings.summary())
    out.update(
        {
            "bench": "alloc_trace_torch",
            "torch": str(torch.__version__),
            "device": torch.cuda.get_device_name(dev),
            "allocations": allocations,
            "segments_allocated": segments,
            "hits": allocations - segments,
            "misses": segments,
            "hit_rate": (allocations - segments) / allocations if allocations else 0.0,
            "num_alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "peak_reserved_bytes": reserved,
            "peak_requested_bytes": requested,
            "reserved_over_requested": reserved / requested if requested else math.nan,
            "wall_s": wall,
            "timer_overhead_ns": timer_overhead_ns(),
        }
    )
    torch.cuda.empty_cache()
    return out


def _fmt_us(d: Optional[dict[str, Any]], key: str) -> str:
    return f"{d[key]:.3f} us" if d and key in d else "-"


def _fmt_ratio(d: Optional[dict[str, Any]]) -> str:
    if not d or "reserved_over_requested" not in d:
        return "-"
    return (
        f"{d['reserved_over_requested']:.3f} ({d['peak_reserved_bytes'] / MIB:.1f} / "
        f"{d['peak_requested_bytes'] / MIB:.1f} MiB)"
    )


def _fmt_hits(d: Optional[dict[str, Any]]) -> str:
    if not d or "hit_rate" not in d:
        return "-"
    return f"{100 * d['hit_rate']:.2f}% ({d['misses']} misses)"


def _met(ok: Optional[bool]) -> str:
    return "-" if ok is None else ("met" if ok else "MISSED")


def markdown_table(
    ours: Optional[dict[str, Any]], torch_figures: Optional[dict[str, Any]], note: str = ""
) -> str:
    """cudabuf's and PyTorch's figures side by side, with the targets (applied to cudabuf)."""
    name = f"cudabuf ({ours.get('backend', '?')})" if ours else "cudabuf"
    rows = [
        f"| figure | {name} | PyTorch | target | cudabuf |",
        "|---|---|---|---|---|",
    ]
    median_ok = ours["op_median_us"] <= TARGET_MEDIAN_US if ours else None
    hit_ok = ours["hit_rate"] >= TARGET_HIT_RATE if ours else None
    ratio_ok = ours["reserved_over_requested"] <= TARGET_RATIO if ours else None
    rows.append(
        f"| alloc+free median | {_fmt_us(ours, 'op_median_us')} | "
        f"{_fmt_us(torch_figures, 'op_median_us')} | <= {TARGET_MEDIAN_US} us | {_met(median_ok)} |"
    )
    rows.append(
        f"| alloc+free p99 | {_fmt_us(ours, 'op_p99_us')} | "
        f"{_fmt_us(torch_figures, 'op_p99_us')} | | |"
    )
    for key, label in (("alloc", "alloc"), ("free", "free")):
        rows.append(
            f"| {label} median / p99 | {_fmt_us(ours, key + '_median_us')} / "
            f"{_fmt_us(ours, key + '_p99_us')} | {_fmt_us(torch_figures, key + '_median_us')} / "
            f"{_fmt_us(torch_figures, key + '_p99_us')} | | |"
        )
    rows.append(
        f"| hit rate | {_fmt_hits(ours)} | {_fmt_hits(torch_figures)} | "
        f">= {100 * TARGET_HIT_RATE:.0f}% | {_met(hit_ok)} |"
    )
    rows.append(
        f"| peak reserved / peak requested | {_fmt_ratio(ours)} | {_fmt_ratio(torch_figures)} | "
        f"<= {TARGET_RATIO} | {_met(ratio_ok)} |"
    )
    for key, label in (("wall_s", "replay wall time (s)"), ("timer_overhead_ns", "timer pair (ns)")):
        a = f"{ours[key]:.2f}" if ours and key in ours else "-"
        b = f"{torch_figures[key]:.2f}" if torch_figures and key in torch_figures else "-"
        rows.append(f"| {label} | {a} | {b} | | |")
    text = "\n".join(rows) + "\n"
    if note:
        text += f"\n{note}\n"
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="the trace file")
    parser.add_argument("--json", type=Path, help="write PyTorch's figures here")
    parser.add_argument("--ours", type=Path, help="cudabuf's figures (alloc_trace --json)")
    parser.add_argument("--markdown", type=Path, help="write the side-by-side table here")
    parser.add_argument("--device", default="cuda:0")
    args = parser.parse_args(argv)

    header, events = read_trace(args.trace)
    ours = json.loads(args.ours.read_text()) if args.ours else None
    torch_figures: Optional[dict[str, Any]] = None
    note = "" if ours else "cudabuf's figures were not given (--ours): see its replay's log."
    status = 0
    try:
        print(f"[alloc_trace_torch] replaying {len(events)} events ({header})", file=sys.stderr)
        torch_figures = replay_torch(events, args.device)
        torch_figures["trace_header"] = header
    except RuntimeError as e:
        note = (note + " " if note else "") + f"PyTorch did NOT run: {e}"
        print(f"[alloc_trace_torch] {note}", file=sys.stderr)
        status = 2
    if args.json and torch_figures is not None:
        args.json.write_text(json.dumps(torch_figures, indent=2) + "\n")
    if ours and torch_figures and ours.get("trace_header") != header:
        note = (note + " " if note else "") + (
            f"WARNING: the two replays read different traces ({ours.get('trace_header')!r} "
            f"and {header!r})."
        )
    table = markdown_table(ours, torch_figures, note)
    print(table)
    if args.markdown:
        args.markdown.write_text(table)
    return status


if __name__ == "__main__":
    sys.exit(main())
