//! Arrow on the device from Python: `serialize_record_batch`, `read_message`,
//! `read_record_batch` and the device-resident `DeviceRecordBatch`, with Arrow data
//! crossing the Python boundary through the Arrow PyCapsule interface (`__arrow_c_array__`,
//! `__arrow_c_stream__`, `__arrow_c_schema__` in; `__arrow_c_device_array__` and
//! `__arrow_c_schema__` out), so pyarrow, polars, nanoarrow and others work without a
//! compile-time dependency on any of them.

use std::ffi::CStr;
use std::sync::Arc;

use arrow::array::{Array, RecordBatch, StructArray};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::ffi::{from_ffi, FFI_ArrowArray, FFI_ArrowSchema};
use arrow::ffi_stream::{FFI_ArrowArrayStream, RecordBatchStreamReader};
use cudabuf::device_arrow::{export_device_record_batch, export_schema, ArrowDeviceArray};
use cudabuf::{DeviceMessage, DeviceRecordBatch, Error};
use pyo3::exceptions::PyNotImplementedError;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyCapsuleMethods, PyDict, PyTuple};

use crate::context::PyContext;
use crate::device_buffer::PyCudaBuffer;
use crate::errors::{guard_malformed, invalid_argument, invalid_type, unsupported, OrRaise};
use crate::host_memory::HostMemory;
use crate::io::PyBufferReader;

const SCHEMA_NAME: &CStr = c"arrow_schema";
const ARRAY_NAME: &CStr = c"arrow_array";
const STREAM_NAME: &CStr = c"arrow_array_stream";
const DEVICE_ARRAY_NAME: &CStr = c"arrow_device_array";

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

fn arrow_error(what: &'static str, e: arrow::error::ArrowError) -> PyErr {
    crate::errors::to_pyerr(Error::invalid_data(what, e.to_string()))
}

/// The pointer of `capsule`, an Arrow PyCapsule named `name` (`operation` names the
/// caller in errors). Anything else (not a capsule, another name, a null pointer) raises
/// a cudabuf error before any pointer is read.
fn capsule_pointer<T>(
    operation: &'static str,
    capsule: &Bound<'_, PyAny>,
    name: &'static CStr,
) -> PyResult<*mut T> {
    let expected = name.to_string_lossy();
    let capsule = capsule.cast::<PyCapsule>().map_err(|_| {
        invalid_type(
            operation,
            format!(
                "expected a PyCapsule named {expected:?}, got {}",
                type_name(capsule)
            ),
        )
    })?;
    if !capsule.is_valid_checked(Some(name)) {
        let actual = capsule
            .name()
            .ok()
            .flatten()
            // SAFETY: a capsule's name, when set, is a NUL-terminated string that lives as
            // long as the capsule, which `capsule` holds.
            .map(|n| unsafe { n.as_cstr() }.to_string_lossy().into_owned());
        return Err(invalid_type(
            operation,
            format!("expected a PyCapsule named {expected:?}, got one named {actual:?}"),
        ));
    }
    Ok(capsule.pointer_checked(Some(name))?.cast::<T>().as_ptr())
}

/// The error for an Arrow C structure whose release callback is already NULL: it was
/// consumed (moved out by an earlier import) or released by its producer.
fn released(operation: &'static str, what: &str, method: &str) -> PyErr {
    invalid_argument(
        operation,
        format!(
            "the {what} capsule was already consumed or released (an Arrow PyCapsule can be imported once; call {method} again for a fresh one)"
        ),
    )
}

