//! Files to device memory and back, beside the bounds measured in the same run: the
//! host's parallel `pread` of the same file into host memory (the bound of a read when the
//! page cache is warm, and the disk's rate when it is cold), one thread's read, the pinned
//! host-to-device copy, the host's parallel `pwrite`, and the path that pins nothing
//! (threads `pread` chunks into pageable memory of their own and copy each synchronously,
//! as a first call does while it has no pinned buffers), once on the bench's context and
//! once on a context of a new backend each repetition (the bound the first call of a
//! context is held to: on CUDA the bench's context has its staging engine running, which
//! the copies that pin nothing use, a new one has not). On the backend `CUDABUF_BACKEND`
//! names (`sim`, the default, or `cuda`).
//!
//! The first call of a context is timed on a context of a backend made for it (a
//! `Backend`'s `context(0)` is cached, so a context of the bench's own backend would find
//! the buffers earlier calls pooled): nothing pinned in advance, its staging pool at the
//! bench's limit, one call per repetition, each on a new backend.
//!
//! ```text
//! cargo bench --bench files -- --dir /tmp --sizes 64M,256M
//! CUDABUF_BACKEND=cuda cargo bench --features cuda --bench files -- \
//!     --dir /scratch --sizes 64M,256M,1G,4G --cold --keep --json files.json
//! files [--dir DIR] [--sizes 64M,1G] [--reps N] [--threads N] [--cold] [--keep] [--json PATH]
//!       [--arrow-sizes 64M,256M] [--arrow-threads 1,8]
//! ```
//!
//! Each size gets a file `cudabuf-bench-<bytes>.bin` in `DIR` (reused when it is already
//! there with that size; `--keep` leaves it for the Python peers' bench,
//! `scripts/bench_files.py`). Warm figures read the file once first; with `--cold` each
//! cold repetition first drops the file's pages from the page cache
//! (`posix_fadvise(POSIX_FADV_DONTNEED)` after `fdatasync`, which needs no privileges).
//! Figures are medians; GB/s with 1 GB = 1e9 bytes. Each `cudabuf` row carries its ratio
//! to the bound named beside it.
//!
//! With the `arrow` feature, Arrow files too (`files/arrow_files.rs`): at each size of
//! `--arrow-sizes` (64M,256M by default; empty for none) an LZ4 Arrow IPC file and a
//! Parquet file of an int64 and a float64 column in 1 Mi-row batches (the table
//! `scripts/bench_files.py` writes with pyarrow), read to the device by
//! `DeviceFileReader::read_all` and `read_parquet` with each thread count of
//! `--arrow-threads` (1 and `--threads` by default), beside the bound: arrow-rs decoding
//! the same file into host memory with as many threads.
//!
//! ```text
//! cargo bench --features arrow --bench files -- --sizes "" --arrow-sizes 64M --arrow-threads 1,2
//! CUDABUF_BACKEND=cuda cargo bench --features cuda,arrow --bench files -- --json files.json
//! ```

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cudabuf::{DirectIo, FileOptions};
use serde_json::json;

#[cfg(feature = "arrow")]
#[path = "files/arrow_files.rs"]
mod arrow_files;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: usize = 1 << 20;
/// The chunk the host bounds read and write in, as cudabuf's default.
const CHUNK: usize = 8 * MIB;

struct Options {
    dir: PathBuf,
    sizes: Vec<usize>,
    reps: usize,
    threads: usize,
    cold: bool,
    keep: bool,
    json: Option<PathBuf>,
    arrow_sizes: Vec<usize>,
    arrow_threads: Vec<usize>,
}

/// Sizes separated by commas; an empty string is none.
fn parse_sizes(s: &str) -> AnyResult<Vec<usize>> {
    s.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(parse_size)
        .collect()
}

fn parse_size(s: &str) -> AnyResult<usize> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = digits.parse()?;
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KIB" => 1 << 10,
        "M" | "MIB" => 1 << 20,
        "G" | "GIB" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {s:?}").into()),
    };
    Ok(n * scale)
}

