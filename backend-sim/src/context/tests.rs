//! The raw trait behaviour of the simulator: memory rules, pinned memory, contexts,
//! faults and leaks.

use std::sync::Arc;

use cudabuf_core::backend::{Platform, RawContext};
use cudabuf_core::{BackendKind, Error, ErrorKind};

use crate::region::DEFAULT_UNINIT_FILL as UNINIT_FILL;
use crate::{FaultOp, RegionKind, SimBackend, SimConfig};

pub(super) fn ctx(sim: &SimBackend, device: usize) -> Arc<dyn RawContext> {
    sim.device(device).unwrap().primary_context().unwrap()
}

pub(super) fn write(ctx: &dyn RawContext, ptr: u64, bytes: &[u8]) -> cudabuf_core::Result<()> {
    // SAFETY: the simulator checks every address; a bad one is an error, never UB.
    unsafe { ctx.copy_host_to_device(ptr, bytes) }
}

pub(super) fn read(ctx: &dyn RawContext, ptr: u64, len: usize) -> cudabuf_core::Result<Vec<u8>> {
    let mut out = vec![0u8; len];
    // SAFETY: as in `write`.
    unsafe { ctx.copy_device_to_host(&mut out, ptr) }?;
    Ok(out)
}

pub(super) fn free(ctx: &dyn RawContext, ptr: u64) -> cudabuf_core::Result<()> {
    // SAFETY: as in `write`.
    unsafe { ctx.free(ptr) }
}

fn dtod(ctx: &dyn RawContext, dst: u64, src: u64, len: usize) -> cudabuf_core::Result<()> {
    // SAFETY: as in `write`.
    unsafe { ctx.copy_device_to_device(dst, src, len) }
}

#[track_caller]
fn assert_invalid_address(r: cudabuf_core::Result<impl std::fmt::Debug>, words: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidAddress, "{e}");
    assert!(e.to_string().contains(words), "{e:?} should say {words:?}");
}

#[test]
fn platform_devices_and_contexts() {
    let sim = SimBackend::new();
    assert_eq!(sim.kind(), BackendKind::SIM);
    assert!(sim.capabilities().fault_injection);
    assert_eq!(sim.num_devices().unwrap(), 2);
    let d1 = sim.device(1).unwrap();
    assert_eq!(d1.ordinal(), 1);
    assert_eq!(d1.name().unwrap(), "cudabuf simulated device 1");
    assert_eq!(d1.total_memory().unwrap(), 1 << 30);
    assert_eq!(
        sim.device(2).unwrap_err(),
        Error::InvalidDevice {
            device: 2,
            count: 2
        }
    );
    let a = d1.primary_context().unwrap();
    let b = d1.primary_context().unwrap();
    assert!(Arc::ptr_eq(&a, &b), "the primary context is one Arc");
    let c0 = ctx(&sim, 0);
    assert_eq!(a.device_ordinal(), 1);
    assert_ne!(a.handle(), 0);
    assert_ne!(a.handle(), c0.handle());
    assert_ne!(ctx(&SimBackend::new(), 1).handle(), a.handle());

    let custom = SimBackend::with_config(SimConfig {
        devices: 3,
        capacity_per_device: 4096,
        name: "gpu".into(),
        ..SimConfig::default()
    })
    .unwrap();
    assert_eq!(custom.num_devices().unwrap(), 3);
    assert_eq!(custom.device(2).unwrap().name().unwrap(), "gpu 2");
    assert_eq!(custom.device(2).unwrap().total_memory().unwrap(), 4096);
}