/// A schema from any object with `__arrow_c_schema__` (a pyarrow `Schema`, ...).
pub(crate) fn import_schema(
    operation: &'static str,
    schema: &Bound<'_, PyAny>,
) -> PyResult<SchemaRef> {
    if !schema.hasattr("__arrow_c_schema__")? {
        return Err(invalid_type(
            operation,
            format!(
                "expected an Arrow schema (an object with __arrow_c_schema__, e.g. pyarrow.Schema), got {}",
                type_name(schema)
            ),
        ));
    }
    let capsule = schema.call_method0("__arrow_c_schema__")?;
    let pointer = capsule_pointer::<FFI_ArrowSchema>(operation, &capsule, SCHEMA_NAME)?;
    // SAFETY: a valid "arrow_schema" capsule points to an ArrowSchema, which stays owned
    // (and released) by the capsule; we only read it while holding `capsule`.
    let ffi_schema = unsafe { &*pointer };
    if ffi_schema.release().is_none() {
        return Err(released(operation, "arrow_schema", "__arrow_c_schema__"));
    }
    guard_malformed("Arrow schema", || {
        Schema::try_from(ffi_schema)
            .map(Arc::new)
            .map_err(|e| arrow_error("Arrow schema", e))
    })
}

/// A record batch from a struct array exported through the C Data Interface.
fn batch_from_struct(array: FFI_ArrowArray, schema: &FFI_ArrowSchema) -> PyResult<RecordBatch> {
    if schema.format() != "+s" {
        return Err(invalid_argument(
            "serialize_record_batch",
            format!(
                "expected a record batch (a struct array), got an array of Arrow format {:?}",
                schema.format()
            ),
        ));
    }
    let arrow_schema = Schema::try_from(schema).map_err(|e| arrow_error("Arrow schema", e))?;
    // SAFETY: `array` was moved out of a valid "arrow_array" capsule and `schema` describes
    // it (the Arrow PyCapsule protocol pairs them).
    let data = unsafe { from_ffi(array, schema) }.map_err(|e| arrow_error("Arrow array", e))?;
    let array = StructArray::from(data);
    if array.null_count() > 0 {
        return Err(invalid_argument(
            "serialize_record_batch",
            "the struct array has top-level nulls; a record batch cannot",
        ));
    }
    RecordBatch::try_new(Arc::new(arrow_schema), array.columns().to_vec())
        .map_err(|e| arrow_error("record batch", e))
}

/// A record batch from a PyCapsule producer: `__arrow_c_array__` (a `RecordBatch`) or
/// `__arrow_c_stream__` holding exactly one batch (a one-chunk `Table`, a reader).
fn import_batch(batch: &Bound<'_, PyAny>) -> PyResult<RecordBatch> {
    const OPERATION: &str = "serialize_record_batch";
    if batch.hasattr("__arrow_c_array__")? {
        let pair = batch.call_method0("__arrow_c_array__")?;
        let (schema_capsule, array_capsule): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
            pair.extract().map_err(|_| {
                invalid_type(
                    OPERATION,
                    format!(
                        "__arrow_c_array__ of {} returned {}, not a (schema capsule, array capsule) pair",
                        type_name(batch),
                        type_name(&pair)
                    ),
                )
            })?;
        let schema = capsule_pointer::<FFI_ArrowSchema>(OPERATION, &schema_capsule, SCHEMA_NAME)?;
        let array = capsule_pointer::<FFI_ArrowArray>(OPERATION, &array_capsule, ARRAY_NAME)?;
        // SAFETY: both pointers come from capsules of the right names, which we hold;
        // Arrow producers put live (or released, checked next) structures there.
        let (schema, array_released) = unsafe { (&*schema, (*array).is_released()) };
        if schema.release().is_none() {
            return Err(released(OPERATION, "arrow_schema", "__arrow_c_array__"));
        }
        if array_released {
            return Err(released(OPERATION, "arrow_array", "__arrow_c_array__"));
        }
        // SAFETY: a valid "arrow_array" capsule points to a live ArrowArray (its release
        // callback is set); `from_raw` moves it out and marks the capsule's copy released
        // (the capsule then frees only the struct's memory).
        let array = unsafe { FFI_ArrowArray::from_raw(array) };
        return guard_malformed("Arrow array", || batch_from_struct(array, schema));
    }
    if batch.hasattr("__arrow_c_stream__")? {
        let capsule = batch.call_method0("__arrow_c_stream__")?;
        let pointer = capsule_pointer::<FFI_ArrowArrayStream>(OPERATION, &capsule, STREAM_NAME)?;
        // SAFETY: a valid "arrow_array_stream" capsule points to a stream structure.
        if unsafe { (*pointer).release() }.is_none() {
            return Err(released(
                OPERATION,
                "arrow_array_stream",
                "__arrow_c_stream__",
            ));
        }
        // SAFETY: a live stream (release set); `from_raw` moves it out and marks the
        // capsule's copy released.
        let stream = unsafe { FFI_ArrowArrayStream::from_raw(pointer) };
        let batches = guard_malformed("Arrow stream", || {
            let reader = RecordBatchStreamReader::try_new(stream)
                .map_err(|e| arrow_error("Arrow stream", e))?;
            reader
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| arrow_error("Arrow stream", e))
        })?;
        return match <[RecordBatch; 1]>::try_from(batches) {
            Ok([batch]) => Ok(batch),
            Err(batches) => Err(invalid_argument(
                OPERATION,
                format!(
                    "the stream holds {} record batches, one message holds exactly one (combine the chunks first, e.g. table.combine_chunks().to_batches()[0])",
                    batches.len()
                ),
            )),
        };
    }
    Err(invalid_type(
        OPERATION,
        format!(
            "expected a record batch (an object with __arrow_c_array__ or __arrow_c_stream__, e.g. pyarrow.RecordBatch), got {}",
            type_name(batch)
        ),
    ))
}

