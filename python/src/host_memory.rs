//! Host memory owned by cudabuf, exported through the buffer protocol: `Buffer` (pyarrow's
//! `pa.Buffer` as `copy_to_host` returns it; also slices and serialized handles) and
//! `HostBuffer(Buffer)` (pinned memory from `new_host_buffer`).
//!
//! # How the buffer protocol is exported on Python 3.9+ from an abi3 wheel
//! PyO3 cannot give an abi3-py39 class a `bf_getbuffer` slot. So the methods live on a
//! PyO3 class, `_HostMemory`, and the two public classes are subclasses of it made at
//! module import with `PyType_FromSpecWithBases` (which accepts the buffer slot since
//! Python 3.9): `Buffer` adds the slot, `HostBuffer` inherits it. Instances are always of
//! the public classes (made by calling them with a private token; a user calling them gets
//! pyarrow's `TypeError`). The exported `Py_buffer` holds a reference to the object, and
//! the object owns the memory, so a `memoryview`, NumPy array or `pa.py_buffer` over it
//! keeps the memory alive however it is sliced; the memory never moves or shrinks.
//!
//! # Lending pinned memory to asynchronous copies
//! A pinned buffer's bytes are owned by a [`Lender`]: an asynchronous copy
//! (`Stream.copy_from_host` / `copy_to_host`) borrows the range it touches until its
//! transfer is waited for, and every access from Python to a lent byte raises
//! `BufferInUseError` meanwhile (see `crate::lending`). The buffer slot records each
//! export, and the release slot forgets it, so that a copy is refused while a view of its
//! range is exported.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PySlice, PyTuple, PyType};

use crate::buffer_ffi::{self, Consumer, HostBytes, PyBuffer};
use crate::errors::{buffer_in_use, non_negative, OrRaise};
use crate::lending::{InUse, Lender, Span};

/// Where host bytes live.
enum Storage {
    /// Pinned memory from `new_host_buffer`, lent to asynchronous copies by ranges.
    Pinned(Mutex<Lender>),
    /// A heap block (from `Box<[u8]>`), freed on drop.
    Heap,
}

/// Host bytes reached only through the raw pointer taken when they were allocated.
struct Block {
    storage: Storage,
    /// Writable pointer to the first byte (dangling for 0 bytes), valid for `len` bytes
    /// while the block lives; taken from a `&mut [u8]` at allocation.
    base: *mut u8,
    len: usize,
}

// SAFETY: the block owns its memory (a pinned allocation, through its lender and the
// ranges lent from it, or a heap block); the pointer is only an address into it, valid
// from any thread.
unsafe impl Send for Block {}
// SAFETY: as above; Rust never makes references into the bytes except for the duration of
// one copy (see `HostMemory::with_slice`), and never into lent bytes.
unsafe impl Sync for Block {}

impl Block {
    /// The lender of a pinned block (`None` for a heap block, which is never lent).
    fn lender(&self) -> Option<MutexGuard<'_, Lender>> {
        match &self.storage {
            Storage::Pinned(lender) => Some(lender.lock().unwrap_or_else(PoisonError::into_inner)),
            Storage::Heap => None,
        }
    }
}

/// A range of a pinned host memory object lent to an asynchronous copy: hand the ranges
/// back with [`give_back`](Self::give_back) once the copy is known complete.
pub(crate) struct Loan {
    block: Arc<Block>,
    span: Span,
}

impl Loan {
    /// The offset of the lent range in its buffer (the offset of the first range lent).
    pub(crate) fn start(&self) -> usize {
        self.span.start
    }

    /// The copy is complete: its bytes may be used again.
    pub(crate) fn give_back(&self, pieces: Vec<cudabuf::HostRange>) {
        if let Some(mut lender) = self.block.lender() {
            lender.give_back(self.span, pieces);
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        if let Storage::Heap = self.storage {
            if self.len > 0 {
                let slice = std::ptr::slice_from_raw_parts_mut(self.base, self.len);
                // SAFETY: `base..base+len` came from `Box::<[u8]>::into_raw` (see
                // `HostMemory::from_vec`) and is freed once, here.
                drop(unsafe { Box::from_raw(slice) });
            }
        }
    }
}

/// The base class of `Buffer` and `HostBuffer` (the methods; the buffer-protocol slot is on
/// the subclasses, see the module docs). Not instantiable.
#[pyclass(
    module = "cudabuf.cuda",
    name = "_HostMemory",
    subclass,
    frozen,
    weakref
)]
pub(crate) struct HostMemory {
    block: Arc<Block>,
    offset: usize,
    len: usize,
    parent: Option<Py<PyAny>>,
}

