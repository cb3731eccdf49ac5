//! The CPython buffer protocol (PEP 3118) on an abi3 build for Python 3.9+.
//!
//! PyO3 leaves the buffer protocol out of abi3 builds older than 3.11, because `Py_buffer`,
//! `PyObject_GetBuffer`, `PyBuffer_Release`, `PyBuffer_FillInfo` and the type slots
//! `Py_bf_getbuffer` / `Py_bf_releasebuffer` joined the *limited API* only in 3.11. They
//! have been in every CPython 3 all along, unchanged: `Py_buffer`'s layout is the one of
//! Python 3.3, which 3.11 froze into the stable ABI as it was, the functions are exported
//! by every interpreter, and `PyType_FromSpec` accepts the two buffer slots since 3.9
//! (bpo-40724). So this module declares them itself, exactly as CPython does, and the one
//! wheel exports and consumes buffers on 3.9 and later. (Linux only, like the rest of the
//! package: extension modules there resolve interpreter symbols at load time.)
//!
//! - [`HostBytes`]: a consumer's view of any buffer-protocol object (bytes, bytearray,
//!   memoryview, NumPy arrays, pyarrow buffers, ...), held until dropped; while held, the
//!   exporter may not move or resize the memory (CPython's rule).
//! - [`fill_buffer_info`]: the exporter side, used by the host buffer types' slot.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;

/// CPython's `Py_buffer`, field for field (`Include/pybuffer.h`, unchanged since 3.3).
#[repr(C)]
pub(crate) struct PyBuffer {
    pub(crate) buf: *mut c_void,
    pub(crate) obj: *mut ffi::PyObject,
    pub(crate) len: ffi::Py_ssize_t,
    pub(crate) itemsize: ffi::Py_ssize_t,
    pub(crate) readonly: c_int,
    pub(crate) ndim: c_int,
    pub(crate) format: *mut c_char,
    pub(crate) shape: *mut ffi::Py_ssize_t,
    pub(crate) strides: *mut ffi::Py_ssize_t,
    pub(crate) suboffsets: *mut ffi::Py_ssize_t,
    pub(crate) internal: *mut c_void,
}

