//! Testing your own code against a mocked context (the `mock` feature).
//!
//! Mocks test *callers*: the order of calls your code makes and how it handles errors.
//! Backend behaviour is the conformance suite's job.

use std::sync::Arc;

use cudabuf::backend::MockRawContext;
use cudabuf::{BackendKind, Context, DeviceBuffer, Error, ErrorKind, Result};
use mockall::{predicate, Sequence};

/// User code under test: after launching work that fills `buf`, results must be read
/// only after the context is synchronized.
fn fetch_results(ctx: &Context, buf: &DeviceBuffer) -> Result<Vec<u8>> {
    ctx.synchronize()?;
    buf.to_vec()
}

/// User code under test: allocate a scratch buffer, halving the request on out-of-memory
/// down to `min` bytes.
fn allocate_scratch(ctx: &Context, mut size: usize, min: usize) -> Result<DeviceBuffer> {
    loop {
        match ctx.new_buffer(size) {
            Err(e) if e.kind() == ErrorKind::OutOfMemory && size / 2 >= min => size /= 2,
            other => return other,
        }
    }
}

fn oom(requested: usize) -> Error {
    Error::OutOfMemory {
        device: 0,
        requested,
        detail: "mocked".into(),
    }
}

#[test]
fn results_are_read_only_after_synchronize() {
    let mut mock = MockRawContext::new();
    let mut seq = Sequence::new();
    mock.expect_allocate()
        .with(predicate::eq(4))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(0x1000));
    mock.expect_synchronize()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|| Ok(()));
    mock.expect_copy_device_to_host()
        .withf(|dst, src| dst.len() == 4 && *src == 0x1000)
        .times(1)
        .in_sequence(&mut seq)
        .returning(|dst, _| {
            dst.copy_from_slice(b"done");
            Ok(())
        });
    mock.expect_free()
        .with(predicate::eq(0x1000))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(()));

    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    let buf = ctx.new_buffer(4).unwrap();
    assert_eq!(fetch_results(&ctx, &buf).unwrap(), b"done");
    drop(buf);
    assert_eq!(ctx.bytes_allocated(), 0);
}

#[test]
fn a_failed_synchronize_reads_nothing() {
    let mut mock = MockRawContext::new();
    mock.expect_allocate().returning(|_| Ok(0x2000));
    mock.expect_synchronize().returning(|| {
        Err(Error::Driver {
            call: "cuCtxSynchronize",
            name: "CUDA_ERROR_LAUNCH_FAILED".into(),
            code: 719,
            message: "unspecified launch failure".into(),
        })
    });
    mock.expect_copy_device_to_host().never();
    mock.expect_free().times(1).returning(|_| Ok(()));

    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    let buf = ctx.new_buffer(8).unwrap();
    let e = fetch_results(&ctx, &buf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Driver);
    assert!(e.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"));
}

#[test]
fn scratch_allocation_halves_on_out_of_memory() {
    let mut mock = MockRawContext::new();
    mock.expect_allocate()
        .with(predicate::ge(512))
        .times(2)
        .returning(|n| Err(oom(n)));
    mock.expect_allocate()
        .with(predicate::eq(256))
        .times(1)
        .returning(|_| Ok(0x3000));
    mock.expect_free().times(1).returning(|_| Ok(()));

    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    let buf = allocate_scratch(&ctx, 1024, 128).unwrap();
    assert_eq!(buf.size(), 256);
    assert_eq!(ctx.bytes_allocated(), 256);
}

#[test]
fn scratch_allocation_gives_up_at_the_minimum() {
    let mut mock = MockRawContext::new();
    mock.expect_allocate().times(3).returning(|n| Err(oom(n)));

    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    let e = allocate_scratch(&ctx, 4096, 1024).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert_eq!(ctx.bytes_allocated(), 0);
}

/// User code under test: download a device buffer on a stream into a reused pinned
/// buffer, and read the bytes only once the transfer has completed.
fn download_on_stream(
    stream: &cudabuf::Stream,
    buf: &DeviceBuffer,
    host: cudabuf::HostBuffer,
) -> Result<cudabuf::HostBuffer> {
    let transfer = stream.copy_to_host(buf, host)?;
    // ... other work overlaps the copy here ...
    Ok(transfer.wait()?)
}

#[test]
fn stream_downloads_are_read_only_after_the_copy_completes() {
    let mut mock = MockRawContext::new();
    let mut seq = Sequence::new();
    mock.expect_handle().return_const(0x51u64);
    mock.expect_allocate().returning(|_| Ok(0x1000));
    mock.expect_alloc_host().returning(|_| Ok(0x9000));
    mock.expect_stream_create()
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(7));
    mock.expect_event_create()
        .with(predicate::eq(false))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(100));
    mock.expect_copy_device_to_host_on()
        .withf(|dst, src, stream| dst.len() == 4 && *src == 0x1000 && *stream == 7)
        .times(1)
        .in_sequence(&mut seq)
        .returning(|dst, _, _| {
            dst.copy_from_slice(b"done");
            Ok(())
        });
    mock.expect_event_record()
        .with(predicate::eq(100), predicate::eq(7))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_, _| Ok(()));
    mock.expect_event_synchronize()
        .with(predicate::eq(100))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(()));
    // The stream's last clone goes: its internal event, then the stream, are destroyed.
    mock.expect_event_destroy()
        .with(predicate::eq(100))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(()));
    mock.expect_stream_destroy()
        .with(predicate::eq(7))
        .times(1)
        .in_sequence(&mut seq)
        .returning(|_| Ok(()));
    mock.expect_free().returning(|_| Ok(()));
    mock.expect_free_host().returning(|_, _| Ok(()));

    // SAFETY: a mock labelled `Sim`: nothing reads its values as CUDA handles.
    let ctx = unsafe { Context::from_raw(Arc::new(mock), BackendKind::SIM) };
    let buf = ctx.new_buffer(4).unwrap();
    let stream = ctx.new_stream().unwrap();
    let host = ctx.new_host_buffer(4).unwrap();
    let host = download_on_stream(&stream, &buf, host).unwrap();
    assert_eq!(&host[..], b"done");
    drop(stream);
}