/// A private token: the only thing the host buffer constructors accept.
#[pyclass(module = "cudabuf.cuda", name = "_HostMemoryToken", frozen)]
struct HostMemoryToken(Mutex<Option<HostMemory>>);

static BUFFER_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static HOST_BUFFER_TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();

const CONSTRUCTOR_MESSAGE: &str = "Do not call HostBuffer's constructor directly, use `cuda.new_host_buffer` function instead (or `CudaBuffer.copy_to_host` for a Buffer).";

impl HostMemory {
    /// Host memory over a vector (the result of a device-to-host copy), no copy.
    pub(crate) fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        let base = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr()
        } else {
            Box::into_raw(bytes.into_boxed_slice()).cast::<u8>()
        };
        HostMemory {
            block: Arc::new(Block {
                storage: Storage::Heap,
                base,
                len,
            }),
            offset: 0,
            len,
            parent: None,
        }
    }

    /// Host memory over a pinned host buffer.
    pub(crate) fn from_pinned(mut host: cudabuf::HostBuffer) -> Self {
        let len = host.len();
        // Taken once from a mutable borrow: all later access goes through this pointer
        // (the allocation never moves, whoever owns the `HostBuffer` or its ranges).
        let base = host.as_mut_ptr();
        HostMemory {
            block: Arc::new(Block {
                storage: Storage::Pinned(Mutex::new(Lender::new(host))),
                base,
                len,
            }),
            offset: 0,
            len,
            parent: None,
        }
    }

    fn ptr(&self) -> *mut u8 {
        self.block.base.wrapping_add(self.offset)
    }

    /// This memory's range of its block.
    fn span(&self) -> Span {
        Span {
            start: self.offset,
            len: self.len,
        }
    }

    /// Whether this is pinned memory (from `new_host_buffer`, or a slice of it).
    pub(crate) fn is_pinned(&self) -> bool {
        matches!(self.block.storage, Storage::Pinned(_))
    }

    /// Run `f` with the whole pinned buffer behind this memory and this memory's offset in
    /// it: `None` for pageable memory; `BufferInUseError` while any range of the buffer is
    /// lent to a copy in flight (a device view would reach those bytes).
    pub(crate) fn with_pinned<R>(
        &self,
        what: &str,
        f: impl FnOnce(&cudabuf::HostBuffer, usize) -> R,
    ) -> Option<PyResult<R>> {
        let lender = self.block.lender()?;
        // The error is lazy (`errors::lazy_error`): making it under the lock runs no
        // Python code.
        Some(match lender.whole() {
            Some(host) => Ok(f(host, self.offset)),
            None => Err(buffer_in_use(what, InUse::Lent, self.span())),
        })
    }

    /// Lend the first `len` bytes of this (pinned) memory to a copy: the loan and the
    /// owned ranges covering them, in order. `len` is at most this memory's length.
    ///
    /// Raises `InvalidTypeError` for pageable memory, `BufferInUseError` if a byte of the
    /// range is lent or exported.
    pub(crate) fn lend(&self, what: &str, len: usize) -> PyResult<(Loan, Vec<cudabuf::HostRange>)> {
        debug_assert!(len <= self.len);
        let span = Span {
            start: self.offset,
            len: len.min(self.len),
        };
        let Some(mut lender) = self.block.lender() else {
            return Err(crate::errors::invalid_type(
                what,
                "an asynchronous copy needs pinned host memory (cudabuf.cuda.new_host_buffer, or a slice of one); this Buffer is pageable",
            ));
        };
        let lent = lender.lend(span);
        drop(lender);
        let pieces = lent.map_err(|in_use| buffer_in_use(what, in_use, span))?;
        Ok((
            Loan {
                block: self.block.clone(),
                span,
            },
            pieces,
        ))
    }

    /// The size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Make the Python object: a `HostBuffer` for a whole pinned buffer, else a `Buffer`.
    pub(crate) fn into_object(self, py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        let class = match (&self.block.storage, &self.parent) {
            (Storage::Pinned(_), None) => HOST_BUFFER_TYPE.get(py),
            _ => BUFFER_TYPE.get(py),
        }
        .ok_or_else(|| PyTypeError::new_err("cudabuf's host buffer types are not initialized"))?;
        let token = Bound::new(py, HostMemoryToken(Mutex::new(Some(self))))?;
        class.bind(py).call1((token,))
    }

    fn slice_object<'py>(
        slf: &Bound<'py, Self>,
        offset: usize,
        length: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        match offset.checked_add(length) {
            Some(end) if end <= this.len => {}
            _ => {
                return Err(cudabuf::Error::out_of_range(
                    "slice",
                    "host buffer",
                    offset,
                    length,
                    this.len,
                ))
                .or_raise()
            }
        }
        HostMemory {
            block: this.block.clone(),
            offset: this.offset + offset,
            len: length,
            parent: Some(slf.clone().into_any().unbind()),
        }
        .into_object(slf.py())
    }

    /// Run `f` over the bytes (a copy out of them); `BufferInUseError` (for `what`) if a
    /// byte of them is lent to a copy in flight; on the simulator `DataRaceError` if a
    /// stream operation through a device view of pinned bytes may still write them.
    fn with_slice<R>(&self, what: &str, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
        self.with_range(what, 0, self.len, f)
    }

    /// [`with_slice`](Self::with_slice) over the `len` bytes at `start` only (checked
    /// alone: a read of one byte is not refused for a copy using others). `start + len`
    /// is at most this memory's length.
    fn with_range<R>(
        &self,
        what: &str,
        start: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> PyResult<R> {
        debug_assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        let len = len.min(self.len.saturating_sub(start));
        let span = Span {
            start: self.offset + start,
            len,
        };
        // Held while `f` reads: no copy can borrow these bytes meanwhile.
        let lender = self.block.lender();
        if lender.as_ref().is_some_and(|l| l.is_lent(span)) {
            drop(lender);
            return Err(buffer_in_use(what, InUse::Lent, span));
        }
        if let Some(Err(race)) = lender.as_ref().map(|l| l.check_host_access(span, false)) {
            // Released first (no Python work under a lock of ours).
            drop(lender);
            return Err(crate::errors::to_pyerr(race));
        }
        let slice: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: `ptr()+start..ptr()+start+len` lies in the block (`start + len` is at
            // most this memory's length), which is alive (we hold an `Arc`); no copy in
            // flight uses these bytes (checked above, under the lock that lending takes);
            // Python threads writing it concurrently are excluded by the GIL, which
            // callers hold.
            unsafe { std::slice::from_raw_parts(self.ptr().add(start), len) }
        };
        let result = f(slice);
        drop(lender);
        Ok(result)
    }
}