/// Write a record batch as one Arrow IPC message into a new device buffer of ``ctx``
/// (pyarrow.cuda's ``serialize_record_batch``). ``batch`` is a pyarrow ``RecordBatch``
/// or any Arrow PyCapsule producer (``__arrow_c_array__``, or ``__arrow_c_stream__`` with
/// exactly one batch). The bytes are those of Arrow's own IPC encoding on the host
/// (``batch.serialize()``).
///
/// Fixed pyarrow quirk: a dictionary-encoded column raises ``UnsupportedError`` (one
/// message cannot carry its dictionary; pyarrow silently drops it).
///
/// The message is arrow-rs's encoding (buffers 64-byte aligned); pyarrow reads it, but
/// its bytes differ from pyarrow's own ``batch.serialize()`` (8-byte aligned).
///
/// Raises:
///     TypeError: ``batch`` is not an Arrow producer.
#[pyfunction]
pub(crate) fn serialize_record_batch(
    py: Python<'_>,
    batch: &Bound<'_, PyAny>,
    ctx: PyRef<'_, PyContext>,
) -> PyResult<PyCudaBuffer> {
    let batch = import_batch(batch)?;
    let ctx = ctx.inner.clone();
    let buffer = py
        .detach(|| cudabuf::serialize_record_batch(&batch, &ctx))
        .or_raise()?;
    Ok(PyCudaBuffer::new(buffer))
}

/// One Arrow IPC message read from device memory (pyarrow.cuda's ``read_message``
/// result): the metadata on the host, the body left on the device.
#[pyclass(module = "cudabuf.cuda", name = "Message", frozen)]
pub(crate) struct PyMessage {
    inner: DeviceMessage,
}

#[pymethods]
impl PyMessage {
    /// The kind of message, as pyarrow names it: ``"schema"``, ``"dictionary batch"``,
    /// ``"record batch"``, ...
    #[getter]
    fn r#type(&self) -> String {
        use arrow::ipc::MessageHeader;
        match self.inner.header_type() {
            MessageHeader::Schema => "schema".into(),
            MessageHeader::DictionaryBatch => "dictionary batch".into(),
            MessageHeader::RecordBatch => "record batch".into(),
            MessageHeader::Tensor => "tensor".into(),
            MessageHeader::SparseTensor => "sparse tensor".into(),
            other => format!("{other:?}"),
        }
    }

    /// The metadata version, e.g. ``"V5"``.
    #[getter]
    fn metadata_version(&self) -> String {
        format!("{:?}", self.inner.version())
    }

    /// The flatbuffer metadata (on the host) as a ``Buffer``.
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        HostMemory::from_vec(self.inner.metadata().to_vec()).into_object(py)
    }

    /// The body: a zero-copy ``CudaBuffer`` slice of the source.
    #[getter]
    fn body(&self) -> PyCudaBuffer {
        PyCudaBuffer::new(self.inner.body().clone())
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.cuda.Message type={:?} metadata_version={} body_size={}>",
            self.r#type(),
            self.metadata_version(),
            self.inner.body().size()
        )
    }
}