fn parse_options() -> AnyResult<Options> {
    let mut o = Options {
        dir: std::env::temp_dir(),
        sizes: vec![64 * MIB, 256 * MIB],
        reps: 5,
        threads: FileOptions::default().threads(),
        cold: false,
        keep: false,
        json: None,
        arrow_sizes: if cfg!(feature = "arrow") {
            vec![64 * MIB, 256 * MIB]
        } else {
            Vec::new()
        },
        arrow_threads: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--dir" => o.dir = PathBuf::from(value()?),
            "--sizes" => o.sizes = parse_sizes(&value()?)?,
            "--arrow-sizes" => o.arrow_sizes = parse_sizes(&value()?)?,
            "--arrow-threads" => {
                o.arrow_threads = value()?
                    .split(',')
                    .map(|t| t.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--reps" => o.reps = value()?.parse()?,
            "--threads" => o.threads = value()?.parse()?,
            "--cold" => o.cold = true,
            "--keep" => o.keep = true,
            "--json" => o.json = Some(PathBuf::from(value()?)),
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    if o.arrow_threads.is_empty() {
        o.arrow_threads = if o.threads == 1 {
            vec![1]
        } else {
            vec![1, o.threads]
        };
    }
    if !cfg!(feature = "arrow") && !o.arrow_sizes.is_empty() {
        return Err("--arrow-sizes needs the bench built with `--features arrow`".into());
    }
    Ok(o)
}

/// The bench's file of `size` bytes (made, or reused when it is there with that size).
fn bench_file(dir: &Path, size: usize) -> AnyResult<PathBuf> {
    let path = dir.join(format!("cudabuf-bench-{size}.bin"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == size as u64) {
        return Ok(path);
    }
    let file = File::create(&path)?;
    let mut block = vec![0u8; CHUNK];
    let mut written = 0;
    while written < size {
        let n = CHUNK.min(size - written);
        for (i, b) in block[..n].iter_mut().enumerate() {
            *b = ((written + i) as u64)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .to_le_bytes()[7];
        }
        file.write_all_at(&block[..n], written as u64)?;
        written += n;
    }
    file.sync_all()?;
    Ok(path)
}

/// Drop `path`'s pages from the page cache (clean pages only: written back first).
fn drop_cache(path: &Path) -> AnyResult<()> {
    let file = File::open(path)?;
    file.sync_data()?;
    // SAFETY: a valid open descriptor; the call only advises the kernel.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(format!("posix_fadvise: error {rc}").into());
    }
    Ok(())
}

/// `threads` threads `pread` (or `pwrite`) `CHUNK`s of `file` into (from) `host`.
fn host_parallel(file: &File, host: &mut [u8], threads: usize, write: bool) -> AnyResult<()> {
    let next = AtomicUsize::new(0);
    let chunks: Vec<&mut [u8]> = host.chunks_mut(CHUNK).collect();
    let slots: Vec<std::sync::Mutex<Option<&mut [u8]>>> = chunks
        .into_iter()
        .map(|c| std::sync::Mutex::new(Some(c)))
        .collect();
    std::thread::scope(|s| -> AnyResult<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> std::io::Result<()> {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(slot) = slots.get(k) else {
                            return Ok(());
                        };
                        let chunk = slot.lock().unwrap().take().unwrap();
                        let at = (k * CHUNK) as u64;
                        if write {
                            file.write_all_at(chunk, at)?;
                        } else {
                            file.read_exact_at(chunk, at)?;
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a host thread panicked")??;
        }
        Ok(())
    })
}

/// The path that pins nothing: `threads` threads `pread` the file in `CHUNK`s into a
/// pageable chunk buffer of their own (new for the call, reused for each chunk) and copy
/// each to `device` synchronously, with the backend's copy that pins no memory for it
/// (`copy_host_to_device_unpinned`, what a first call uses while its pinned buffers are
/// made).
fn unpinned_read(file: &File, device: &cudabuf::DeviceBuffer, threads: usize) -> AnyResult<()> {
    let size = device.size();
    let next = AtomicUsize::new(0);
    let raw = device.context().raw();
    std::thread::scope(|s| -> AnyResult<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    let mut scratch = vec![0u8; CHUNK.min(size)];
                    loop {
                        let at = next.fetch_add(1, Ordering::Relaxed) * CHUNK;
                        if at >= size {
                            return Ok(());
                        }
                        let n = CHUNK.min(size - at);
                        file.read_exact_at(&mut scratch[..n], at as u64)
                            .map_err(|e| e.to_string())?;
                        // SAFETY: `at + n <= device.size()`, and `device` (held by the
                        // caller for the call) is live memory of the context of `raw`.
                        unsafe {
                            raw.copy_host_to_device_unpinned(
                                device.address() + at as u64,
                                &scratch[..n],
                            )
                        }
                        .map_err(|e| e.to_string())?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a pageable-copy thread panicked")??;
        }
        Ok(())
    })
}

/// GB/s of `call` on a device buffer of `size` bytes of a context of a new backend (set up
/// by `setup`, untimed), once per repetition (at least one): the median.
fn on_new_contexts(
    reps: usize,
    size: usize,
    setup: impl Fn(&cudabuf::Context),
    call: impl Fn(&cudabuf::DeviceBuffer) -> AnyResult<()>,
) -> AnyResult<f64> {
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        let backend = cudabuf::backend_from_env()?;
        let fresh = backend.context(0)?;
        setup(&fresh);
        let dst = fresh.new_buffer(size)?;
        let t = Instant::now();
        call(&dst)?;
        rates.push(size as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(median(rates))
}

/// `threads` threads `pread` the `size`-byte file in `CHUNK`s, each into a chunk buffer of
/// its own, reused: what reading the file costs, without a large destination's misses.
fn host_parallel_scratch(file: &File, size: usize, threads: usize) -> AnyResult<()> {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| -> AnyResult<()> {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> std::io::Result<()> {
                    let mut scratch = vec![0u8; CHUNK.min(size)];
                    loop {
                        let at = next.fetch_add(1, Ordering::Relaxed) * CHUNK;
                        if at >= size {
                            return Ok(());
                        }
                        let n = CHUNK.min(size - at);
                        file.read_exact_at(&mut scratch[..n], at as u64)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| "a host thread panicked")??;
        }
        Ok(())
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median rate in GB/s of `reps` runs of `f` over `bytes` bytes, `before` run
/// untimed before each.
fn rate(
    reps: usize,
    bytes: usize,
    mut before: impl FnMut() -> AnyResult<()>,
    mut f: impl FnMut() -> AnyResult<()>,
) -> AnyResult<f64> {
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        before()?;
        let t = Instant::now();
        f()?;
        rates.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    Ok(median(rates))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("files bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> AnyResult<()> {
    let o = parse_options()?;
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    ctx.set_staging_pool_limit(ctx.staging_pool_limit().max(256 * MIB));
    let base = FileOptions::default().with_threads(o.threads)?;
    println!(
        "# files: backend {}, device {}, dir {}, {} threads, chunks of {} MiB, {} reps",
        backend.kind(),
        backend.device(0)?.name()?,
        o.dir.display(),
        o.threads,
        base.chunk_size() / MIB,
        o.reps
    );
    println!("| path | size | GB/s | bound | ratio |");
    println!("|---|---|---|---|---|");
    let mut records = Vec::new();
    let mut record = |path: &str, size: usize, gbs: f64, bound: Option<(&str, f64)>| {
        let ratio = bound.map(|(_, b)| gbs / b);
        println!(
            "| {path} | {} MiB | {gbs:.2} | {} | {} |",
            size / MIB,
            bound.map_or("-".into(), |(n, b)| format!("{n} {b:.2}")),
            ratio.map_or("-".into(), |r| format!("{r:.2}x"))
        );
        records.push(json!({
            "path": path, "size": size, "gbs": gbs,
            "bound": bound.map(|(n, _)| n), "bound_gbs": bound.map(|(_, b)| b), "ratio": ratio,
        }));
    };
    for &size in &o.sizes {
        let path = bench_file(&o.dir, size)?;
        let file = File::open(&path)?;
        let mut host = vec![1u8; size];
        let device = ctx.new_buffer(size)?;
        let nothing = || Ok(());
        let warm = || -> AnyResult<()> {
            let mut scratch = vec![0u8; CHUNK.min(size)];
            for at in (0..size).step_by(CHUNK) {
                let n = CHUNK.min(size - at);
                file.read_exact_at(&mut scratch[..n], at as u64)?;
            }
            Ok(())
        };
        warm()?;
        // The bound: the host's parallel read of the file into host memory (one buffer
        // the size of the file). Reading into small reused buffers (which stay in the
        // CPU's caches) is the cost of the read alone, shown beside it.
        let bound = rate(o.reps, size, nothing, || {
            host_parallel(&file, &mut host, o.threads, false)
        })?;
        record(
            "host pread, parallel, into one buffer (warm)",
            size,
            bound,
            None,
        );
        let scratch = rate(o.reps, size, nothing, || {
            host_parallel_scratch(&file, size, o.threads)
        })?;
        record(
            "host pread, parallel, into reused chunks (warm)",
            size,
            scratch,
            None,
        );
        let one = rate(o.reps, size, nothing, || {
            host_parallel(&file, &mut host, 1, false)
        })?;
        record("host pread, 1 thread (warm)", size, one, None);
        let pinned = {
            let n = size.min(1 << 30);
            let staging = ctx.new_host_buffer(n)?;
            let dst = device.slice(0, n)?;
            rate(o.reps, n, nothing, || {
                Ok(dst.copy_from_host(&staging, 0, None).map(drop)?)
            })?
        };
        record("pinned H2D copy (the link)", size, pinned, None);
        ctx.set_file_options(base);
        let unpinned = rate(o.reps, size, nothing, || {
            unpinned_read(&file, &device, o.threads)
        })?;
        record(
            "no pinning: pread + pageable copy, parallel (warm)",
            size,
            unpinned,
            Some(("host pread parallel", bound)),
        );
        // The path that pins nothing on a context of a new backend, as a first call finds
        // it: on CUDA its staging engine has not started (the bench's context above has
        // one running, which the copies that pin nothing use).
        let fresh_unpinned = on_new_contexts(
            o.reps,
            size,
            |_| {},
            |dst| unpinned_read(&file, dst, o.threads),
        )?;
        record(
            "no pinning, on a new context (warm)",
            size,
            fresh_unpinned,
            Some(("host pread parallel", bound)),
        );
        // The first call of a context: each repetition on a context of a new backend
        // (nothing pinned, its pool empty), timed alone.
        let first = on_new_contexts(
            o.reps,
            size,
            |fresh| {
                fresh.set_staging_pool_limit(ctx.staging_pool_limit());
                fresh.set_file_options(base);
            },
            |dst| Ok(dst.read_file_at(&file, 0)?),
        )?;
        record(
            "cudabuf read_file_at, first call of a context (warm)",
            size,
            first,
            Some(("no pinning, new context", fresh_unpinned)),
        );
        // Warm: the page cache and the staging pool (one call, then the pinning it
        // started in the background waited for).
        device.read_file_at(&file, 0)?;
        ctx.wait_background_pinning();
        let ours = rate(o.reps, size, nothing, || Ok(device.read_file_at(&file, 0)?))?;
        record(
            "cudabuf read_file_at (warm)",
            size,
            ours,
            Some(("host pread parallel", bound)),
        );
        let fresh = rate(o.reps, size, nothing, || {
            Ok(ctx.read_file(&path).map(drop)?)
        })?;
        record(
            "cudabuf Context::read_file (warm, allocates)",
            size,
            fresh,
            Some(("host pread parallel", bound)),
        );

        // Writes: over the same file's cached pages (the page cache's rate, both sides).
        let out_path = o.dir.join(format!("cudabuf-bench-{size}.out"));
        let out = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&out_path)?;
        out.set_len(size as u64)?;
        let write_bound = rate(o.reps, size, nothing, || {
            host_parallel(&out, &mut host, o.threads, true)
        })?;
        record("host pwrite, parallel", size, write_bound, None);
        let ours_w = rate(o.reps, size, nothing, || Ok(device.write_file_at(&out, 0)?))?;
        record(
            "cudabuf write_file_at",
            size,
            ours_w,
            Some(("host pwrite parallel", write_bound)),
        );
        drop(out);
        std::fs::remove_file(&out_path)?;

        if o.cold {
            let cold = || drop_cache(&path);
            let bound_cold = rate(o.reps, size, cold, || {
                host_parallel(&file, &mut host, o.threads, false)
            })?;
            record("host pread, parallel (cold)", size, bound_cold, None);
            ctx.set_file_options(base);
            let ours_cold = rate(o.reps, size, cold, || Ok(device.read_file_at(&file, 0)?))?;
            record(
                "cudabuf read_file_at (cold, page cache)",
                size,
                ours_cold,
                Some(("host pread parallel cold", bound_cold)),
            );
            ctx.set_file_options(base.with_direct_io(DirectIo::IfSupported));
            let direct = rate(o.reps, size, cold, || Ok(device.read_file_at(&file, 0)?))?;
            record(
                "cudabuf read_file_at (cold, O_DIRECT if supported)",
                size,
                direct,
                Some(("host pread parallel cold", bound_cold)),
            );
            ctx.set_file_options(base);
        }
        // Correctness of what was measured: the device holds the file.
        if device.to_vec()? != std::fs::read(&path)? {
            return Err(format!(
                "after the reads, the device differs from {}",
                path.display()
            )
            .into());
        }
        drop(file);
        if !o.keep {
            std::fs::remove_file(&path)?;
        }
    }
    #[cfg(feature = "arrow")]
    arrow_files::run(&ctx, base, &o, &mut record)?;
    if let Some(json_path) = &o.json {
        std::fs::write(
            json_path,
            serde_json::to_string_pretty(&json!({
                "backend": backend.kind().to_string(),
                "threads": o.threads,
                "records": records,
            }))?,
        )?;
        eprintln!("wrote {}", json_path.display());
    }
    Ok(())
}