#[test]
fn shared_context_uses_the_device_memory() {
    let sim = SimBackend::new();
    let primary = ctx(&sim, 0);
    let d0 = sim.device(0).unwrap();
    // SAFETY: the handle is the live primary context of device 0.
    let shared = unsafe { d0.shared_context(primary.handle()) }.unwrap();
    assert_eq!(shared.handle(), primary.handle());
    assert_eq!(shared.device_ordinal(), 0);
    let ptr = primary.allocate(10).unwrap();
    write(&*shared, ptr, b"hello").unwrap();
    assert_eq!(read(&*primary, ptr, 5).unwrap(), b"hello");
    free(&*shared, ptr).unwrap();

    let other_device = ctx(&sim, 1).handle();
    for bad in [other_device, 12345, ctx(&SimBackend::new(), 0).handle()] {
        // SAFETY: the simulator checks the handle.
        let e = unsafe { d0.shared_context(bad) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
}

#[test]
fn allocate_free_and_double_free() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let a = c.allocate(100).unwrap();
    let b = c.allocate(1).unwrap();
    assert_ne!(a, 0);
    assert_eq!(a % 256, 0);
    assert_eq!(b % 256, 0);
    assert!(b >= a + 100 + 4096, "guard gap between allocations");
    assert_eq!(
        read(&*c, a, 100).unwrap(),
        vec![UNINIT_FILL; 100],
        "filled like uninitialized memory"
    );
    assert_eq!(sim.bytes_in_use(0), 101);
    assert_invalid_address(free(&*c, a + 8), "not the base of an allocation");
    free(&*c, a).unwrap();
    assert_invalid_address(free(&*c, a), "freed");
    assert_invalid_address(free(&*c, 0x1234), "never allocated by this simulator");
    assert_invalid_address(free(&*c, 0), "never allocated by this simulator");
    assert_invalid_address(
        free(&*ctx(&sim, 1), b),
        "belongs to device 0 but context is on device 1",
    );
    free(&*c, b).unwrap();
    let c2 = c.allocate(100).unwrap();
    assert!(c2 > b, "addresses are never reused");
    assert_eq!(
        c.allocate(0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    free(&*c, c2).unwrap();
    assert_eq!(sim.bytes_in_use(0), 0);
    assert!(sim.leak_report().is_empty());
}

#[test]
fn copies_in_out_and_device_to_device() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 1);
    let a = c.allocate(64).unwrap();
    let b = c.allocate(64).unwrap();
    let data: Vec<u8> = (0..64).collect();
    write(&*c, a, &data).unwrap();
    write(&*c, a + 60, &[9, 9, 9, 9]).unwrap();
    dtod(&*c, b + 10, a, 20).unwrap();
    let back = read(&*c, b, 64).unwrap();
    assert_eq!(&back[10..30], &data[..20]);
    assert_eq!(&back[..10], &[UNINIT_FILL; 10]);
    assert_eq!(read(&*c, a + 58, 6).unwrap(), [58, 59, 9, 9, 9, 9]);
    // A context of the same device sees the same memory.
    let shared =
        // SAFETY: the handle is the live primary context of device 1.
        unsafe { sim.device(1).unwrap().shared_context(c.handle()) }.unwrap();
    assert_eq!(read(&*shared, b + 10, 3).unwrap(), [0, 1, 2]);
}

#[test]
fn overlapping_device_to_device_is_memmove() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let a = c.allocate(16).unwrap();
    let data: Vec<u8> = (0..16).collect();
    write(&*c, a, &data).unwrap();
    dtod(&*c, a + 2, a, 10).unwrap(); // forward overlap
    assert_eq!(
        read(&*c, a, 16).unwrap(),
        [0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]
    );
    write(&*c, a, &data).unwrap();
    dtod(&*c, a, a + 3, 10).unwrap(); // backward overlap
    assert_eq!(
        read(&*c, a, 16).unwrap(),
        [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 10, 11, 12, 13, 14, 15]
    );
}

