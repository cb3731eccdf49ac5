//! Load: many threads doing mixed allocate / copy / slice / export / open / drop at once,
//! on shared and separate contexts, for a bounded time, checking every byte they read
//! against a host model, that `bytes_allocated` returns to its start, and that nothing
//! deadlocks (a watchdog fails the case when the threads do not all finish in time).
//!
//! Settings (environment):
//! - `CUDABUF_STRESS_SECS`: how long the threads run, in seconds (default 2; a fraction is
//!   fine). Longer on a GPU: `CUDABUF_STRESS_SECS=60`.
//! - `CUDABUF_STRESS_THREADS`: how many threads (default 8).
//! - `CUDABUF_STRESS_SEED`: the seed of the first thread (default: from the clock; it is
//!   printed in every failure).
//! - `CUDABUF_FILL_DEVICE=1`: lets [`device_filled_with_buffers_gives_out_of_memory_and_recovers`]
//!   fill a real device (it always runs where the backend's hooks give a backend with
//!   small devices, on the simulator a 64 MiB instance of its own).

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudabuf_core::{Backend, BufferReader, BufferWriter, Context, DeviceBuffer, ErrorKind};

use super::expect::{expect_err, first_difference, total_memory};
use super::reliability_inputs::fnv1a;
use super::reliability_leaks::{hook_backend, tracked};
use crate::support::Rng;
use crate::{CaseResult, Fixture, Skip};

/// The environment variable with the run time in seconds.
pub(crate) const SECS_VAR: &str = "CUDABUF_STRESS_SECS";
/// The environment variable with the thread count.
pub(crate) const THREADS_VAR: &str = "CUDABUF_STRESS_THREADS";
/// The environment variable with the first thread's seed.
pub(crate) const SEED_VAR: &str = "CUDABUF_STRESS_SEED";

/// The environment variable that lets the device-filling case run on a real device.
pub(crate) const FILL_VAR: &str = "CUDABUF_FILL_DEVICE";

/// The memory of each device of the backend the device-filling case asks the hooks for.
const SMALL_DEVICE: usize = 64 << 20;

/// The largest buffer a thread allocates.
const MAX_BYTES: usize = 64 << 10;
/// The most buffers a thread holds at once.
const MAX_ITEMS: usize = 12;
/// How long after the run time the watchdog waits for the threads to finish.
const GRACE: Duration = Duration::from_secs(120);

fn setting<T: std::str::FromStr>(var: &str, default: T) -> T {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var}={v:?} is not a number")),
        _ => default,
    }
}

/// Panics unless `got` equals `expected`, naming the checksums and the first difference.
#[track_caller]
fn check_bytes(got: &[u8], expected: &[u8], what: &str, seed: u64) {
    if got != expected {
        let first = first_difference(got, expected);
        panic!(
            "stress (seed {seed}): {what}: {} bytes with checksum {:#018x}, expected {} with \
             {:#018x}; first difference at byte {first}",
            got.len(),
            fnv1a(got),
            expected.len(),
            fnv1a(expected)
        );
    }
}

/// A buffer a thread owns, and what it must hold.
struct Item {
    buf: DeviceBuffer,
    model: Vec<u8>,
}

/// A buffer every thread reads (never writes), and what it holds.
struct Frozen {
    buf: DeviceBuffer,
    bytes: Vec<u8>,
}

/// What one thread did.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    ops: u64,
    bytes_checked: u64,
}

/// One thread's state.
struct Worker<'a> {
    seed: u64,
    rng: Rng,
    backend: &'a Backend,
    home: Context,
    contexts: &'a [Context],
    frozen: &'a [Frozen],
    items: Vec<Item>,
    stats: Stats,
}

