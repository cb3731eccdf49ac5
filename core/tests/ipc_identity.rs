//! An IPC handle opened in the process that exported it is a view of the exporter's
//! memory, found in the process's export registry. It must be found by what the memory
//! is, not only by the handle's bytes: the export's backend kind, the implementation of
//! the context that exported it, and its device must be the opening context's, or the
//! open is refused (`InvalidIpcHandle`, naming the mismatch) and takes no memory.
//!
//! The exporter is the simulator; the other contexts are mocks, which the tests never
//! expect to be asked anything about IPC (a mock asked for what it has no expectation of
//! panics).

use std::sync::Arc;

use cudabuf_core::backend::MockRawContext;
use cudabuf_core::{Backend, BackendKind, Context, DeviceBuffer, ErrorKind, IpcMemHandle};
use cudabuf_sim::SimBackend;

/// A device buffer of the simulator's device `device` holding `len` known bytes, its own
/// allocation (so that its handle's pyarrow form, offset 0, names it), and its handle.
fn exported(backend: &Backend, device: usize, len: usize) -> (DeviceBuffer, IpcMemHandle) {
    let ctx = backend.context(device).expect("context");
    let buf = ctx.new_exclusive_buffer(len).expect("new_exclusive_buffer");
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    buf.copy_from_host(&bytes, 0, None).expect("copy_from_host");
    let handle = buf.export_for_ipc().expect("export_for_ipc");
    (buf, handle)
}

/// A mock context on device 0, labelled `kind`.
fn mock_context(kind: BackendKind) -> Context {
    let mut mock = MockRawContext::new();
    mock.expect_handle().return_const(0x1D_0026u64);
    // SAFETY: a `Sim` label is a mock's right one. A `Cuda` one is against `from_raw`'s
    // rule, on purpose: the test needs a context that says CUDA in a process where the
    // simulator exported memory, and nothing of this mock leaves cudabuf (no Arrow export,
    // no IPC handle of its own, no driver call).
    unsafe { Context::from_raw(Arc::new(mock), kind) }
}

/// `opened` was refused with `InvalidIpcHandle`, and its reason names `what`.
#[track_caller]
fn assert_refused(opened: cudabuf_core::Result<DeviceBuffer>, what: &str) {
    match opened {
        Ok(buf) => panic!(
            "opened a view of {} bytes at {:#x} of the {} context on device {}; expected a \
             refusal naming {what}",
            buf.size(),
            buf.address(),
            buf.context().backend_kind(),
            buf.context().device_number()
        ),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidIpcHandle, "{e}");
            assert!(e.to_string().contains(what), "the reason names {what}: {e}");
        }
    }
}

/// The 72-byte (pyarrow) form of a simulator handle carries no backend and reads as a
/// CUDA handle: opened through a CUDA context it used to find the simulator's export by
/// its raw bytes and give a view of simulator memory to a CUDA context's caller.
#[test]
fn a_simulator_export_is_not_opened_through_a_cuda_context() {
    let sim = Backend::new(SimBackend::new());
    let (buf, handle) = exported(&sim, 0, 1000);
    let pyarrow = IpcMemHandle::from_bytes(&handle.to_bytes()[..72]).expect("72 bytes");
    assert_eq!(
        pyarrow.backend(),
        Some(BackendKind::CUDA),
        "pyarrow's form reads as a CUDA handle"
    );
    let cuda = mock_context(BackendKind::CUDA);
    let counted = buf.context().bytes_allocated();
    assert_refused(cuda.open_ipc_buffer(&pyarrow), "sim");
    assert_eq!(buf.context().bytes_allocated(), counted, "nothing taken");
    assert_eq!(cuda.bytes_allocated(), 0);
    // The full handle opens through the simulator's own context.
    let opened = buf.context().open_ipc_buffer(&handle).expect("open");
    assert_eq!((opened.address(), opened.size()), (buf.address(), 1000));
}

/// A context of the same backend kind but another implementation (a mock labelled
/// `Sim`) is not the exporter's device context: the export is not its memory.
#[test]
fn an_export_is_not_opened_through_another_implementation() {
    let sim = Backend::new(SimBackend::new());
    let (buf, handle) = exported(&sim, 0, 1000);
    let other = mock_context(BackendKind::SIM);
    let counted = buf.context().bytes_allocated();
    assert_refused(other.open_ipc_buffer(&handle), "implementation");
    let pyarrow = IpcMemHandle::from_bytes(&handle.to_bytes()[..72]).expect("72 bytes");
    assert_refused(other.open_ipc_buffer(&pyarrow), "sim");
    assert_eq!(buf.context().bytes_allocated(), counted, "nothing taken");
    assert_eq!(other.bytes_allocated(), 0);
}

/// A handle exported on device 0 and opened, in the same process, through device 1's
/// context: the view would be device 0's memory in device 0's context, handed to a
/// caller who asked for device 1.
#[test]
fn an_export_is_not_opened_through_another_device() {
    let sim = Backend::new(SimBackend::new());
    let (buf, handle) = exported(&sim, 0, 1000);
    let device1 = sim.context(1).expect("context(1)");
    let counted = (buf.context().bytes_allocated(), device1.bytes_allocated());
    assert_refused(device1.open_ipc_buffer(&handle), "device 0");
    assert_eq!(
        (buf.context().bytes_allocated(), device1.bytes_allocated()),
        counted,
        "nothing taken"
    );
    // The exporter's device opens it.
    let opened = sim.context(0).unwrap().open_ipc_buffer(&handle).unwrap();
    assert_eq!(opened.address(), buf.address());
}

/// `handle`'s bytes with the device field set to `device` and the checksum redone: what a
/// peer that edits a handle it was given would hand over.
fn with_device(handle: &IpcMemHandle, device: u32) -> IpcMemHandle {
    let mut bytes = handle.to_bytes();
    bytes[84..88].copy_from_slice(&device.to_le_bytes());
    let end = bytes.len() - 8;
    let sum = bytes[..end].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    bytes[end..].copy_from_slice(&sum.to_le_bytes());
    IpcMemHandle::from_bytes(&bytes).expect("a well-formed handle")
}

/// A handle whose device field was edited to name another device (one that exists, and
/// one that does not) is refused in the exporting process, even through the context of
/// the device the memory is really on: the handle does not describe that memory.
#[test]
fn a_handle_naming_another_device_than_its_export_is_refused() {
    let sim = Backend::new(SimBackend::new());
    let (buf, handle) = exported(&sim, 0, 1000);
    let device0 = sim.context(0).expect("context(0)");
    for device in [1, 7] {
        let forged = with_device(&handle, device);
        assert_eq!(forged.device_number(), Some(device as usize));
        let counted = device0.bytes_allocated();
        assert_refused(
            device0.open_ipc_buffer(&forged),
            &format!("device {device}"),
        );
        assert_eq!(device0.bytes_allocated(), counted, "nothing taken");
    }
    let opened = device0
        .open_ipc_buffer(&handle)
        .expect("the true handle opens");
    assert_eq!(opened.address(), buf.address());
}