#[test]
fn copies_outside_one_live_allocation_are_refused() {
    let sim = SimBackend::new();
    let c0 = ctx(&sim, 0);
    let c1 = ctx(&sim, 1);
    let a = c0.allocate(100).unwrap();
    let b = c0.allocate(100).unwrap();
    assert_invalid_address(
        write(&*c0, a + 95, &[1; 10]),
        "runs 5 bytes past the end of a 100-byte device allocation",
    );
    assert_invalid_address(read(&*c0, a, 101), "runs 1 bytes past the end");
    assert_invalid_address(
        read(&*c0, a + 100, 1),
        "never allocated by this simulator (0 bytes past the end of the 100-byte",
    );
    assert_invalid_address(dtod(&*c0, b, a + 1, 100), "past the end");
    assert_invalid_address(dtod(&*c0, b + 1, a, 100), "past the end");
    assert_invalid_address(
        read(&*c1, a, 1),
        "belongs to device 0 but context is on device 1",
    );
    assert_invalid_address(dtod(&*c1, a, b, 1), "belongs to device 0");
    let host = [0u8; 8];
    assert_invalid_address(
        read(&*c0, host.as_ptr() as u64, 8),
        "not a simulated device address",
    );
    let other = SimBackend::new();
    let foreign = ctx(&other, 0).allocate(100).unwrap();
    assert_invalid_address(read(&*c0, foreign, 1), "another simulator instance");
    assert_invalid_address(read(&*ctx(&other, 0), a, 1), "another simulator instance");
    free(&*ctx(&other, 0), foreign).unwrap();
    free(&*c0, a).unwrap();
    assert_invalid_address(
        write(&*c0, a + 50, &[1]),
        "freed (it was 50 bytes into a 100-byte device allocation",
    );
    assert_eq!(
        read(&*c0, b, 0).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    // Nothing was written by the refused copies.
    assert_eq!(read(&*c0, b, 100).unwrap(), vec![UNINIT_FILL; 100]);
}

/// How many instances [`instances_never_share_addresses_however_many`] makes: more
/// than a 12-bit instance tag could tell apart (fewer under Miri, which checks the same
/// code for undefined behaviour, slowly).
const INSTANCES: usize = if cfg!(miri) { 40 } else { 5000 };

/// Thousands of live instances, each with device memory (on either device) and pinned
/// memory: no two addresses are equal, and the first instance and each other one refuse
/// each other's addresses as another instance's.
#[test]
fn instances_never_share_addresses_however_many() {
    let first = SimBackend::new();
    let c0 = ctx(&first, 0);
    let ours = c0.allocate(100).unwrap();
    let our_pinned = c0.alloc_host(10).unwrap();
    let mut seen = std::collections::HashSet::from([ours, our_pinned.device_ptr()]);
    let mut others = Vec::with_capacity(INSTANCES);
    for i in 0..INSTANCES {
        let sim = SimBackend::new();
        let c = ctx(&sim, i % 2);
        let theirs = c.allocate(1 + i % 100).unwrap();
        let pinned = c.alloc_host(1).unwrap();
        for address in [theirs, pinned.device_ptr()] {
            assert!(seen.insert(address), "instance {i} got {address:#x} again");
            assert_invalid_address(read(&*c0, address, 1), "another simulator instance");
        }
        assert_invalid_address(read(&*c, ours, 1), "another simulator instance");
        assert_invalid_address(
            read(&*c, our_pinned.device_ptr(), 1),
            "another simulator instance",
        );
        others.push((sim, c, theirs, pinned));
    }
    for (sim, c, theirs, pinned) in others {
        free(&*c, theirs).unwrap();
        // SAFETY: `pinned` came from alloc_host on this instance and is freed once.
        unsafe { c.free_host(pinned) }.unwrap();
        assert!(sim.leak_report().is_empty());
    }
    free(&*c0, ours).unwrap();
    // SAFETY: as above.
    unsafe { c0.free_host(our_pinned) }.unwrap();
}

#[test]
fn peer_copies_cross_devices_of_one_instance_only() {
    let sim = SimBackend::new();
    let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
    let a = c0.allocate(8).unwrap();
    let b = c1.allocate(8).unwrap();
    write(&*c0, a, b"abcdefgh").unwrap();
    // SAFETY: the simulator checks every address and context.
    unsafe { c1.copy_peer(b + 2, &*c0, a, 4) }.unwrap();
    let f = UNINIT_FILL;
    assert_eq!(
        read(&*c1, b, 8).unwrap(),
        [f, f, b'a', b'b', b'c', b'd', f, f]
    );
    // SAFETY: as above.
    let e = unsafe { c1.copy_peer(b, &*c1, a, 4) }.unwrap_err();
    assert!(e.to_string().contains("belongs to device 0"), "{e}");
    let other = SimBackend::new();
    // SAFETY: as above.
    let e = unsafe { c1.copy_peer(b, &*ctx(&other, 0), a, 4) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
}

#[test]
fn capacity_gives_out_of_memory() {
    let sim = SimBackend::with_config(SimConfig {
        capacity_per_device: 1000,
        ..SimConfig::default()
    })
    .unwrap();
    let c = ctx(&sim, 0);
    let a = c.allocate(600).unwrap();
    let e = c.allocate(401).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("capacity 1000, in use 600"), "{e}");
    let b = c.allocate(400).unwrap();
    assert_eq!(sim.bytes_in_use(0), 1000);
    // Other devices and pinned memory have their own budgets.
    let d1 = ctx(&sim, 1).allocate(1000).unwrap();
    let pinned = c.alloc_host(5000).unwrap();
    free(&*c, a).unwrap();
    let a = c.allocate(600).unwrap();
    for p in [a, b] {
        free(&*c, p).unwrap();
    }
    free(&*ctx(&sim, 1), d1).unwrap();
    // SAFETY: `pinned` came from alloc_host and is freed once.
    unsafe { c.free_host(pinned) }.unwrap();
    assert_eq!(sim.bytes_in_use(0), 0);
    assert_eq!(
        c.allocate(usize::MAX).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
}

#[test]
fn pinned_memory_is_visible_through_its_device_address() {
    let sim = SimBackend::new();
    let (c0, c1) = (ctx(&sim, 0), ctx(&sim, 1));
    let p = c0.alloc_host(10_000).unwrap();
    assert_eq!(p.size(), 10_000);
    assert_eq!(p.host_ptr() as usize % 4096, 0);
    // SAFETY: `host_ptr` is valid for `size` bytes until free_host; nothing else
    // accesses it during this borrow.
    let host = unsafe { std::slice::from_raw_parts_mut(p.host_ptr(), p.size()) };
    assert!(host.iter().all(|&b| b == 0));
    host[100..105].copy_from_slice(b"hello");
    // Pinned memory is portable: any context reads it.
    assert_eq!(read(&*c1, p.device_ptr() + 100, 5).unwrap(), b"hello");
    write(&*c0, p.device_ptr() + 9_998, b"!!").unwrap();
    let d = c1.allocate(5).unwrap();
    dtod(&*c1, d, p.device_ptr() + 100, 5).unwrap();
    assert_eq!(read(&*c1, d, 5).unwrap(), b"hello");
    // SAFETY: as above; the previous borrow is over.
    let host = unsafe { std::slice::from_raw_parts(p.host_ptr(), p.size()) };
    assert_eq!(&host[9_998..], b"!!");
    assert_invalid_address(
        read(&*c0, p.device_ptr() + 9_999, 2),
        "past the end of a 10000-byte pinned",
    );
    assert_eq!(sim.bytes_in_use(0), 0);
    assert_invalid_address(free(&*c0, p.device_ptr()), "free it with free_host");
    // SAFETY: `p` came from alloc_host and is freed once.
    unsafe { c0.free_host(p) }.unwrap();
    // SAFETY: the simulator checks it: a second free is an error, not UB.
    let e = unsafe { c0.free_host(p) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidAddress);
    assert_invalid_address(read(&*c0, p.device_ptr(), 1), "freed");
    free(&*c1, d).unwrap();
}

#[test]
fn device_address_rules() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let d = c.allocate(100).unwrap();
    let p = c.alloc_host(100).unwrap();
    assert_eq!(c.device_address(d).unwrap(), d);
    assert_eq!(c.device_address(d + 99).unwrap(), d + 99);
    assert_eq!(
        c.device_address(p.device_ptr() + 7).unwrap(),
        p.device_ptr() + 7
    );
    assert_eq!(
        c.device_address(p.host_ptr() as u64).unwrap(),
        p.device_ptr()
    );
    assert_eq!(
        c.device_address(p.host_ptr() as u64 + 99).unwrap(),
        p.device_ptr() + 99
    );
    // Memory of another device is still a device address (as with unified addressing).
    assert_eq!(ctx(&sim, 1).device_address(d).unwrap(), d);
    let pageable = [0u8; 100];
    assert_invalid_address(c.device_address(pageable.as_ptr() as u64), "pageable");
    assert_invalid_address(c.device_address(p.host_ptr() as u64 + 100), "pageable");
    assert_invalid_address(c.device_address(d + 100), "never allocated");
    free(&*c, d).unwrap();
    assert_invalid_address(c.device_address(d), "freed");
    let host = p.host_ptr() as u64;
    // SAFETY: `p` came from alloc_host and is freed once.
    unsafe { c.free_host(p) }.unwrap();
    assert_invalid_address(c.device_address(host), "freed");
    assert_invalid_address(c.device_address(0), "never allocated");
}

#[test]
fn address_range_finds_the_allocation() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let d = c.allocate(1000).unwrap();
    let p = c.alloc_host(50).unwrap();
    assert_eq!(c.address_range(d).unwrap(), (d, 1000));
    assert_eq!(c.address_range(d + 999).unwrap(), (d, 1000));
    assert_eq!(
        c.address_range(p.device_ptr() + 10).unwrap(),
        (p.device_ptr(), 50)
    );
    assert_eq!(ctx(&sim, 1).address_range(d + 1).unwrap(), (d, 1000));
    assert_invalid_address(c.address_range(d + 1000), "never allocated");
    assert_invalid_address(
        c.address_range(p.host_ptr() as u64),
        "not a simulated device address",
    );
    free(&*c, d).unwrap();
    assert_invalid_address(c.address_range(d), "freed");
    // SAFETY: `p` came from alloc_host and is freed once.
    unsafe { c.free_host(p) }.unwrap();
}

