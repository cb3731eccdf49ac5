//! The figures: records, the progress lines, the table on stdout and the JSON.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::peer::{NO_PEER_ACCESS, PEER_OPS};
use crate::{AnyResult, GIB, KIB, MIB};

/// One figure.
pub(crate) struct Record {
    pub(crate) section: &'static str,
    pub(crate) op: String,
    pub(crate) size: Option<usize>,
    /// A curve's other coordinate where it is not the size (`alloc_live`: live
    /// allocations; `ipc_scale`: handles open).
    pub(crate) x: Option<usize>,
    pub(crate) value: f64,
    pub(crate) unit: &'static str,
    pub(crate) samples: usize,
    pub(crate) note: String,
}

#[derive(Default)]
pub(crate) struct Records(
    pub(crate) Vec<Record>,
    pub(crate) Vec<(&'static str, String)>,
);

impl Records {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push(
        &mut self,
        section: &'static str,
        op: impl Into<String>,
        size: Option<usize>,
        value: f64,
        unit: &'static str,
        samples: usize,
        note: impl Into<String>,
    ) {
        self.push_record(Record {
            section,
            op: op.into(),
            size,
            x: None,
            value,
            unit,
            samples,
            note: note.into(),
        });
    }

    /// A point of a curve over `x` (see [`Record::x`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push_point(
        &mut self,
        section: &'static str,
        op: impl Into<String>,
        size: Option<usize>,
        x: usize,
        value: f64,
        unit: &'static str,
        samples: usize,
        note: impl Into<String>,
    ) {
        self.push_record(Record {
            section,
            op: op.into(),
            size,
            x: Some(x),
            value,
            unit,
            samples,
            note: note.into(),
        });
    }

    fn push_record(&mut self, r: Record) {
        eprintln!(
            "  {:<10} {:<34} {:>9} {:>12} {:<5} ({} samples) {}{}",
            r.section,
            r.op,
            r.size.map(human).unwrap_or_default(),
            fmt_value(r.value),
            r.unit,
            r.samples,
            r.x.map(|x| format!("x={x}; ")).unwrap_or_default(),
            r.note
        );
        self.0.push(r);
    }

    /// A section that did not run, and why: said now, in the table and in the JSON.
    pub(crate) fn not_run(&mut self, section: &'static str, why: impl Into<String>) {
        let why = why.into();
        eprintln!("[perf] section {section} NOT RUN: {why}");
        self.1.push((section, why));
    }

    pub(crate) fn find(&self, section: &str, op: &str, size: Option<usize>) -> Option<f64> {
        self.0
            .iter()
            .find(|r| r.section == section && r.op == op && r.size == size)
            .map(|r| r.value)
    }
}

pub(crate) fn human(n: usize) -> String {
    if n >= GIB && n.is_multiple_of(GIB) {
        format!("{} GiB", n / GIB)
    } else if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} B")
    }
}