#[pymethods]
impl HostMemory {
    #[new]
    #[pyo3(signature = (*args, **_kwargs))]
    fn py_new(args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        if args.len() == 1 {
            if let Ok(token) = args.get_item(0)?.cast::<HostMemoryToken>() {
                let taken = token
                    .get()
                    .0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(memory) = taken {
                    return Ok(memory);
                }
            }
        }
        Err(PyTypeError::new_err(CONSTRUCTOR_MESSAGE))
    }

    /// The size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.len
    }

    /// The host address of the first byte.
    #[getter]
    pub(crate) fn address(&self) -> usize {
        self.ptr() as usize
    }

    /// Always ``True``: the memory is on the host.
    #[getter]
    fn is_cpu(&self) -> bool {
        true
    }

    /// Always ``True``: the memory is writable.
    #[getter]
    fn is_mutable(&self) -> bool {
        true
    }

    /// The buffer this one was sliced from, or ``None``.
    #[getter]
    fn parent(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.parent.as_ref().map(|p| p.clone_ref(py))
    }

    fn __len__(&self) -> usize {
        self.len
    }

    /// The bytes as a new ``bytes`` object (a copy).
    ///
    /// Raises:
    ///     BufferInUseError: while the bytes are lent to an asynchronous copy.
    ///     DataRaceError: on the simulator, pinned bytes a stream may still write through
    ///         a device view (``Context.buffer_from_object``): synchronize first.
    fn to_pybytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.with_slice("to_pybytes", |bytes| PyBytes::new(py, bytes))
    }

    /// ``bytes(buf)``: as ``to_pybytes`` (a read of the bytes, where the buffer protocol
    /// would export a writable view).
    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.with_slice("bytes()", |bytes| PyBytes::new(py, bytes))
    }

    /// A zero-copy slice of ``length`` bytes (default: to the end) at ``offset``; it keeps
    /// this buffer alive.
    ///
    /// Fixed pyarrow quirk: a slice past the end is an ``OutOfRangeError`` (pyarrow
    /// clamps it).
    #[pyo3(signature = (offset = 0, length = None))]
    fn slice<'py>(
        slf: &Bound<'py, Self>,
        offset: i64,
        length: Option<i64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let offset = non_negative("slice", "offset", offset)?;
        let length = match length {
            Some(length) => non_negative("slice", "length", length)?,
            None => slf.get().len.checked_sub(offset).ok_or_else(|| {
                crate::errors::to_pyerr(cudabuf::Error::out_of_range(
                    "slice",
                    "host buffer",
                    offset,
                    0,
                    slf.get().len,
                ))
            })?,
        };
        Self::slice_object(slf, offset, length)
    }

    /// ``buf[i]`` is the byte at ``i`` (negative counts from the end); ``buf[a:b]`` is a
    /// zero-copy slice (clamped like Python sequences; step must be 1).
    fn __getitem__<'py>(
        slf: &Bound<'py, Self>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Ok(slice) = key.cast::<PySlice>() {
            let indices = slice.indices(this.len as isize)?;
            if indices.step != 1 {
                return Err(pyo3::exceptions::PyIndexError::new_err(
                    "only slices with step 1 are supported",
                ));
            }
            let length = indices.stop.saturating_sub(indices.start).max(0) as usize;
            return Self::slice_object(slf, indices.start as usize, length);
        }
        let index: i64 = key.extract()?;
        let position = if index < 0 {
            index + this.len as i64
        } else {
            index
        };
        if position < 0 || position as usize >= this.len {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "index {index} out of range for a buffer of {} bytes",
                this.len
            )));
        }
        Ok(this
            .with_range("buf[i]", position as usize, 1, |b| {
                b.first().copied().unwrap_or(0)
            })?
            .into_pyobject(py)?
            .into_any())
    }

    /// This memory as a ``pyarrow.Buffer``, without a copy (``pa.py_buffer(self)``): the
    /// pyarrow buffer has the same address and size, and keeps this object, and so the
    /// memory, alive for as long as it or any slice of it lives.
    ///
    /// Example::
    ///
    ///     host = dbuf.copy_to_host()          # a cudabuf.cuda.Buffer
    ///     arrow = host.to_pyarrow()           # a pa.Buffer over the same bytes
    ///     assert arrow.address == host.address
    ///
    /// Like any buffer-protocol view it is an export: while it lives, the bytes cannot be
    /// lent to an asynchronous copy (``BufferInUseError``).
    ///
    /// Raises:
    ///     ImportError: when pyarrow is not installed.
    ///     BufferInUseError: while the bytes are lent to an asynchronous copy.
    fn to_pyarrow<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("pyarrow")?
            .call_method1("py_buffer", (slf,))
    }

    /// Whether ``other`` (any bytes-like object) holds the same bytes.
    fn equals(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let other = HostBytes::read(other)?;
        // SAFETY: the GIL is held for the comparison, so no Python thread writes either side.
        self.with_slice("equals", |mine| mine == unsafe { other.as_slice() })
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        match HostBytes::read(other) {
            // SAFETY: as in `equals`.
            Ok(other) => self.with_slice("==", |mine| mine == unsafe { other.as_slice() }),
            // Bytes lent to an asynchronous copy, or racing with one: not comparable now.
            Err(e)
                if e.is_instance_of::<PyBufferError>(other.py())
                    || crate::errors::is_cuda_error(&e) =>
            {
                Err(e)
            }
            Err(_) => Ok(false),
        }
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let this = slf.get();
        let kind = if this.is_pinned() {
            "pinned"
        } else {
            "pageable"
        };
        Ok(format!(
            "<cudabuf.cuda.{} size={} address={:#x} {kind}>",
            slf.get_type().name()?,
            this.len,
            this.address()
        ))
    }
}