/// Read one Arrow IPC message from a ``CudaBuffer`` (at its start) or a
/// ``BufferReader`` (at its position, which moves past the message): metadata to the
/// host, body left on the device. ``pool`` is accepted for pyarrow compatibility and not
/// used.
///
/// Fixed pyarrow quirk: reading from a ``BufferReader`` works (it fails in pyarrow).
///
/// Raises:
///     InvalidDataError: for a truncated or corrupt message.
#[pyfunction]
#[pyo3(signature = (source, pool = None))]
pub(crate) fn read_message(
    py: Python<'_>,
    source: &Bound<'_, PyAny>,
    pool: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMessage> {
    let _ = pool;
    if let Ok(buffer) = source.cast::<PyCudaBuffer>() {
        let buffer = buffer.get().inner.clone();
        let message = guard_malformed("Arrow IPC message", || {
            py.detach(|| cudabuf::read_message(&buffer)).or_raise()
        })?;
        return Ok(PyMessage { inner: message });
    }
    if let Ok(reader) = source.cast::<PyBufferReader>() {
        let message = reader.get().with(py, "read_message", |inner| {
            guard_malformed("Arrow IPC message", || {
                py.detach(|| cudabuf::read_message(inner)).or_raise()
            })
        })?;
        return Ok(PyMessage { inner: message });
    }
    Err(invalid_type(
        "read_message",
        format!(
            "expected a CudaBuffer or a BufferReader, got {}",
            type_name(source)
        ),
    ))
}

/// A record batch whose column buffers stay in device memory (the result of
/// ``read_record_batch``; pyarrow.cuda returns a ``pyarrow.RecordBatch`` with device
/// pointers, which pip's pyarrow cannot make).
///
/// Exports ``__arrow_c_device_array__`` (the Arrow C Device Data Interface: device type
/// 2, CUDA, on the CUDA backend; 12, an extension device no GPU library imports, on the
/// simulator) and ``__arrow_c_schema__``; ``to_host()`` copies it to a
/// ``pyarrow.RecordBatch``.
#[pyclass(module = "cudabuf.cuda", name = "DeviceRecordBatch", frozen)]
pub(crate) struct PyDeviceRecordBatch {
    pub(crate) inner: DeviceRecordBatch,
    schema: Py<PyAny>,
}

/// Exports a host record batch through `__arrow_c_array__` (for `pyarrow.record_batch`).
#[pyclass(module = "cudabuf.cuda", name = "_HostRecordBatch", frozen)]
struct HostRecordBatch {
    batch: RecordBatch,
}

#[pymethods]
impl HostRecordBatch {
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        let array = StructArray::from(self.batch.clone());
        let ffi_array = FFI_ArrowArray::new(&array.to_data());
        let ffi_schema = FFI_ArrowSchema::try_from(self.batch.schema().as_ref())
            .map_err(|e| arrow_error("Arrow schema", e))?;
        let schema = PyCapsule::new_with_value(py, ffi_schema, SCHEMA_NAME)?;
        let array = PyCapsule::new_with_value(py, ffi_array, ARRAY_NAME)?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }

    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi_schema = FFI_ArrowSchema::try_from(self.batch.schema().as_ref())
            .map_err(|e| arrow_error("Arrow schema", e))?;
        PyCapsule::new_with_value(py, ffi_schema, SCHEMA_NAME)
    }
}

