//! Fault injection over a representative workload, through cudabuf-core's API.
//!
//! The workload (allocations, host and device copies, slices, peer copies, a buffered
//! writer, a reader, an IPC export opened in this process, a pinned host buffer) runs once
//! to count how often it calls each simulator operation; then, for every operation kind
//! and every call position `n`, it runs again on a fresh simulator with the `n`th call
//! armed to fail, and must return exactly the injected error (no panic, no other error),
//! leave `bytes_allocated` at its start, and leave the simulator's leak report empty.
//!
//! The counts, the out-of-memory retries and the leak checks assume that every buffer is
//! its own allocation: each backend here has the caching allocator and the pinned staging
//! pool off on every context ([`fresh`]), whatever `CUDABUF_ALLOCATOR_CACHE` says.

use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};

use cudabuf_core::{Backend, BufferReader, BufferWriter, Error, ErrorKind, IpcMemHandle, Result};
use cudabuf_sim::{FaultOp, SimBackend};

/// `len` bytes that are not all zero.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The cudabuf error inside an `io::Error` (readers and writers speak `std::io`).
fn from_io(e: std::io::Error) -> Error {
    let shown = e.to_string();
    match e.into_inner().map(|inner| inner.downcast::<Error>()) {
        Some(Ok(inner)) => *inner,
        _ => panic!("an io::Error without a cudabuf error inside: {shown}"),
    }
}

/// The workload: every kind of operation, checking the bytes it gets on the way.
/// Returns the first error.
fn workload(backend: &Backend) -> Result<()> {
    let c0 = backend.context(0)?;
    let c1 = backend.context(1)?;
    let data = pattern(1000, 1);

    let a = c0.new_buffer(1000)?;
    a.copy_from_host(&data, 0, None)?;
    let s = a.slice(100, 200)?;
    let b = c0.new_buffer(400)?;
    b.copy_from_device(&s, 0, None)?;
    let on1 = c1.buffer_from_data(&s)?; // peer copy 0 -> 1
    let back = c0.new_buffer(200)?;
    back.copy_from_device(&on1, 0, None)?; // peer copy 1 -> 0
    assert_eq!(back.to_vec()?, &data[100..300]);

    let mut writer = BufferWriter::new(b.clone());
    writer.set_buffer_size(64)?;
    writer.write_bytes(&[1; 10])?; // staged
    writer.write_bytes(&[2; 100])?; // flush, then straight through
    writer.write_bytes(&[3; 5])?; // staged
    writer.write_at(300, &[4; 5])?; // flush, staged
    writer.close()?;
    let written = b.to_vec()?;
    assert_eq!(&written[..10], &[1; 10]);
    assert_eq!(&written[110..115], &[3; 5]);
    assert_eq!(&written[300..305], &[4; 5]);

    let mut reader = BufferReader::new(on1.clone());
    let mut head = [0u8; 10];
    let n = reader.read_at(0, &mut head)?;
    reader.seek_to(n)?;
    let chunk = reader.read_buffer(20)?;
    assert_eq!(chunk.to_vec()?, &data[110..130]);
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).map_err(from_io)?;
    assert_eq!(rest, &data[130..300]);

    let handle = IpcMemHandle::from_bytes(&s.export_for_ipc()?.to_bytes())?;
    let opened = c0.open_ipc_buffer(&handle)?;
    opened.copy_from_host(b"ipc", 0, None)?;
    assert_eq!(a.copy_to_host(100, Some(3))?, b"ipc");

    let mut host = c0.new_host_buffer(256)?;
    host[..4].copy_from_slice(b"host");
    // SAFETY: the host bytes are accessed through references only after the copy through
    // the view returned, on this thread, and are not the host side of a copy through it.
    let view = unsafe { c0.buffer_from_host_buffer(&host) }?;
    view.copy_from_device(&opened, 4, Some(100))?;
    let from_host = c1.buffer_from_data(&host)?;
    assert_eq!(from_host.copy_to_host(0, Some(7))?, b"hostipc");
    c0.synchronize()?;
    c1.synchronize()?;
    Ok(())
}