#[test]
fn fail_nth_fails_one_call_and_changes_nothing() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let oom = Error::OutOfMemory {
        device: 0,
        requested: 1,
        detail: "injected".into(),
    };
    sim.fail_nth(FaultOp::Allocate, 2, oom.clone()).unwrap();
    let a = c.allocate(10).unwrap();
    assert_eq!(c.allocate(10).unwrap_err(), oom);
    assert_eq!(
        sim.bytes_in_use(0),
        10,
        "the injected allocate allocated nothing"
    );
    assert_eq!(sim.leak_report().len(), 1);
    let b = c.allocate(10).unwrap();
    assert_eq!(sim.op_count(FaultOp::Allocate), 3);

    let injected = Error::Driver {
        call: "cuMemcpyHtoD_v2",
        name: "CUDA_ERROR_UNKNOWN".into(),
        code: 999,
        message: "injected".into(),
    };
    sim.fail_nth(FaultOp::Copy, 1, injected.clone()).unwrap();
    assert_eq!(write(&*c, a, b"xyz").unwrap_err(), injected);
    assert_eq!(
        read(&*c, a, 3).unwrap(),
        [UNINIT_FILL; 3],
        "the failed copy wrote nothing"
    );

    for op in [
        FaultOp::Synchronize,
        FaultOp::AllocHost,
        FaultOp::IpcExport,
        FaultOp::IpcOpen,
    ] {
        sim.fail_nth(op, 1, injected.clone()).unwrap();
    }
    assert_eq!(c.synchronize().unwrap_err(), injected);
    c.synchronize().unwrap();
    assert_eq!(c.alloc_host(10).unwrap_err(), injected);
    assert_eq!(c.ipc_export(a).unwrap_err(), injected);
    assert_eq!(c.ipc_open(&[0; 64]).unwrap_err(), injected);
    assert_eq!(sim.leak_report().len(), 2);

    sim.fail_nth(FaultOp::Copy, 1, injected.clone()).unwrap();
    sim.clear_faults();
    write(&*c, a, b"xyz").unwrap();
    for p in [a, b] {
        free(&*c, p).unwrap();
    }
}