#[pymethods]
impl PyDeviceRecordBatch {
    /// The schema, as passed to ``read_record_batch``.
    #[getter]
    fn schema(&self, py: Python<'_>) -> Py<PyAny> {
        self.schema.clone_ref(py)
    }

    /// The number of rows.
    #[getter]
    fn num_rows(&self) -> usize {
        self.inner.num_rows()
    }

    /// The number of columns.
    #[getter]
    fn num_columns(&self) -> usize {
        self.inner.num_columns()
    }

    fn __len__(&self) -> usize {
        self.inner.num_rows()
    }

    /// The device buffer of the message body, which holds every column's buffers.
    #[getter]
    fn body(&self) -> Option<PyCudaBuffer> {
        self.inner.body().map(|b| PyCudaBuffer::new(b.clone()))
    }

    /// The context whose device holds the data.
    #[getter]
    fn context(&self) -> PyContext {
        PyContext::new(self.inner.context().clone())
    }

    /// The device buffers of column ``i`` (validity, offsets, values, ... as the Arrow
    /// layout of its type orders them; ``None`` where a validity bitmap is absent),
    /// zero-copy slices of the body.
    fn column_buffers(&self, i: usize) -> PyResult<Vec<Option<PyCudaBuffer>>> {
        let column = self.inner.column(i).or_raise()?;
        let mut out = vec![column.nulls().map(|b| PyCudaBuffer::new(b.clone()))];
        out.extend(
            column
                .buffers()
                .iter()
                .map(|b| Some(PyCudaBuffer::new(b.clone()))),
        );
        Ok(out)
    }

    /// Copy the batch to the host as a ``pyarrow.RecordBatch`` equal to the one that was
    /// serialized (one device-to-host copy; needs pyarrow >= 14).
    fn to_host<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = &self.inner;
        let batch = py.detach(|| inner.to_host()).or_raise()?;
        let exporter = Bound::new(py, HostRecordBatch { batch })?;
        py.import("pyarrow")?
            .getattr("record_batch")?
            .call1((exporter,))
    }

    /// The Arrow PyCapsule device protocol: ``(schema capsule, device array capsule)``,
    /// zero-copy; the exported array keeps the device memory alive until released.
    /// ``requested_schema`` is ignored (the batch is exported as it is); other keywords
    /// must be ``None``.
    #[pyo3(signature = (requested_schema = None, **kwargs))]
    fn __arrow_c_device_array__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<&Bound<'py, PyAny>>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let _ = requested_schema;
        if let Some(kwargs) = kwargs {
            for (key, value) in kwargs.iter() {
                if !value.is_none() {
                    return Err(PyNotImplementedError::new_err(format!(
                        "__arrow_c_device_array__: keyword {key} is not supported"
                    )));
                }
            }
        }
        let schema = export_schema(self.inner.schema()).or_raise()?;
        let array: ArrowDeviceArray = export_device_record_batch(&self.inner).or_raise()?;
        let schema = PyCapsule::new_with_value(py, schema, SCHEMA_NAME)?;
        let array = PyCapsule::new_with_value(py, array, DEVICE_ARRAY_NAME)?;
        PyTuple::new(py, [schema.into_any(), array.into_any()])
    }

    /// The schema as an Arrow PyCapsule (``"arrow_schema"``).
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let schema = export_schema(self.inner.schema()).or_raise()?;
        PyCapsule::new_with_value(py, schema, SCHEMA_NAME)
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.cuda.DeviceRecordBatch num_rows={} num_columns={} device={} backend={}>",
            self.inner.num_rows(),
            self.inner.num_columns(),
            self.inner.context().device_number(),
            self.inner.context().backend_kind()
        )
    }
}