/// The error armed at a call of `op`, of the kind a driver would return there.
fn injected(op: FaultOp, n: u64) -> Error {
    match op {
        FaultOp::Allocate | FaultOp::AllocHost => Error::OutOfMemory {
            device: 0,
            requested: 0,
            detail: format!("injected at call {n} of {op:?}"),
        },
        _ => Error::Driver {
            call: "injected",
            name: "CUDA_ERROR_INJECTED".into(),
            code: 999,
            message: format!("injected at call {n} of {op:?}"),
        },
    }
}

/// Whether `e` is the injected `error`: itself, or, for an `OutOfMemory` armed without a
/// size, the same error naming the device and the size of the request that failed.
fn is_the_injected(e: &Error, error: &Error) -> bool {
    match (e, error) {
        (
            Error::OutOfMemory {
                requested, detail, ..
            },
            Error::OutOfMemory {
                requested: 0,
                detail: want,
                ..
            },
        ) => *requested > 0 && detail == want,
        _ => e == error,
    }
}

/// A fresh simulator and a backend over it, with the caching allocator and the pinned
/// staging pool off on both devices' contexts (the ones the workload uses: a device's
/// context is the same object on every `backend.context` call), so that every buffer and
/// staging buffer is an allocation of its own, as the fault counts and leak checks assume.
fn fresh() -> (SimBackend, Backend) {
    let sim = SimBackend::new();
    let backend = Backend::new(sim.clone());
    for device in 0..2 {
        let ctx = backend.context(device).expect("context");
        ctx.set_allocator_cache_limit(0);
        ctx.set_staging_pool_limit(0);
        assert_eq!(ctx.allocator_cache_limit(), 0);
    }
    (sim, backend)
}

/// Runs the workload on `backend`, turning a panic into a failure that says `what`.
fn run_workload(backend: &Backend, what: &str) -> Result<()> {
    match catch_unwind(AssertUnwindSafe(|| workload(backend))) {
        Ok(result) => result,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{what}: the workload panicked: {msg}");
        }
    }
}

/// After a run: nothing counted, nothing allocated, nothing leaked.
fn assert_clean(sim: &SimBackend, backend: &Backend, what: &str) {
    for device in 0..2 {
        let ctx = backend.context(device).expect("context");
        assert_eq!(
            ctx.bytes_allocated(),
            0,
            "{what}: bytes_allocated on device {device}"
        );
        assert_eq!(
            sim.bytes_in_use(device),
            0,
            "{what}: simulator bytes in use on device {device}"
        );
    }
    let report = sim.leak_report();
    assert!(report.is_empty(), "{what}: leaked: {report}");
}

/// How many calls of each operation the workload makes.
fn op_counts() -> Vec<(FaultOp, u64)> {
    let (sim, backend) = fresh();
    run_workload(&backend, "baseline").expect("the workload runs without faults");
    FaultOp::ALL
        .iter()
        .map(|&op| (op, sim.op_count(op)))
        .collect()
}

#[test]
fn workload_runs_clean_and_uses_every_local_operation() {
    let (sim, backend) = fresh();
    run_workload(&backend, "baseline").expect("the workload runs without faults");
    assert_clean(&sim, &backend, "baseline");
    for op in [
        FaultOp::Allocate,
        FaultOp::AllocHost,
        FaultOp::Copy,
        FaultOp::IpcExport,
        FaultOp::Synchronize,
    ] {
        assert!(sim.op_count(op) > 0, "the workload never calls {op:?}");
    }
    // Opening in the exporting process is a view: no driver open.
    assert_eq!(sim.op_count(FaultOp::IpcOpen), 0);
}