pub(crate) fn fmt_value(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}
pub(crate) fn progress(msg: impl AsRef<str>) {
    eprintln!("[perf] {}", msg.as_ref());
}
pub(crate) fn write_json(
    opts: &Options,
    info: &Value,
    records: &Records,
    summary: &Value,
) -> AnyResult<()> {
    let Some(path) = &opts.json else {
        return Ok(());
    };
    let results: Vec<Value> = records
        .0
        .iter()
        .map(|r| {
            json!({
                "section": r.section, "op": r.op, "size": r.size, "x": r.x,
                "value": if r.value.is_finite() { json!(r.value) } else { Value::Null },
                "unit": r.unit, "samples": r.samples, "note": r.note,
            })
        })
        .collect();
    let not_run: serde_json::Map<String, Value> = records
        .1
        .iter()
        .map(|(section, why)| ((*section).to_owned(), json!(why)))
        .collect();
    let doc = json!({
        "info": info, "results": results, "summary": summary, "not_run": not_run,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    Ok(())
}

pub(crate) fn summarize(bench: &Bench, rec: &Records, opts: &Options) -> Value {
    let mut out = serde_json::Map::new();
    if bench.is_sim() {
        // Simulator copies against a plain host memcpy of the same size (target >= 0.8).
        let mut ratios = serde_json::Map::new();
        for &size in &opts.sizes {
            let Some(memcpy) = rec.find("copies", "host_memcpy", Some(size)) else {
                continue;
            };
            for op in ["h2d_pinned", "d2h_pinned", "h2d_pageable", "d2h_pageable"] {
                if let Some(v) = rec.find("copies", op, Some(size)) {
                    ratios.insert(format!("{op}@{}", human(size)), json!(v / memcpy));
                }
            }
            if let Some(v) = rec.find("copies", "d2d", Some(size)) {
                // D2D counts read + write; memcpy counts the bytes once.
                ratios.insert(format!("d2d@{}", human(size)), json!(v / 2.0 / memcpy));
            }
        }
        out.insert("sim_vs_memcpy".into(), Value::Object(ratios));
        // The same, timed alternately call after call (the same cache and machine state).
        let mut paired = serde_json::Map::new();
        for &size in &opts.sizes {
            let sim = rec.find("copies", "d2h_pageable_paired", Some(size));
            let memcpy = rec.find("copies", "host_memcpy_paired", Some(size));
            if let (Some(sim), Some(memcpy)) = (sim, memcpy) {
                paired.insert(format!("d2h_pageable@{}", human(size)), json!(sim / memcpy));
            }
        }
        out.insert("sim_vs_memcpy_paired".into(), Value::Object(paired));
    }
    // Pageable copies against pinned ones (target >= 0.8) and against the host's
    // multi-threaded memcpy, the best thread count (target: within 10%).
    let mut bound = serde_json::Map::new();
    for &size in &opts.sizes {
        let best = |prefix: &str, suffix: &str| {
            rec.0
                .iter()
                .filter(|r| {
                    r.section == "copies"
                        && r.size == Some(size)
                        && r.op
                            .strip_prefix(prefix)
                            .and_then(|rest| rest.strip_suffix(suffix))
                            .is_some_and(|n| n.parse::<usize>().is_ok())
                })
                .map(|r| r.value)
                .filter(|v| v.is_finite())
                .max_by(f64::total_cmp)
        };
        let memcpy = best("host_memcpy_mt", "");
        let memcpy_fresh = best("host_memcpy_mt", "_fresh");
        let at = human(size);
        for (op, pinned) in [
            ("h2d_pageable", "h2d_pinned"),
            ("d2h_pageable", "d2h_pinned"),
        ] {
            let Some(v) = rec.find("copies", op, Some(size)) else {
                continue;
            };
            if let Some(p) = rec.find("copies", pinned, Some(size)) {
                bound.insert(format!("{op}/{pinned}@{at}"), json!(v / p));
            }
            if let Some(m) = memcpy {
                bound.insert(format!("{op}/host_memcpy_mt@{at}"), json!(v / m));
            }
            let direction = &op[..3];
            let overlap = best(&format!("{direction}_overlap_bound_mt"), "");
            if let Some(o) = overlap {
                bound.insert(
                    format!("{op}/{direction}_overlap_bound_mt@{at}"),
                    json!(v / o),
                );
                if let Some(p) = rec.find("copies", pinned, Some(size)) {
                    bound.insert(
                        format!("{direction}_overlap_bound_mt/{pinned}@{at}"),
                        json!(o / p),
                    );
                }
            }
        }
        if let (Some(v), Some(m)) = (
            rec.find("copies", "d2h_pageable_fresh", Some(size)),
            memcpy_fresh,
        ) {
            bound.insert(
                format!("d2h_pageable_fresh/host_memcpy_mt_fresh@{at}"),
                json!(v / m),
            );
        }
    }
    if !bound.is_empty() {
        out.insert("pageable_bounds".into(), Value::Object(bound));
    }
    // Peer copies with peer access against the same copies without it.
    let mut peer = serde_json::Map::new();
    for &size in &opts.peer_sizes {
        for op in PEER_OPS {
            let with = rec.find("peer", op, Some(size));
            let without = rec.find("peer", &format!("{op}{NO_PEER_ACCESS}"), Some(size));
            if let (Some(with), Some(without)) = (with, without) {
                peer.insert(format!("{op}@{}", human(size)), json!(with / without));
            }
        }
    }
    if !peer.is_empty() {
        out.insert("peer_access_speedup".into(), Value::Object(peer));
    }
    Value::Object(out)
}

pub(crate) fn print_table(rec: &Records, summary: &Value) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n| section | operation | size | median | unit | samples | note |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|");
    for r in &rec.0 {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {}{} |",
            r.section,
            r.op,
            r.size.map(human).unwrap_or_default(),
            fmt_value(r.value),
            r.unit,
            r.samples,
            r.x.map(|x| format!("x={x}; ")).unwrap_or_default(),
            r.note
        );
    }
    if let Some(ratios) = summary
        .get("peer_access_speedup")
        .and_then(Value::as_object)
    {
        let _ = writeln!(out, "\npeer copy with peer access / without:");
        for (k, v) in ratios {
            let _ = writeln!(out, "  {k:<24} {:.2}", v.as_f64().unwrap_or(f64::NAN));
        }
    }
    for (section, why) in &rec.1 {
        let _ = writeln!(out, "\nsection {section} did NOT run: {why}");
    }
    if let Some(ratios) = summary.get("pageable_bounds").and_then(Value::as_object) {
        let _ = writeln!(
            out,
            "\npageable copies against pinned (target >= 0.8) and the host's multi-threaded memcpy (within 10%):"
        );
        for (k, v) in ratios {
            let _ = writeln!(out, "  {k:<52} {:.2}", v.as_f64().unwrap_or(f64::NAN));
        }
    }
    if let Some(ratios) = summary
        .get("sim_vs_memcpy_paired")
        .and_then(Value::as_object)
    {
        let _ = writeln!(
            out,
            "\nsimulator copy / host memcpy, timed alternately (target >= 0.8):"
        );
        for (k, v) in ratios {
            let v = v.as_f64().unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "  {k:<24} {v:.2}{}",
                if v >= 0.8 { "" } else { "  (below 0.8)" }
            );
        }
    }
    if let Some(ratios) = summary.get("sim_vs_memcpy").and_then(Value::as_object) {
        let _ = writeln!(out, "\nsimulator copy / host memcpy (target >= 0.8):");
        for (k, v) in ratios {
            let v = v.as_f64().unwrap_or(f64::NAN);
            let _ = writeln!(
                out,
                "  {k:<24} {v:.2}{}",
                if v >= 0.8 { "" } else { "  (below 0.8)" }
            );
        }
    }
    print!("{out}");
}