/// Read the record batch message that fills ``buffer`` (a ``CudaBuffer``, or a
/// ``Message`` from ``read_message``) with ``schema`` (a pyarrow ``Schema`` or any
/// ``__arrow_c_schema__`` object): the metadata is copied to the host, the body stays on
/// the device, and every column buffer is a zero-copy slice of it. Returns a
/// ``DeviceRecordBatch``.
///
/// ``dictionary_memo`` (dictionary-encoded columns) is not supported; ``pool`` is
/// accepted for pyarrow compatibility and not used.
///
/// Fixed pyarrow quirk: bytes after the message in ``buffer`` raise (a corrupt length
/// would otherwise frame the body a few bytes off).
///
/// Raises:
///     InvalidDataError: a truncated or corrupt message, or one that does not match
///         ``schema``.
///     UnsupportedError: compressed bodies, ``dictionary_memo``.
#[pyfunction]
#[pyo3(signature = (buffer, schema, *, dictionary_memo = None, pool = None))]
pub(crate) fn read_record_batch(
    py: Python<'_>,
    buffer: &Bound<'_, PyAny>,
    schema: &Bound<'_, PyAny>,
    dictionary_memo: Option<&Bound<'_, PyAny>>,
    pool: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyDeviceRecordBatch> {
    let _ = pool;
    if dictionary_memo.is_some() {
        return Err(unsupported(
            "read_record_batch",
            "dictionary_memo: dictionary-encoded data is read as a stream on the device (the Rust DeviceStreamReader), not through a memo",
        ));
    }
    let arrow_schema = import_schema("read_record_batch", schema)?;
    let batch = if let Ok(buffer) = buffer.cast::<PyCudaBuffer>() {
        let buffer = buffer.get().inner.clone();
        guard_malformed("Arrow IPC message", || {
            py.detach(|| cudabuf::read_record_batch(&buffer, &arrow_schema))
                .or_raise()
        })?
    } else if let Ok(message) = buffer.cast::<PyMessage>() {
        let message = &message.get().inner;
        guard_malformed("Arrow IPC message", || {
            py.detach(|| DeviceRecordBatch::from_message(message, &arrow_schema))
                .or_raise()
        })?
    } else {
        return Err(invalid_type(
            "read_record_batch",
            format!(
                "expected a CudaBuffer or a Message, got {}",
                type_name(buffer)
            ),
        ));
    };
    Ok(PyDeviceRecordBatch {
        inner: batch,
        schema: schema.clone().unbind(),
    })
}

/// Exports a schema through `__arrow_c_schema__` (for `pyarrow.schema`).
#[pyclass(module = "cudabuf.cuda", name = "_HostSchema", frozen)]
struct HostSchema {
    schema: SchemaRef,
}

#[pymethods]
impl HostSchema {
    fn __arrow_c_schema__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let ffi_schema = FFI_ArrowSchema::try_from(self.schema.as_ref())
            .map_err(|e| arrow_error("Arrow schema", e))?;
        PyCapsule::new_with_value(py, ffi_schema, SCHEMA_NAME)
    }
}

/// `schema` as a `pyarrow.Schema` when pyarrow is importable, else as an object with
/// `__arrow_c_schema__`.
pub(crate) fn python_schema(py: Python<'_>, schema: &SchemaRef) -> PyResult<Py<PyAny>> {
    let exporter = Bound::new(
        py,
        HostSchema {
            schema: schema.clone(),
        },
    )?
    .into_any();
    match py.import("pyarrow") {
        Ok(pyarrow) => Ok(pyarrow.getattr("schema")?.call1((exporter,))?.unbind()),
        Err(_) => Ok(exporter.unbind()),
    }
}

/// Device batches as Python objects sharing one schema object.
pub(crate) fn device_batches(
    py: Python<'_>,
    schema: &SchemaRef,
    batches: Vec<DeviceRecordBatch>,
) -> PyResult<Vec<PyDeviceRecordBatch>> {
    let schema = python_schema(py, schema)?;
    Ok(batches
        .into_iter()
        .map(|inner| PyDeviceRecordBatch {
            inner,
            schema: schema.clone_ref(py),
        })
        .collect())
}