/// The `bf_getbuffer` slot of `Buffer` (and, inherited, `HostBuffer`).
unsafe extern "C" fn get_buffer(
    exporter: *mut ffi::PyObject,
    view: *mut PyBuffer,
    flags: c_int,
) -> c_int {
    let result = std::panic::catch_unwind(|| {
        // SAFETY: CPython calls buffer slots with the thread attached.
        let py = unsafe { Python::assume_attached() };
        if view.is_null() {
            PyBufferError::new_err("a null Py_buffer").restore(py);
            return -1;
        }
        // SAFETY: `exporter` is the live object the slot was called on (a borrowed ref).
        let object = unsafe { Bound::from_borrowed_ptr(py, exporter) };
        match object.cast::<HostMemory>() {
            Ok(memory) => {
                let memory = memory.get();
                // The export is recorded (and refused while a byte of it is lent) under
                // the lender's lock, held until the view is filled.
                let mut lender = memory.block.lender();
                let export = lender.as_mut().map(|l| l.export(memory.span()));
                let id = match export {
                    Some(Err(in_use)) => {
                        // Released first: raising runs the exception's `__init__`.
                        drop(lender);
                        buffer_in_use("the buffer protocol", in_use, memory.span()).restore(py);
                        return -1;
                    }
                    Some(Ok(id)) => id,
                    None => 0,
                };
                // Pinned bytes a stream may still use through a device view: on the
                // simulator, a race. Only cudabuf's own consumers, which say what they do
                // with the bytes, are checked; a consumer outside cudabuf (a memoryview,
                // NumPy, ...) is not: its view may be read, written, handed to a
                // synchronous copy or not used at all, and a correct program must never
                // be flagged. A synchronous copy checks its own accesses.
                let write = match crate::buffer_ffi::current_consumer() {
                    None | Some(Consumer::Copy) => None,
                    Some(Consumer::Read) => Some(false),
                    Some(Consumer::Write) => Some(true),
                };
                let race = match (lender.as_mut(), write) {
                    (Some(l), Some(write)) => l.check_host_access(memory.span(), write).err(),
                    _ => None,
                };
                if let Some(race) = race {
                    if let Some(l) = lender.as_mut() {
                        l.release_export(id);
                    }
                    // Released first, as above.
                    drop(lender);
                    crate::errors::to_pyerr(race).restore(py);
                    return -1;
                }
                // SAFETY: `view` is CPython's, `exporter` the object; the bytes live in the
                // block the object owns, which never moves, for as long as the object
                // lives, and the filled view holds a reference to it.
                let filled = unsafe {
                    buffer_ffi::fill_buffer_info(view, exporter, memory.ptr(), memory.len, flags)
                };
                if let Some(lender) = lender.as_mut() {
                    if filled == 0 {
                        // SAFETY: `view` was just filled (non-null, checked above); the
                        // export's id goes where the release slot finds it.
                        unsafe { (*view).internal = id as *mut c_void };
                    } else {
                        lender.release_export(id);
                    }
                }
                filled
            }
            Err(e) => {
                PyErr::from(e).restore(py);
                -1
            }
        }
    });
    result.unwrap_or_else(|_| {
        // SAFETY: as above.
        let py = unsafe { Python::assume_attached() };
        PyBufferError::new_err("cudabuf: panic while exporting a buffer").restore(py);
        -1
    })
}