/// `PyBUF_SIMPLE`: a contiguous block of bytes.
pub(crate) const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`.
pub(crate) const PYBUF_WRITABLE: c_int = 0x0001;
/// The type slot id of `bf_getbuffer` (`Include/typeslots.h`, stable ABI numbering).
pub(crate) const PY_BF_GETBUFFER: c_int = 1;
/// The type slot id of `bf_releasebuffer`.
pub(crate) const PY_BF_RELEASEBUFFER: c_int = 2;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
    fn PyBuffer_FillInfo(
        view: *mut PyBuffer,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

impl PyBuffer {
    fn empty() -> Self {
        PyBuffer {
            buf: ptr::null_mut(),
            obj: ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: ptr::null_mut(),
            shape: ptr::null_mut(),
            strides: ptr::null_mut(),
            suboffsets: ptr::null_mut(),
            internal: ptr::null_mut(),
        }
    }
}

/// What a consumer of a view of cudabuf's own host memory does with the bytes, for the
/// race check of pinned memory (`HostBuffer::check_host_access`) its export makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consumer {
    /// Reads them on the host (a comparison, a file write, a parse).
    Read,
    /// Writes them on the host (a file read into them).
    Write,
    /// Hands them to a synchronous copy of the backend, which checks its own accesses
    /// (as the legacy stream orders them).
    Copy,
}

thread_local! {
    /// Set by [`HostBytes`] while it asks one of cudabuf's host memory objects for a view;
    /// `None` for any other consumer (a `memoryview`, NumPy, ...), checked as a reader.
    static CONSUMER: Cell<Option<Consumer>> = const { Cell::new(None) };
}

/// Who asks for the view being exported now (see [`Consumer`]): `None` for a consumer
/// outside this crate.
pub(crate) fn current_consumer() -> Option<Consumer> {
    CONSUMER.with(Cell::get)
}

/// A contiguous byte view of a Python object's memory through the buffer protocol, held
/// (and the exporter kept alive) until dropped.
///
/// The bytes are reached only through [`as_slice`](Self::as_slice) /
/// [`as_mut_slice`](Self::as_mut_slice), for the duration of one copy. As with pyarrow and
/// NumPy, another Python thread must not write the same memory while a copy with the GIL
/// released reads or writes it.
pub(crate) struct HostBytes {
    /// Boxed: exporters may point `shape`/`strides` into the struct itself.
    view: Box<PyBuffer>,
    writable: bool,
}

// SAFETY: the view is a pointer and a length into memory the exporter keeps in place while
// the view is held (CPython's buffer contract); nothing in it is tied to a thread. It is
// released under the GIL (see `Drop`).
unsafe impl Send for HostBytes {}
// SAFETY: shared access only reads the pointer and length; the bytes themselves are
// reached through `as_slice`/`as_mut_slice` under the rules documented there.
unsafe impl Sync for HostBytes {}

impl HostBytes {
    /// A read-only byte view of `obj` (`PyBUF_SIMPLE`: contiguous memory, any item type),
    /// read on the host.
    pub(crate) fn read(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE, false, Consumer::Read)
    }

    /// A writable byte view of `obj` (`PyBUF_WRITABLE`), written on the host.
    pub(crate) fn write(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_WRITABLE, true, Consumer::Write)
    }

    /// As [`read`](Self::read), for the source of a synchronous copy of the backend.
    pub(crate) fn read_for_copy(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_SIMPLE, false, Consumer::Copy)
    }

    /// As [`write`](Self::write), for the destination of a synchronous copy of the backend.
    pub(crate) fn write_for_copy(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        Self::get(obj, PYBUF_WRITABLE, true, Consumer::Copy)
    }

    fn get(
        obj: &Bound<'_, PyAny>,
        flags: c_int,
        writable: bool,
        consumer: Consumer,
    ) -> PyResult<Self> {
        let mut view = Box::new(PyBuffer::empty());
        // Only for cudabuf's own host memory, whose slot runs no Python code: no other
        // export can happen while it is set.
        let ours = crate::host_memory::as_host_memory(obj).is_some();
        if ours {
            CONSUMER.with(|c| c.set(Some(consumer)));
        }
        // SAFETY: `obj` is a live object (we hold a reference and the GIL); `view` is a
        // valid, writable `Py_buffer` that stays at its address (boxed) until released.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if ours {
            CONSUMER.with(|c| c.set(None));
        }
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        if view.len < 0 || (view.buf.is_null() && view.len > 0) {
            // SAFETY: the view was filled by a successful `PyObject_GetBuffer`.
            unsafe { PyBuffer_Release(&mut *view) };
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "the object exported an invalid buffer (null or negative length)",
            ));
        }
        Ok(HostBytes { view, writable })
    }

    /// The number of bytes.
    pub(crate) fn len(&self) -> usize {
        self.view.len as usize
    }

    /// The bytes.
    ///
    /// # Safety
    /// No other thread may write this memory while the slice lives (Python threads writing
    /// through another view of it, while the GIL is released, are the caller's concern).
    pub(crate) unsafe fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: the exporter guarantees `len` bytes at `buf` while the view is held
        // (checked non-null above); the caller guarantees no concurrent writes.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len()) }
    }

    /// The bytes, writable (only for views made by [`write`](Self::write)).
    ///
    /// # Safety
    /// No other thread may read or write this memory while the slice lives, and no other
    /// slice of this view may exist.
    pub(crate) unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        debug_assert!(self.writable);
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; the exporter granted write access (`PyBUF_WRITABLE`).
        unsafe { std::slice::from_raw_parts_mut(self.view.buf as *mut u8, self.len()) }
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        Python::attach(|_| {
            // SAFETY: the view was filled by a successful `PyObject_GetBuffer` and is
            // released exactly once, here, with the thread attached.
            unsafe { PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// Fill `view` for an exporter of `len` writable bytes at `buf` owned by `exporter`
/// (CPython's `PyBuffer_FillInfo`: one-dimensional unsigned bytes, format `"B"`); takes a
/// new reference to `exporter`. Returns 0, or -1 with a Python error set.
///
/// # Safety
/// `view` must be the `Py_buffer` CPython passed to a `bf_getbuffer` slot, `exporter` the
/// object it was called on, and `buf..buf+len` memory that stays valid and in place while
/// `exporter` lives.
pub(crate) unsafe fn fill_buffer_info(
    view: *mut PyBuffer,
    exporter: *mut ffi::PyObject,
    buf: *mut u8,
    len: usize,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded from this function's contract; `len` fits `Py_ssize_t` (it is the
    // size of an allocation).
    unsafe { PyBuffer_FillInfo(view, exporter, buf.cast(), len as ffi::Py_ssize_t, 0, flags) }
}