impl Worker<'_> {
    fn check(&mut self, got: &[u8], expected: &[u8], what: &str) {
        check_bytes(got, expected, what, self.seed);
        self.stats.bytes_checked += got.len() as u64;
    }

    fn push(&mut self, item: Item) {
        if self.items.len() >= MAX_ITEMS {
            let i = self.rng.below(self.items.len());
            self.items.swap_remove(i);
        }
        self.items.push(item);
    }

    fn any_context(&mut self) -> Context {
        self.contexts[self.rng.below(self.contexts.len())].clone()
    }

    /// A random owned item's index, allocating one first if there is none.
    fn some_item(&mut self) -> usize {
        if self.items.is_empty() {
            self.allocate();
        }
        self.rng.below(self.items.len())
    }

    fn allocate(&mut self) {
        let n = self.rng.size(MAX_BYTES);
        let ctx = self.home.clone();
        let buf = ctx.new_buffer(n).expect("new_buffer");
        let model = self.rng.bytes(n);
        buf.copy_from_host(&model, 0, None).expect("copy_from_host");
        self.push(Item { buf, model });
    }

    fn step(&mut self) {
        self.stats.ops += 1;
        match self.rng.below(14) {
            0 => self.allocate(),
            1 => {
                // buffer_from_data from host bytes, in any context.
                let n = self.rng.size(MAX_BYTES);
                let model = self.rng.bytes(n);
                let ctx = self.any_context();
                let buf = ctx
                    .buffer_from_data(&model)
                    .expect("buffer_from_data(host)");
                self.push(Item { buf, model });
            }
            2 => {
                // copy_from_host into a range.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let data = self.rng.bytes(n);
                let item = &mut self.items[i];
                item.buf
                    .copy_from_host(&data, position, None)
                    .expect("copy_from_host");
                item.model[position..position + n].copy_from_slice(&data);
            }
            3 => {
                // Read back: everything, or a range into a caller's slice.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let item = &self.items[i];
                let (got, expected) = if self.rng.below(2) == 0 {
                    (item.buf.to_vec().expect("to_vec"), item.model.clone())
                } else {
                    let mut dst = vec![0u8; n];
                    let copied = item
                        .buf
                        .copy_to_host_into(position, &mut dst, Some(n))
                        .expect("copy_to_host_into");
                    assert_eq!(copied, n);
                    (dst, item.model[position..position + n].to_vec())
                };
                self.check(&got, &expected, "read back");
            }
            4 => {
                // A slice sees its range and writes through to its parent.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let data = self.rng.bytes(n);
                let slice = self.items[i].buf.slice(position, n).expect("slice");
                let got = slice.to_vec().expect("slice to_vec");
                let expected = self.items[i].model[position..position + n].to_vec();
                self.check(&got, &expected, "slice");
                slice
                    .copy_from_host(&data, 0, None)
                    .expect("write via slice");
                self.items[i].model[position..position + n].copy_from_slice(&data);
                let got = self.items[i].buf.to_vec().expect("parent to_vec");
                let expected = self.items[i].model.clone();
                self.check(&got, &expected, "parent after a write through its slice");
            }
            5 => {
                // copy_from_device between two owned buffers (maybe two contexts or devices).
                let a = self.some_item();
                let b = self.some_item();
                let (src_pos, n) = self.rng.range(self.items[a].model.len());
                let dst_len = self.items[b].model.len();
                if n > dst_len {
                    return;
                }
                let dst_pos = self.rng.below(dst_len - n + 1);
                let src = self.items[a].buf.slice(src_pos, n).expect("slice");
                let bytes = self.items[a].model[src_pos..src_pos + n].to_vec();
                self.items[b]
                    .buf
                    .copy_from_device(&src, dst_pos, Some(n))
                    .expect("copy_from_device");
                self.items[b].model[dst_pos..dst_pos + n].copy_from_slice(&bytes);
            }
            6 => {
                // Export a range of an owned buffer, open it in this process, write through it.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let exported = self.items[i].buf.slice(position, n).expect("slice");
                let handle = exported.export_for_ipc().expect("export_for_ipc");
                let ctx = self.items[i].buf.context().clone();
                let opened = ctx.open_ipc_buffer(&handle).expect("open_ipc_buffer");
                let got = opened.to_vec().expect("opened to_vec");
                let expected = self.items[i].model[position..position + n].to_vec();
                self.check(&got, &expected, "opened IPC buffer");
                let data = self.rng.bytes(n);
                opened
                    .copy_from_host(&data, 0, None)
                    .expect("write via opened");
                self.items[i].model[position..position + n].copy_from_slice(&data);
            }
            7 => {
                // Read a shared (frozen) buffer through a slice, a copy, or an export/open.
                let f = &self.frozen[self.rng.below(self.frozen.len())];
                let (position, n) = self.rng.range(f.bytes.len());
                let expected = f.bytes[position..position + n].to_vec();
                let slice = f.buf.slice(position, n).expect("slice of a shared buffer");
                let got = match self.rng.below(3) {
                    0 => slice.to_vec().expect("to_vec"),
                    1 => f.buf.copy_to_host(position, Some(n)).expect("copy_to_host"),
                    _ => {
                        let handle = slice.export_for_ipc().expect("export of a shared buffer");
                        let opened = f
                            .buf
                            .context()
                            .open_ipc_buffer(&handle)
                            .expect("open of a shared buffer's handle");
                        opened.to_vec().expect("to_vec")
                    }
                };
                self.check(&got, &expected, "shared buffer");
            }
            8 => {
                // Copy from a shared buffer into an owned one (a peer copy across contexts).
                let f = &self.frozen[self.rng.below(self.frozen.len())];
                let i = self.some_item();
                let dst_len = self.items[i].model.len();
                let n = self.rng.below(dst_len.min(f.bytes.len()) + 1);
                let src_pos = self.rng.below(f.bytes.len() - n + 1);
                let dst_pos = self.rng.below(dst_len - n + 1);
                let src = f.buf.slice(src_pos, n).expect("slice");
                self.items[i]
                    .buf
                    .copy_from_device(&src, dst_pos, None)
                    .expect("copy_from_device from a shared buffer");
                self.items[i].model[dst_pos..dst_pos + n]
                    .copy_from_slice(&f.bytes[src_pos..src_pos + n]);
            }
            9 => {
                // A copy of a shared buffer, owned by this thread.
                let f = &self.frozen[self.rng.below(self.frozen.len())];
                let ctx = self.home.clone();
                let buf = ctx
                    .buffer_from_data(&f.buf)
                    .expect("buffer_from_data(shared device buffer)");
                let model = f.bytes.clone();
                let got = buf.to_vec().expect("to_vec");
                self.check(&got, &model, "copy of a shared buffer");
                self.push(Item { buf, model });
            }
            10 => {
                // Through pinned memory: device -> pinned view -> host slice.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let host = self.home.new_host_buffer(n).expect("new_host_buffer");
                // SAFETY: the host bytes are read through a reference only after the copy
                // through the view returned, on this thread.
                let view = unsafe { self.home.buffer_from_host_buffer(&host) }
                    .expect("buffer_from_host_buffer");
                let src = self.items[i].buf.slice(position, n).expect("slice");
                view.copy_from_device(&src, 0, None)
                    .expect("copy into pinned memory");
                let expected = self.items[i].model[position..position + n].to_vec();
                let got = host.to_vec();
                self.check(&got, &expected, "pinned copy");
            }
            11 => {
                // A buffered writer and a reader over a range.
                let i = self.some_item();
                let (position, n) = self.rng.range(self.items[i].model.len());
                let data = self.rng.bytes(n);
                let staging = self.rng.below(3) * 32;
                let mut writer = BufferWriter::new(self.items[i].buf.clone());
                writer.set_buffer_size(staging).expect("set_buffer_size");
                writer.seek_to(position).expect("seek_to");
                for chunk in data.chunks(7) {
                    writer.write_all(chunk).expect("write_all");
                }
                writer.close().expect("close");
                self.items[i].model[position..position + n].copy_from_slice(&data);
                let reader = BufferReader::new(self.items[i].buf.clone());
                let mut got = vec![0u8; n];
                let read = reader.read_at(position, &mut got).expect("read_at");
                assert_eq!(read, n);
                self.check(&got, &data, "writer then reader");
            }
            12 => {
                // Drop a buffer (its memory goes when the last clone goes).
                if !self.items.is_empty() {
                    let i = self.rng.below(self.items.len());
                    self.items.swap_remove(i);
                }
            }
            _ => {
                // Contexts looked up concurrently are the same contexts.
                let device = self.home.device_number();
                let ctx = self.backend.context(device).expect("context");
                assert_eq!(ctx.device_number(), device);
                ctx.synchronize().expect("synchronize");
            }
        }
    }
}