/// Run `read` (which opens a reader and collects its batches) without the GIL, behind
/// the malformed-input guard, and wrap what it landed.
fn land_batches(
    py: Python<'_>,
    what: &'static str,
    read: impl FnOnce() -> cudabuf::Result<(SchemaRef, Vec<DeviceRecordBatch>)> + Send,
) -> PyResult<Vec<PyDeviceRecordBatch>> {
    let (schema, batches) = guard_malformed(what, || py.detach(read).or_raise())?;
    device_batches(py, &schema, batches)
}

/// Column names (`str`) or indices (`int`), not mixed.
enum Columns {
    Names(Vec<String>),
    Indices(Vec<usize>),
}

fn columns_arg(
    operation: &'static str,
    columns: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<Columns>> {
    let Some(columns) = columns.filter(|c| !c.is_none()) else {
        return Ok(None);
    };
    if columns.is_instance_of::<pyo3::types::PyString>() {
        return Err(invalid_type(
            operation,
            "columns: expected a list of column names or indices, got one str",
        ));
    }
    if let Ok(names) = columns.extract::<Vec<String>>() {
        return Ok(Some(Columns::Names(names)));
    }
    if let Ok(indices) = columns.extract::<Vec<i64>>() {
        let indices = indices
            .into_iter()
            .map(|i| {
                usize::try_from(i).map_err(|_| {
                    invalid_argument(operation, format!("columns: index {i} is negative"))
                })
            })
            .collect::<PyResult<_>>()?;
        return Ok(Some(Columns::Indices(indices)));
    }
    Err(invalid_type(
        operation,
        format!(
            "columns: expected a list of column names (str) or indices (int), got {}",
            type_name(columns)
        ),
    ))
}

/// Read an Arrow IPC *file* (Feather v2; uncompressed, LZ4_FRAME or ZSTD bodies) into
/// device record batches, one per record batch of the file. ``columns``: names or
/// indices of the columns to read (only their buffers are read from disk and land on
/// the device); ``None`` for all. Compressed bodies are decompressed on the host, by up to
/// the context's file threads (``Context.file_options()["threads"]``) at once, into pinned
/// memory, then uploaded. Releases the GIL while reading.
///
/// Raises:
///     FileError: the file cannot be opened or read, or is not a regular file.
///     InvalidDataError: a truncated or corrupt file (footer, blocks, messages,
///         compressed lengths).
///     InvalidArgumentError: a column name the file does not have.
///     OutOfRangeError: a column index past the last column.
#[pyfunction]
#[pyo3(signature = (path, ctx, columns = None))]
pub(crate) fn read_ipc_file(
    py: Python<'_>,
    path: std::path::PathBuf,
    ctx: &PyContext,
    columns: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<PyDeviceRecordBatch>> {
    let columns = columns_arg("read_ipc_file", columns)?;
    let ctx = ctx.inner.clone();
    land_batches(py, "Arrow IPC file", || {
        let reader = cudabuf::device_arrow::DeviceFileReader::open(&path, &ctx)?;
        let reader = match &columns {
            None => reader,
            Some(Columns::Names(names)) => {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                reader.with_columns(&names)?
            }
            Some(Columns::Indices(indices)) => reader.with_projection(indices)?,
        };
        let batches = reader.read_all()?;
        Ok((reader.schema().clone(), batches))
    })
}

/// Read an Arrow IPC *stream* file (what ``pyarrow.ipc.new_stream`` writes) into device
/// record batches (dictionaries included). Releases the GIL while reading.
///
/// Raises:
///     FileError: the file cannot be opened or read, or is not a regular file.
///     InvalidDataError: a truncated or corrupt stream.
#[pyfunction]
pub(crate) fn read_ipc_stream_file(
    py: Python<'_>,
    path: std::path::PathBuf,
    ctx: &PyContext,
) -> PyResult<Vec<PyDeviceRecordBatch>> {
    let ctx = ctx.inner.clone();
    land_batches(py, "Arrow IPC stream file", || {
        let reader = cudabuf::device_arrow::DeviceStreamReader::from_path(&path, &ctx)?;
        Ok((
            reader.schema().clone(),
            reader.collect::<cudabuf::Result<_>>()?,
        ))
    })
}

/// Read a Parquet file into device record batches, one per row group: decoded on the
/// host (arrow-rs's ``parquet`` reader), up to the context's file threads
/// (``Context.file_options()["threads"]``) row groups at once, while earlier row groups
/// upload.
/// ``columns``: names of the columns to read; ``None`` for all. Releases the GIL while
/// reading.
///
/// ``decompression_limit``: the most bytes of host memory the decompressed pages held at
/// once may take, counted from the page headers before anything is decompressed (per
/// column chunk decoded, its dictionary page and its largest data page, summed over the
/// row groups decoding at once); ``None`` for the default, 1 GiB. A file that needs more
/// is ``InvalidDataError``; raise it for trusted files of large pages. It bounds the
/// decompressed pages, not the decoded batches (a dictionary-encoded string column may
/// decode to far more).
///
/// Raises:
///     FileError: the file cannot be opened or read, or is not a regular file.
///     InvalidDataError: a truncated or corrupt file, or pages past
///         ``decompression_limit``.
///     InvalidArgumentError: a column name the file does not have.
///     OverflowError: a negative ``decompression_limit``, or one past the address space.
#[pyfunction]
#[pyo3(signature = (path, ctx, columns = None, *, decompression_limit = None))]
pub(crate) fn read_parquet(
    py: Python<'_>,
    path: std::path::PathBuf,
    ctx: &PyContext,
    columns: Option<Vec<String>>,
    decompression_limit: Option<usize>,
) -> PyResult<Vec<PyDeviceRecordBatch>> {
    let ctx = ctx.inner.clone();
    land_batches(py, "Parquet file", || {
        let names: Option<Vec<&str>> = columns
            .as_ref()
            .map(|c| c.iter().map(String::as_str).collect());
        let mut reader =
            cudabuf::device_arrow::DeviceParquetReader::open(&path, &ctx, names.as_deref())?;
        if let Some(limit) = decompression_limit {
            reader.set_decompression_limit(limit);
        }
        Ok((
            reader.schema().clone(),
            reader.collect::<cudabuf::Result<_>>()?,
        ))
    })
}

/// Write device record batches to an Arrow IPC file at ``path`` (created or truncated),
/// readable by ``pyarrow.ipc.open_file`` and ``pyarrow.feather.read_table``. ``schema``
/// (a pyarrow ``Schema`` or any ``__arrow_c_schema__`` object) is the file's; left out, it
/// is the first batch's. Every batch must have its fields. Releases the GIL while
/// writing.
///
/// Raises:
///     FileError: the file cannot be created or written.
///     InvalidArgumentError: no batches and no schema, or a batch of another schema.
#[pyfunction]
#[pyo3(signature = (path, batches, schema = None))]
pub(crate) fn write_ipc_file(
    py: Python<'_>,
    path: std::path::PathBuf,
    batches: Vec<Py<PyDeviceRecordBatch>>,
    schema: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let batches: Vec<&PyDeviceRecordBatch> = batches.iter().map(|b| b.get()).collect();
    let schema: SchemaRef = match (schema, batches.first()) {
        (Some(schema), _) => import_schema("write_ipc_file", schema)?,
        (None, Some(first)) => first.inner.schema().clone(),
        (None, None) => {
            return Err(invalid_argument(
                "write_ipc_file",
                "no batches and no schema: pass schema= to write a file without batches",
            ))
        }
    };
    let inner: Vec<DeviceRecordBatch> = batches.iter().map(|b| b.inner.clone()).collect();
    py.detach(|| cudabuf::device_arrow::write_ipc_file(&path, &schema, &inner))
        .or_raise()
}