/// The `bf_releasebuffer` slot of `Buffer` (and, inherited, `HostBuffer`): forget the
/// export recorded by `get_buffer`. CPython releases the object's reference itself.
unsafe extern "C" fn release_buffer(exporter: *mut ffi::PyObject, view: *mut PyBuffer) {
    let _ = std::panic::catch_unwind(|| {
        if view.is_null() {
            return;
        }
        // SAFETY: CPython calls buffer slots with the thread attached.
        let py = unsafe { Python::assume_attached() };
        // SAFETY: `view` is the `Py_buffer` `get_buffer` filled (CPython's contract).
        let id = unsafe { (*view).internal } as usize;
        if id == 0 {
            return;
        }
        // SAFETY: `exporter` is the live object the slot was called on (a borrowed ref).
        let object = unsafe { Bound::from_borrowed_ptr(py, exporter) };
        if let Ok(memory) = object.cast::<HostMemory>() {
            if let Some(mut lender) = memory.get().block.lender() {
                lender.release_export(id);
            }
        }
    });
}

/// Make a heap type `name` deriving from `base`, with the buffer slots if `buffer`.
fn make_type<'py>(
    py: Python<'py>,
    name: &'static std::ffi::CStr,
    doc: &'static std::ffi::CStr,
    base: &Bound<'py, PyType>,
    buffer: bool,
) -> PyResult<Bound<'py, PyType>> {
    let mut slots = Vec::new();
    if buffer {
        slots.push(ffi::PyType_Slot {
            slot: buffer_ffi::PY_BF_GETBUFFER,
            pfunc: get_buffer as *mut c_void,
        });
        slots.push(ffi::PyType_Slot {
            slot: buffer_ffi::PY_BF_RELEASEBUFFER,
            pfunc: release_buffer as *mut c_void,
        });
    }
    slots.push(ffi::PyType_Slot {
        slot: ffi::Py_tp_doc,
        pfunc: doc.as_ptr() as *mut c_void,
    });
    slots.push(ffi::PyType_Slot {
        slot: 0,
        pfunc: std::ptr::null_mut(),
    });
    // Leaked on purpose (two small types per process): CPython keeps `tp_name` pointing
    // into the spec's name, which is 'static anyway.
    let slots: &'static mut [ffi::PyType_Slot] = Box::leak(slots.into_boxed_slice());
    let spec: &'static mut ffi::PyType_Spec = Box::leak(Box::new(ffi::PyType_Spec {
        name: name.as_ptr(),
        basicsize: 0,
        itemsize: 0,
        flags: (ffi::Py_TPFLAGS_DEFAULT | ffi::Py_TPFLAGS_BASETYPE) as _,
        slots: slots.as_mut_ptr(),
    }));
    let bases = PyTuple::new(py, [base])?;
    // SAFETY: `spec` and its slots are valid and 'static; `bases` is a tuple of one type
    // that accepts subclasses (`_HostMemory` is `subclass`); the result is a new reference
    // or null with an error set.
    let ty = unsafe { ffi::PyType_FromSpecWithBases(spec, bases.as_ptr()) };
    if ty.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference to a type object.
    Ok(unsafe { Bound::from_owned_ptr(py, ty).cast_into_unchecked() })
}