#[test]
fn every_injected_fault_is_the_typed_error_and_leaks_nothing() {
    let counts = op_counts();
    let mut runs = 0;
    for (op, count) in counts {
        for n in 1..=count {
            let what = format!("fault at call {n} of {count} of {op:?}");
            let (sim, backend) = fresh();
            let error = injected(op, n);
            sim.fail_nth(op, n, error.clone()).expect("arm fault");
            match run_workload(&backend, &what) {
                Ok(()) => panic!("{what}: the workload succeeded; the fault went unnoticed"),
                Err(e) => assert!(
                    is_the_injected(&e, &error),
                    "{what}: another error came back: {e:?}, not {error:?}"
                ),
            }
            assert_clean(&sim, &backend, &what);
            // The simulator is usable after the fault.
            run_workload(&backend, &format!("{what}, then again")).expect("a clean rerun");
            assert_clean(&sim, &backend, &format!("{what}, then again"));
            runs += 1;
        }
    }
    eprintln!("{runs} fault positions checked");
    assert!(runs > 20, "only {runs} fault positions");
}

#[test]
fn random_faults_give_typed_errors_and_leak_nothing() {
    let mut failed = 0;
    for seed in 0..64u64 {
        let (sim, backend) = fresh();
        for (i, op) in FaultOp::ALL.into_iter().enumerate() {
            sim.fail_randomly(op, 0.03, seed * 7 + i as u64, injected(op, 0))
                .expect("arm fault");
        }
        match run_workload(&backend, &format!("seed {seed}")) {
            Ok(()) => {}
            Err(e) => {
                failed += 1;
                let expected = matches!(e.kind(), ErrorKind::OutOfMemory | ErrorKind::Driver)
                    && e.to_string().contains("injected at call 0");
                assert!(expected, "seed {seed}: not an injected error: {e}");
            }
        }
        sim.clear_faults();
        assert_clean(&sim, &backend, &format!("seed {seed}"));
    }
    eprintln!("{failed} of 64 seeded runs hit an injected fault");
    assert!(
        (1..64).contains(&failed),
        "{failed} of 64 seeded runs failed"
    );
}

#[test]
fn an_injected_copy_fault_changes_no_bytes() {
    let (sim, backend) = fresh();
    let ctx = backend.context(0).expect("context");
    let buf = ctx
        .buffer_from_data(&pattern(100, 2))
        .expect("buffer_from_data");
    let src = ctx
        .buffer_from_data(&pattern(100, 3))
        .expect("buffer_from_data");
    let error = injected(FaultOp::Copy, 1);
    sim.fail_nth(FaultOp::Copy, 1, error.clone())
        .expect("arm fault");
    assert_eq!(buf.copy_from_host(&[0; 100], 0, None), Err(error.clone()));
    sim.fail_nth(FaultOp::Copy, 1, error.clone())
        .expect("arm fault");
    assert_eq!(buf.copy_from_device(&src, 0, None), Err(error.clone()));
    sim.fail_nth(FaultOp::Copy, 1, error.clone())
        .expect("arm fault");
    let mut dst = [7u8; 100];
    assert_eq!(buf.copy_to_host_into(0, &mut dst, None), Err(error.clone()));
    assert_eq!(dst, [7; 100], "a failed copy to the host wrote nothing");
    assert_eq!(buf.to_vec().expect("to_vec"), pattern(100, 2));
    sim.fail_nth(FaultOp::Allocate, 1, injected(FaultOp::Allocate, 1))
        .expect("arm fault");
    let before = ctx.bytes_allocated();
    assert!(ctx.buffer_from_data(&buf).is_err());
    assert_eq!(ctx.bytes_allocated(), before);
    sim.fail_nth(FaultOp::Copy, 1, error.clone())
        .expect("arm fault");
    assert_eq!(ctx.buffer_from_data(&buf).map(|_| ()), Err(error));
    assert_eq!(
        ctx.bytes_allocated(),
        before,
        "a failed buffer_from_data frees its buffer"
    );
    drop((buf, src));
    assert_clean(&sim, &backend, "after the copy faults");
}