/// `threads` threads (default 8) run random mixed operations for `CUDABUF_STRESS_SECS`
/// (default 2 s) on a device's primary context (shared by several threads), on a
/// separate non-owning context over the same handle (its own counter, also shared), and
/// on device 1 when there is one; they also read, slice, copy, export and open a set of
/// buffers all of them share. Every byte read is checked against a host model; a
/// watchdog fails the case if the threads do not all finish within the run time plus
/// two minutes (a deadlock); afterwards every context's `bytes_allocated` is back at its
/// start and, on the simulator, nothing is live.
pub(crate) fn stress_mixed_operations_on_many_threads_lose_nothing(f: &Fixture) -> CaseResult {
    let secs: f64 = setting(SECS_VAR, 2.0);
    let threads: usize = setting(THREADS_VAR, 8).max(1);
    let seed: u64 = setting(
        SEED_VAR,
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    );
    let t = tracked(f);
    let backend = t.backend.clone();
    let c0 = backend.context(0).expect("context(0)");
    // SAFETY: the handle is device 0's primary context, kept alive by `c0` (and the
    // backend), both of which outlive `separate` and every buffer made through it (the
    // threads are joined, and every buffer dropped, before they go).
    let separate = unsafe { backend.shared_context(0, c0.handle()) }.expect("shared_context");
    let mut contexts = vec![c0.clone(), separate.clone()];
    if backend.num_devices().expect("num_devices") >= 2 {
        contexts.push(backend.context(1).expect("context(1)"));
    }
    let starts: Vec<usize> = contexts.iter().map(Context::bytes_allocated).collect();

    let mut rng = Rng::new(seed);
    let frozen: Vec<Frozen> = contexts
        .iter()
        .map(|ctx| {
            let bytes = rng.bytes(MAX_BYTES);
            let buf = ctx.buffer_from_data(&bytes).expect("buffer_from_data");
            Frozen { buf, bytes }
        })
        .collect();

    let deadline = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    let shared = Arc::new((backend.clone(), contexts.clone(), frozen));
    let (tx, rx) = mpsc::channel();
    let mut handles = Vec::with_capacity(threads);
    for n in 0..threads {
        let tx = tx.clone();
        let shared = shared.clone();
        let thread_seed = seed.wrapping_add(n as u64);
        let handle = std::thread::Builder::new()
            .name(format!("stress-{n}"))
            .spawn(move || {
                let (backend, contexts, frozen) = &*shared;
                let outcome = catch_unwind(AssertUnwindSafe(|| {
                    let mut worker = Worker {
                        seed: thread_seed,
                        rng: Rng::new(thread_seed),
                        backend,
                        home: contexts[n % contexts.len()].clone(),
                        contexts,
                        frozen,
                        items: Vec::new(),
                        stats: Stats::default(),
                    };
                    while Instant::now() < deadline {
                        worker.step();
                    }
                    worker.stats
                }));
                let outcome = outcome.map_err(|panic| {
                    panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panicked".into())
                });
                // Let go of the shared buffers before reporting, so that once every
                // thread has reported, only this case's own handles keep them.
                drop(shared);
                let _ = tx.send((n, outcome));
            })
            .expect("spawning a stress thread");
        handles.push(handle);
    }
    drop(tx);

    let watchdog = deadline + GRACE;
    let mut total = Stats::default();
    let mut failures = Vec::new();
    for finished in 0..threads {
        let left = watchdog.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((_, Ok(stats))) => {
                total.ops += stats.ops;
                total.bytes_checked += stats.bytes_checked;
            }
            Ok((n, Err(message))) => failures.push(format!("thread {n}: {message}")),
            Err(_) => panic!(
                "stress (seed {seed}): only {finished} of {threads} threads finished within \
                 {secs} s + {GRACE:?}: a deadlock or a hung operation"
            ),
        }
    }
    // Every thread has reported: they are returning now.
    for handle in handles {
        let _ = handle.join();
    }
    assert!(
        failures.is_empty(),
        "stress (seed {seed}): {} thread(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    drop(shared);
    for (ctx, start) in contexts.iter().zip(&starts) {
        assert_eq!(
            ctx.bytes_allocated(),
            *start,
            "stress (seed {seed}): bytes_allocated of context {:?} did not return to its start",
            ctx
        );
    }
    drop((contexts, separate, c0, backend));
    t.assert_nothing_live(&format!("stress (seed {seed})"));
    assert!(total.ops >= threads as u64, "the threads did nothing");
    let _ = writeln!(
        std::io::stderr(),
        "stress: {threads} threads, {secs} s, seed {seed}: {} operations, {} bytes checked",
        total.ops,
        total.bytes_checked
    );
    Ok(())
}