/// Register `_HostMemory`, `Buffer` and `HostBuffer` in `module`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    module.add_class::<HostMemory>()?;
    let base = py.get_type::<HostMemory>();
    let buffer = make_type(
        py,
        c"cudabuf.cuda.Buffer",
        c"Host memory owned by cudabuf (pyarrow's ``pa.Buffer`` where pyarrow.cuda returns one:\n``CudaBuffer.copy_to_host``, ``IpcMemHandle.serialize``, slices of host buffers).\n\nSpeaks the buffer protocol: ``memoryview(buf)``, ``numpy.frombuffer(buf)`` and\n``pyarrow.py_buffer(buf)`` see the same memory without a copy and keep it alive.",
        &base,
        true,
    )?;
    let host_buffer = make_type(
        py,
        c"cudabuf.cuda.HostBuffer",
        c"Pinned (page-locked, portable, device-mapped) host memory from ``new_host_buffer``\n(pyarrow.cuda's ``HostBuffer``). Copies between it and the device run at the link's full\nspeed; ``Context.buffer_from_object(host_buffer)`` gives a device view of it.\n\nSpeaks the buffer protocol like ``Buffer`` (zero-copy NumPy and pyarrow views).",
        &buffer,
        false,
    )?;
    module.add("Buffer", &buffer)?;
    module.add("HostBuffer", &host_buffer)?;
    let _ = BUFFER_TYPE.set(py, buffer.unbind());
    let _ = HOST_BUFFER_TYPE.set(py, host_buffer.unbind());
    Ok(())
}

/// Allocate a pinned host buffer of `size` bytes through device `device`'s context
/// (pyarrow's ``new_host_buffer``), zero-filled.
///
/// Pinning is slow (about 0.1 s for 256 MiB): reuse host buffers.
///
/// Raises:
///     OutOfMemoryError: when the memory cannot be pinned.
///     InvalidDeviceError: for a device number out of range.
#[pyfunction]
#[pyo3(signature = (size, device = 0))]
pub(crate) fn new_host_buffer(
    py: Python<'_>,
    size: i64,
    device: i64,
) -> PyResult<Bound<'_, PyAny>> {
    let size = non_negative("new_host_buffer", "size", size)?;
    let device = non_negative("new_host_buffer", "device", device)?;
    let backend = crate::backend::current()?;
    let host = py
        .detach(|| backend.new_host_buffer(size, device))
        .or_raise()?;
    HostMemory::from_pinned(host).into_object(py)
}

/// The `HostMemory` behind a host buffer object, if it is one.
pub(crate) fn as_host_memory<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
) -> Option<&'a Bound<'py, HostMemory>> {
    obj.cast::<HostMemory>().ok()
}