#[test]
fn fail_randomly_is_deterministic_from_the_seed() {
    let run = |seed| {
        let sim = SimBackend::new();
        let c = ctx(&sim, 0);
        let a = c.allocate(4).unwrap();
        sim.fail_randomly(
            FaultOp::Copy,
            0.5,
            seed,
            Error::unsupported("copy", "injected"),
        )
        .unwrap();
        let outcome: Vec<bool> = (0..64).map(|_| write(&*c, a, b"abcd").is_ok()).collect();
        assert_eq!(sim.op_count(FaultOp::Copy), 64);
        sim.clear_faults();
        free(&*c, a).unwrap();
        outcome
    };
    let first = run(42);
    assert_eq!(first, run(42));
    assert_ne!(first, run(43));
    assert!(first.contains(&true) && first.contains(&false));
}

#[test]
fn with_config_refuses_too_many_devices() {
    let e = SimBackend::with_config(SimConfig {
        devices: crate::MAX_DEVICES + 1,
        ..SimConfig::default()
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("SimBackend::with_config"), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("at most {}", crate::MAX_DEVICES)),
        "{e}"
    );
    let max = SimBackend::with_config(SimConfig {
        devices: crate::MAX_DEVICES,
        capacity_per_device: 4096,
        ..SimConfig::default()
    })
    .unwrap();
    assert_eq!(max.num_devices().unwrap(), crate::MAX_DEVICES);
}

#[test]
fn fail_nth_refuses_zero_and_arms_nothing() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    let e = sim
        .fail_nth(
            FaultOp::Allocate,
            0,
            Error::unsupported("allocate", "injected"),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("SimBackend::fail_nth"), "{e}");
    let a = c.allocate(10).unwrap();
    free(&*c, a).unwrap();
}