/// Device 0 filled with buffers (1/32 of its memory each, then halves down to 1 MiB)
/// until it refuses: every refusal is `OutOfMemory` (also asking for more than the
/// device has, with the device full), the buffers already made keep their bytes and
/// take copies, freeing them gives `bytes_allocated` back, and the same size allocates
/// again; then, by the backend's own account, nothing is live. It runs on a backend of
/// its own with 64 MiB devices where the hooks give one
/// ([`SuiteHooks::small_device_backend`](crate::SuiteHooks::small_device_backend), the
/// simulator's); on a real device only with `CUDABUF_FILL_DEVICE=1` (it takes the whole
/// device, so cases running beside it would fail: run it alone).
pub(crate) fn device_filled_with_buffers_gives_out_of_memory_and_recovers(
    f: &Fixture,
) -> CaseResult {
    let (backend, probe) = match f.hooks().small_device_backend(SMALL_DEVICE) {
        Some(made) => {
            let probed = hook_backend(f, made, "a backend with 64 MiB devices");
            (probed.backend, Some(probed.probe))
        }
        None if std::env::var(FILL_VAR).is_ok_and(|v| v == "1") => (f.backend(), None),
        None => {
            return Err(Skip(format!(
                "the {suite} backend's hooks give no backend with small devices \
                 (small_device_backend), and filling the whole device makes the cases \
                 beside it fail: run it alone with {FILL_VAR}=1 (--exact \
                 {suite}::device_filled_with_buffers_gives_out_of_memory_and_recovers)",
                suite = f.suite()
            )))
        }
    };
    let ctx = backend.context(0).expect("context(0)");
    let total = total_memory(&backend, 0);
    let start = ctx.bytes_allocated();
    let mib = 1 << 20;
    let chunk = (total / 32).max(mib) / mib * mib;
    let mut held: Vec<DeviceBuffer> = Vec::new();
    let mut refusals = 0;
    let mut size = chunk;
    while size >= mib {
        match ctx.new_buffer(size) {
            Ok(buf) => {
                let n = held.len() as u64;
                buf.copy_from_host(&n.to_le_bytes(), 0, None)
                    .expect("a marker at the start");
                buf.copy_from_host(&n.to_le_bytes(), size - 8, None)
                    .expect("a marker at the end");
                held.push(buf);
                assert!(
                    held.len() <= 32 + 64,
                    "{} buffers of up to {chunk} bytes and no refusal from a {total}-byte device",
                    held.len()
                );
            }
            Err(e) => {
                assert_eq!(
                    e.kind(),
                    ErrorKind::OutOfMemory,
                    "allocating {size} bytes with {} bytes held: {e}",
                    ctx.bytes_allocated() - start
                );
                refusals += 1;
                size /= 2;
            }
        }
    }
    assert!(!held.is_empty() && refusals > 0);
    let filled = ctx.bytes_allocated() - start;
    expect_err(
        ctx.new_buffer(total),
        ErrorKind::OutOfMemory,
        "new_buffer(total) on a full device",
    );
    assert_eq!(
        ctx.bytes_allocated() - start,
        filled,
        "refusals count nothing"
    );
    // What is held still works.
    if held.len() >= 2 {
        let (a, b) = (&held[0], &held[1]);
        b.copy_from_device(&a.slice(0, 8).expect("slice"), 8, None)
            .expect("copy_from_device on a full device");
        assert_eq!(
            b.copy_to_host(8, Some(8)).expect("copy_to_host"),
            0u64.to_le_bytes()
        );
    }
    for (n, buf) in held.iter().enumerate() {
        let marker = (n as u64).to_le_bytes();
        assert_eq!(buf.copy_to_host(0, Some(8)).expect("copy_to_host"), marker);
        assert_eq!(
            buf.copy_to_host(buf.size() - 8, Some(8))
                .expect("copy_to_host"),
            marker
        );
    }
    drop(held);
    assert_eq!(ctx.bytes_allocated(), start, "everything freed");
    let again = ctx
        .new_buffer(chunk)
        .expect("the same size allocates again");
    drop(again);
    ctx.synchronize().expect("synchronize");
    match probe {
        Some(probe) => {
            // Idle segments of the caching allocator (when it is on) are not leaks.
            ctx.trim_cache();
            if let Some(live) = probe.live() {
                panic!("after the device fill, the backend still holds: {live}");
            }
        }
        None => f.left_out(
            "the backend's own account of live memory after the fill (a real device: \
             bytes_allocated only)",
        ),
    }
    let _ = writeln!(
        std::io::stderr(),
        "device fill: {filled} of {total} bytes held in buffers before out of memory"
    );
    Ok(())
}