#[test]
fn fail_randomly_refuses_bad_probabilities_and_arms_nothing() {
    let sim = SimBackend::new();
    let c = ctx(&sim, 0);
    for p in [-0.5, 1.5, f64::NAN, f64::INFINITY] {
        let e = sim
            .fail_randomly(
                FaultOp::Allocate,
                p,
                7,
                Error::unsupported("allocate", "injected"),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{p}: {e}");
        assert!(e.to_string().contains("SimBackend::fail_randomly"), "{e}");
    }
    for _ in 0..20 {
        let a = c.allocate(10).unwrap();
        free(&*c, a).unwrap();
    }
}

#[test]
fn leak_report_lists_live_allocations() {
    install_logger();
    let sim = SimBackend::with_config(SimConfig {
        name: "leaky".into(),
        ..SimConfig::default()
    })
    .unwrap();
    let c1 = ctx(&sim, 1);
    let d = c1.allocate(300).unwrap();
    let p = ctx(&sim, 0).alloc_host(20).unwrap();
    let report = sim.leak_report();
    assert!(!report.is_empty());
    assert_eq!(report.len(), 2);
    assert_eq!(report.total_bytes(), 320);
    let kinds: Vec<_> = report
        .entries
        .iter()
        .map(|e| (e.device, e.kind, e.address, e.size))
        .collect();
    assert!(kinds.contains(&(1, RegionKind::Device, d, 300)));
    assert!(kinds.contains(&(0, RegionKind::Pinned, p.device_ptr(), 20)));
    let text = report.to_string();
    assert!(
        text.starts_with("leaky: 2 live allocation(s), 320 bytes"),
        "{text}"
    );
    // Dropping every handle with live allocations logs the report (and frees the
    // memory); it must not panic.
    drop(c1);
    drop(sim);
    let logged = LOGGED.lock().unwrap().clone();
    assert!(
        logged.iter().any(|(level, text)| *level == log::Level::Warn
            && text.contains("memory leaked at shutdown: leaky: 2 live allocation(s)")),
        "{logged:?}"
    );
}

/// What the `log` crate received in this test binary: (level, message).
static LOGGED: std::sync::Mutex<Vec<(log::Level, String)>> = std::sync::Mutex::new(Vec::new());

/// Records every log message in [`LOGGED`]; installed by [`install_logger`].
struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
        logged.push((record.level(), record.args().to_string()));
    }
    fn flush(&self) {}
}

/// Installs [`Recorder`] as this test binary's logger (once: a logger stays for good).
fn install_logger() {
    static RECORDER: Recorder = Recorder;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&RECORDER).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

#[test]
fn many_threads_share_one_instance() {
    let sim = SimBackend::new();
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let sim = sim.clone();
            std::thread::spawn(move || {
                let c = ctx(&sim, t % 2);
                for i in 0..200u32 {
                    let bytes = (t as u32 * 1000 + i).to_le_bytes();
                    let p = c.allocate(64).unwrap();
                    write(&*c, p + 8, &bytes).unwrap();
                    assert_eq!(read(&*c, p + 8, 4).unwrap(), bytes);
                    free(&*c, p).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(sim.leak_report().is_empty());
}

#[test]
fn new_device_memory_holds_the_configured_fill_byte() {
    assert_eq!(SimConfig::default().uninit_fill, 0xA5);
    assert_eq!(UNINIT_FILL, 0xA5);
    for fill in [0x00, 0x3C, 0xFF] {
        let sim = SimBackend::with_config(SimConfig {
            uninit_fill: fill,
            ..SimConfig::default()
        })
        .unwrap();
        assert_eq!(sim.config().uninit_fill, fill);
        let c = ctx(&sim, 1);
        let a = c.allocate(300).unwrap();
        assert_eq!(
            read(&*c, a, 300).unwrap(),
            vec![fill; 300],
            "fill {fill:#x}"
        );
        write(&*c, a, &[0x11; 300]).unwrap();
        free(&*c, a).unwrap();
        // A new allocation is new memory: the fill again, never the bytes just freed.
        let b = c.allocate(300).unwrap();
        assert_eq!(
            read(&*c, b, 300).unwrap(),
            vec![fill; 300],
            "fill {fill:#x}"
        );
        // Pinned host memory is zeroed whatever the fill.
        let pinned = c.alloc_host(64).unwrap();
        assert_eq!(read(&*c, pinned.device_ptr(), 64).unwrap(), vec![0; 64]);
        // SAFETY: allocated above by this context, freed once.
        unsafe { c.free_host(pinned) }.unwrap();
        free(&*c, b).unwrap();
        assert!(sim.leak_report().is_empty());
    }
}
