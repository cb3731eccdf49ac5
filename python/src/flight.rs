//! `cudabuf.flight`'s native part: Arrow Flight into device memory over the Rust crate
//! `cudabuf-flight`, a client (`DoGet` into device batches, `DoPut` and `DoExchange`
//! from device batches, `GetFlightInfo`, `ListFlights`) and a server of device batches
//! (`DoGet`, `DoPut` into device memory, `DoExchange` echoing, flight info), both running on tokio runtimes inside the extension.
//!
//! # Rules
//! - Every network call runs as a task on a runtime; the calling Python thread waits for
//!   its answer with the GIL released, in slices of [`POLL`], checking for signals
//!   between them: Ctrl-C (`KeyboardInterrupt`) cancels the call (the task is aborted),
//!   and an optional `timeout` bounds it (`FlightTimedOutError`).
//! - Clients share one runtime per process ([`client_runtime`]); each server has a runtime
//!   of its own, so that `shutdown()` can end its connections (tonic spawns a task per
//!   connection, which outlives the serving task: dropping the runtime cancels them).
//! - Errors: a gRPC status (the peer's answer, a broken stream, a failed connection) is a
//!   `cudabuf.FlightError` carrying the status code; the peer's bad bytes are
//!   `InvalidDataError`; device failures are the cudabuf error of their kind.
//! - A runtime made before `fork()` has no threads in the child: an object made in the
//!   parent raises there instead of waiting forever, and is forgotten, not dropped.
//!
//! The Python classes of `cudabuf/flight.py` subclass the two classes here and add the
//! typed results (descriptors, flight infos, batch lists with their schema).

use std::future::Future;
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cudabuf::arrow::datatypes::{Schema, SchemaRef};
use cudabuf::{DeviceRecordBatch, Error};
use cudabuf_flight::arrow_flight::flight_descriptor::DescriptorType;
use cudabuf_flight::arrow_flight::flight_service_client::FlightServiceClient;
use cudabuf_flight::arrow_flight::{Criteria, FlightDescriptor, FlightInfo};
use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient, FlightError};
use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tokio::runtime::Runtime;
use tonic::transport::{Channel, Endpoint};

use crate::arrow::{device_batches, import_schema, python_schema, PyDeviceRecordBatch};
use crate::context::PyContext;
use crate::errors::{flight_status, guard_malformed, invalid_argument, to_pyerr, unsupported};

/// How long a waiting Python thread sleeps (GIL released) between two checks for signals.
const POLL: Duration = Duration::from_millis(50);

/// What gRPC may add around one message: the client's tonic limit is the decoder's plus
/// this (as `cudabuf-flight` sets it for `DoGet`).
const GRPC_HEADROOM: usize = 64 << 10;

/// `cudabuf-flight`'s default message limit, as the constructors' default argument (their
/// text signatures spell it out: 64 MiB).
const DEFAULT_LIMIT: i64 = cudabuf_flight::DEFAULT_MAX_MESSAGE_SIZE as i64;
const _: () = assert!(DEFAULT_LIMIT == 67_108_864, "update the text signatures");

/// gRPC's `UNAVAILABLE`: the code of a failed connection or a server that cannot listen.
const UNAVAILABLE: tonic::Code = tonic::Code::Unavailable;

/// A multi-thread tokio runtime of two workers named `name`.
fn build_runtime(name: &'static str) -> PyResult<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .map_err(|e| {
            flight_status(
                tonic::Code::Internal,
                format!("cannot start the Flight runtime ({name}): {e}"),
            )
        })
}

/// The runtime every client of this process shares, and the process that made it.
static CLIENT_RUNTIME: Mutex<Option<(u32, Arc<Runtime>)>> = Mutex::new(None);

/// The clients' runtime, made on first use (again in a forked child, whose copy of the
/// parent's has no threads: that copy is forgotten, never dropped, as dropping it would
/// wait for threads that do not exist here).
fn client_runtime() -> PyResult<Arc<Runtime>> {
    let mut slot = CLIENT_RUNTIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    match slot.take() {
        Some((owner, runtime)) if owner == pid => {
            *slot = Some((owner, runtime.clone()));
            Ok(runtime)
        }
        stale => {
            if let Some((_, runtime)) = stale {
                std::mem::forget(runtime);
            }
            let runtime = Arc::new(build_runtime("cudabuf-flight")?);
            *slot = Some((pid, runtime.clone()));
            Ok(runtime)
        }
    }
}

/// The error for an object made before `fork()` and used in the child.
fn forked(what: &'static str) -> PyErr {
    unsupported(
        what,
        "this object was made in the parent process before fork(): its network threads do not exist in this child; make a new one here",
    )
}

/// A gRPC transport error with its causes (tonic's own text is only "transport error").
fn transport_message(error: &tonic::transport::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// A `cudabuf-flight` error as its Python exception.
fn flight_error(error: FlightError) -> PyErr {
    match error {
        FlightError::Device(e) => to_pyerr(e),
        FlightError::InvalidData(reason) => to_pyerr(Error::invalid_data("Flight data", reason)),
        FlightError::Unsupported(reason) => to_pyerr(Error::unsupported("Flight", reason)),
        FlightError::Transport(e) => flight_status(
            UNAVAILABLE,
            format!("Flight connection failed: {}", transport_message(&e)),
        ),
        FlightError::Status(status) => flight_status(
            status.code(),
            format!(
                "Flight call failed: {}: {}",
                status.code().description(),
                status.message()
            ),
        ),
        // TooLarge and what later versions add: the status a server would answer with.
        other => flight_status(other.to_status().code(), other.to_string()),
    }
}

/// Run `call` on `runtime` and wait for its answer with the GIL released, checking for
/// signals every [`POLL`]: a signal handler's exception (`KeyboardInterrupt`) aborts the
/// call and is raised; past `timeout` the call is dropped and `FlightTimedOutError`
/// raised.
/// Every batch of an answer, landed, with the answer's schema.
async fn landed(
    mut stream: cudabuf_flight::DeviceBatchStream,
) -> Result<(SchemaRef, Vec<DeviceRecordBatch>), FlightError> {
    let mut batches = Vec::new();
    while let Some(batch) = stream.next().await {
        batches.push(batch?);
    }
    Ok((stream.schema().clone(), batches))
}

fn wait<T, F>(
    py: Python<'_>,
    runtime: &Runtime,
    what: &'static str,
    timeout: Option<Duration>,
    call: F,
) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, FlightError>> + Send + 'static,
{
    let (answer, answered) = sync_channel(1);
    let task = runtime.spawn(async move {
        let result = match timeout {
            None => call.await,
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(result) => result,
                Err(_) => Err(FlightError::from(tonic::Status::deadline_exceeded(
                    format!("{what}: no answer within {:.3} s", limit.as_secs_f64()),
                ))),
            },
        };
        // The caller may be gone (interrupted): nobody to tell.
        let _ = answer.send(result);
    });
    let mut answered = answered;
    loop {
        // (The receiver is Send, not Sync: it goes into the closure and comes back.)
        let (received, receiver) = py.detach(move || (answered.recv_timeout(POLL), answered));
        answered = receiver;
        match received {
            Ok(result) => return result.map_err(flight_error),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(flight_status(
                    tonic::Code::Internal,
                    format!("{what}: the call ended without an answer (a panic inside cudabuf; please report it)"),
                ))
            }
        }
    }
}

/// A `timeout` argument in seconds: `None`, or a positive finite number.
fn timeout_arg(operation: &'static str, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(seconds) if seconds.is_finite() && seconds > 0.0 => {
            Duration::try_from_secs_f64(seconds)
                .map(Some)
                .map_err(|e| invalid_argument(operation, format!("timeout {seconds}: {e}")))
        }
        Some(seconds) => Err(invalid_argument(
            operation,
            format!("timeout must be a positive number of seconds or None, got {seconds}"),
        )),
    }
}

/// A bearer token: printable ASCII (what an HTTP header value can carry), not empty.
fn token_arg(operation: &'static str, token: Option<String>) -> PyResult<Option<String>> {
    match token {
        Some(t) if t.is_empty() || !t.bytes().all(|b| (0x20..0x7f).contains(&b)) => {
            Err(invalid_argument(
                operation,
                "token must be a non-empty string of printable ASCII characters (it travels in an HTTP header)",
            ))
        }
        other => Ok(other),
    }
}

/// A message limit: at least one byte.
fn limit_arg(operation: &'static str, max_message_size: i64) -> PyResult<usize> {
    usize::try_from(max_message_size)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            invalid_argument(
                operation,
                format!(
                    "max_message_size must be a positive number of bytes, got {max_message_size}"
                ),
            )
        })
}

/// The `http://` URL tonic wants for a Flight location: `grpc://host:port` or
/// `grpc+tcp://host:port` (pyarrow.flight's spellings of plain gRPC).
fn url_of(location: &str) -> PyResult<String> {
    const OPERATION: &str = "FlightClient";
    let Some((scheme, rest)) = location.split_once("://") else {
        return Err(invalid_argument(
            OPERATION,
            format!("location {location:?} is not a URI: expected grpc://host:port"),
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "grpc" | "grpc+tcp" => {}
        "grpc+tls" => {
            return Err(unsupported(
                OPERATION,
                format!("location {location:?}: TLS is not supported yet (grpc:// and grpc+tcp:// are)"),
            ))
        }
        "grpc+unix" => {
            return Err(unsupported(
                OPERATION,
                format!("location {location:?}: Unix sockets are not supported (grpc:// and grpc+tcp:// are)"),
            ))
        }
        _ => {
            return Err(invalid_argument(
                OPERATION,
                format!("location {location:?}: unknown scheme {scheme:?} (expected grpc:// or grpc+tcp://)"),
            ))
        }
    }
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(invalid_argument(
            OPERATION,
            format!(
                "location {location:?}: expected grpc://host:port, with nothing after the port"
            ),
        ));
    }
    Ok(format!("http://{authority}"))
}

/// `authorization: Bearer <token>` on a request (the token was checked by [`token_arg`]).
fn with_bearer<T>(message: T, token: Option<&str>) -> Result<tonic::Request<T>, FlightError> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().map_err(|_| {
            FlightError::from(tonic::Status::invalid_argument(
                "the token is not a valid header value",
            ))
        })?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

/// What a client holds: `cudabuf-flight`'s client (`DoGet`, `GetFlightInfo`) and
/// arrow-flight's generated one over the same channel (`ListFlights`, which the former
/// does not offer). Cloning shares the connection: each call works on its own clone, so
/// threads call at once.
#[derive(Clone)]
struct Clients {
    device: FlightDeviceClient,
    raw: FlightServiceClient<Channel>,
    token: Option<String>,
}

/// The native part of ``cudabuf.flight.FlightClient`` (which see).
#[pyclass(module = "cudabuf._native", name = "_FlightClient", frozen, subclass)]
pub(crate) struct PyFlightClient {
    location: String,
    max_message_size: usize,
    clients: Mutex<Option<Clients>>,
    runtime: Arc<Runtime>,
    pid: u32,
}

impl PyFlightClient {
    fn lock(&self) -> MutexGuard<'_, Option<Clients>> {
        // Only ever replaced whole: a poisoned lock is still consistent.
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A clone of the clients, for one call.
    fn clients(&self, operation: &'static str) -> PyResult<Clients> {
        if std::process::id() != self.pid {
            return Err(forked("FlightClient"));
        }
        // The lock is released before the error is made (no Python work under a lock).
        let clients = self.lock().clone();
        clients.ok_or_else(|| {
            log::debug!("{operation} on a closed FlightClient");
            to_pyerr(Error::Closed {
                what: "FlightClient",
            })
        })
    }
}

impl Drop for PyFlightClient {
    fn drop(&mut self) {
        if std::process::id() != self.pid {
            // A forked child's copy: the runtime behind the channels has no threads here.
            let clients = self.lock().take();
            std::mem::forget(clients);
            std::mem::forget(self.runtime.clone());
        }
    }
}

#[pymethods]
impl PyFlightClient {
    #[new]
    #[pyo3(
        signature = (location, *, token = None, max_message_size = DEFAULT_LIMIT, connect_timeout = Some(10.0)),
        text_signature = "(location, *, token=None, max_message_size=67108864, connect_timeout=10.0)"
    )]
    fn py_new(
        py: Python<'_>,
        location: String,
        token: Option<String>,
        max_message_size: i64,
        connect_timeout: Option<f64>,
    ) -> PyResult<Self> {
        const OPERATION: &str = "FlightClient";
        let url = url_of(&location)?;
        let token = token_arg(OPERATION, token)?;
        let max_message_size = limit_arg(OPERATION, max_message_size)?;
        let connect_timeout = timeout_arg(OPERATION, connect_timeout)?;
        let endpoint = Endpoint::from_shared(url).map_err(|e| {
            invalid_argument(
                OPERATION,
                format!(
                    "location {location:?} is not a valid URI: {}",
                    transport_message(&e)
                ),
            )
        })?;
        let endpoint = match connect_timeout {
            Some(limit) => endpoint.connect_timeout(limit),
            None => endpoint,
        };
        let runtime = client_runtime()?;
        let channel = wait(py, &runtime, "connect", None, async move {
            Ok(endpoint.connect().await?)
        })?;
        let device = FlightDeviceClient::new(channel.clone(), token.as_deref())
            .with_max_message_size(max_message_size);
        let raw = FlightServiceClient::new(channel)
            .max_decoding_message_size(max_message_size.saturating_add(GRPC_HEADROOM))
            .max_encoding_message_size(usize::MAX);
        Ok(PyFlightClient {
            location,
            max_message_size,
            clients: Mutex::new(Some(Clients { device, raw, token })),
            runtime,
            pid: std::process::id(),
        })
    }

    /// The location this client connected to, as given.
    #[getter]
    fn location(&self) -> &str {
        &self.location
    }

    /// The limit on one incoming message (header and body), in bytes.
    #[getter]
    fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// Close the connection (calls running in other threads finish first). Idempotent.
    fn close(&self) {
        let clients = self.lock().take();
        if std::process::id() != self.pid {
            std::mem::forget(clients);
        }
    }

    /// ``DoGet`` of ``ticket`` into the device of ``ctx``: ``(schema, [DeviceRecordBatch])``.
    #[pyo3(signature = (ticket, ctx, timeout = None))]
    fn _do_get(
        &self,
        py: Python<'_>,
        ticket: Vec<u8>,
        ctx: &PyContext,
        timeout: Option<f64>,
    ) -> PyResult<(Py<PyAny>, Vec<PyDeviceRecordBatch>)> {
        let timeout = timeout_arg("do_get", timeout)?;
        let mut clients = self.clients("do_get")?;
        let ctx = ctx.inner.clone();
        let (schema, batches) = wait(py, &self.runtime, "do_get", timeout, async move {
            landed(clients.device.do_get(ticket, &ctx).await?).await
        })?;
        let schema_object = python_schema(py, &schema)?;
        Ok((schema_object, device_batches(py, &schema, batches)?))
    }

    /// ``GetFlightInfo`` for a path or a command: the info as a tuple (see
    /// ``cudabuf/flight.py``).
    #[pyo3(signature = (path, command, timeout = None))]
    fn _get_flight_info<'py>(
        &self,
        py: Python<'py>,
        path: Option<Vec<String>>,
        command: Option<Vec<u8>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        let descriptor = descriptor_arg("get_flight_info", path, command)?;
        let timeout = timeout_arg("get_flight_info", timeout)?;
        let mut clients = self.clients("get_flight_info")?;
        let info = wait(py, &self.runtime, "get_flight_info", timeout, async move {
            clients.device.get_flight_info(descriptor).await
        })?;
        info_tuple(py, info)
    }

    /// ``DoPut`` of ``batches`` under the descriptor (a path or a command), from device
    /// memory: the ``app_metadata`` of each ``PutResult`` the server answered with.
    #[pyo3(signature = (path, command, batches, schema = None, timeout = None))]
    fn _do_put<'py>(
        &self,
        py: Python<'py>,
        path: Option<Vec<String>>,
        command: Option<Vec<u8>>,
        batches: Vec<Py<PyDeviceRecordBatch>>,
        schema: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        const OPERATION: &str = "do_put";
        let descriptor = descriptor_arg(OPERATION, path, command)?;
        let (schema, batches) = batches_arg(OPERATION, batches, schema)?;
        let timeout = timeout_arg(OPERATION, timeout)?;
        let mut clients = self.clients(OPERATION)?;
        let results = wait(py, &self.runtime, OPERATION, timeout, async move {
            clients.device.do_put(descriptor, schema, batches).await
        })?;
        Ok(results
            .iter()
            .map(|r| PyBytes::new(py, &r.app_metadata))
            .collect())
    }

    /// ``DoExchange`` under the descriptor (a path or a command): sends ``batches`` from
    /// device memory and lands the answer on the device of ``ctx``:
    /// ``(schema, [DeviceRecordBatch])``.
    #[pyo3(signature = (path, command, batches, ctx, schema = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn _do_exchange(
        &self,
        py: Python<'_>,
        path: Option<Vec<String>>,
        command: Option<Vec<u8>>,
        batches: Vec<Py<PyDeviceRecordBatch>>,
        ctx: &PyContext,
        schema: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<(Py<PyAny>, Vec<PyDeviceRecordBatch>)> {
        const OPERATION: &str = "do_exchange";
        let descriptor = descriptor_arg(OPERATION, path, command)?;
        let (schema, batches) = batches_arg(OPERATION, batches, schema)?;
        let timeout = timeout_arg(OPERATION, timeout)?;
        let mut clients = self.clients(OPERATION)?;
        let ctx = ctx.inner.clone();
        let (schema, batches) = wait(py, &self.runtime, OPERATION, timeout, async move {
            landed(
                clients
                    .device
                    .do_exchange(descriptor, schema, batches, &ctx)
                    .await?,
            )
            .await
        })?;
        let schema_object = python_schema(py, &schema)?;
        Ok((schema_object, device_batches(py, &schema, batches)?))
    }

    /// ``ListFlights`` with ``criteria``: one tuple per flight (see ``cudabuf/flight.py``).
    #[pyo3(signature = (criteria, timeout = None))]
    fn _list_flights<'py>(
        &self,
        py: Python<'py>,
        criteria: Vec<u8>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let timeout = timeout_arg("list_flights", timeout)?;
        let mut clients = self.clients("list_flights")?;
        let infos = wait(py, &self.runtime, "list_flights", timeout, async move {
            let request = with_bearer(
                Criteria {
                    expression: criteria.into(),
                },
                clients.token.as_deref(),
            )?;
            let mut stream = clients.raw.list_flights(request).await?.into_inner();
            let mut infos = Vec::new();
            while let Some(info) = stream.next().await {
                infos.push(info?);
            }
            Ok(infos)
        })?;
        infos.into_iter().map(|info| info_tuple(py, info)).collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.flight.FlightClient location={:?}{}>",
            self.location,
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// A descriptor from its Python parts: a path or a command, exactly one of them.
fn descriptor_arg(
    operation: &'static str,
    path: Option<Vec<String>>,
    command: Option<Vec<u8>>,
) -> PyResult<FlightDescriptor> {
    match (path, command) {
        (Some(path), None) => Ok(FlightDescriptor::new_path(path)),
        (None, Some(command)) => Ok(FlightDescriptor::new_cmd(command)),
        _ => Err(invalid_argument(
            operation,
            "a descriptor is a path or a command, exactly one of them",
        )),
    }
}

/// The batches of a stream to send or serve with their schema: `schema` where given
/// (`None` or Python's `None`: the first batch's); every batch must have it.
fn batches_arg(
    operation: &'static str,
    batches: Vec<Py<PyDeviceRecordBatch>>,
    schema: Option<&Bound<'_, PyAny>>,
) -> PyResult<(SchemaRef, Vec<DeviceRecordBatch>)> {
    let batches: Vec<DeviceRecordBatch> = batches.iter().map(|b| b.get().inner.clone()).collect();
    let schema: SchemaRef = match (schema.filter(|s| !s.is_none()), batches.first()) {
        (Some(schema), _) => import_schema(operation, schema)?,
        (None, Some(first)) => first.schema().clone(),
        (None, None) => {
            return Err(invalid_argument(
                operation,
                "no batches and no schema: pass schema= for a stream without batches",
            ))
        }
    };
    if let Some(i) = batches.iter().position(|b| b.schema() != &schema) {
        return Err(invalid_argument(
            operation,
            format!(
                "batch {i}'s schema differs from the stream's: {} against {}",
                fields(batches[i].schema()),
                fields(&schema)
            ),
        ));
    }
    Ok((schema, batches))
}

/// A `FlightInfo` as `(schema or None, (path or None, command or None) or None,
/// [(ticket, [uri], app_metadata)], total_records, total_bytes, ordered, app_metadata)`.
fn info_tuple(py: Python<'_>, info: FlightInfo) -> PyResult<Bound<'_, PyTuple>> {
    let schema: Option<SchemaRef> = if info.schema.is_empty() {
        None
    } else {
        let decoded = guard_malformed("Flight schema", || {
            info.clone()
                .try_decode_schema()
                .map_err(|e| to_pyerr(Error::invalid_data("Flight schema", e.to_string())))
        })?;
        Some(Arc::new(decoded))
    };
    let schema: Py<PyAny> = match schema {
        Some(schema) => python_schema(py, &schema)?,
        None => py.None(),
    };
    let descriptor: Py<PyAny> = match &info.flight_descriptor {
        None => py.None(),
        Some(d) => match d.r#type() {
            DescriptorType::Path => (Some(d.path.clone()), None::<Py<PyBytes>>)
                .into_pyobject(py)?
                .into_any()
                .unbind(),
            DescriptorType::Cmd => (None::<Vec<String>>, Some(PyBytes::new(py, &d.cmd)))
                .into_pyobject(py)?
                .into_any()
                .unbind(),
            DescriptorType::Unknown => py.None(),
        },
    };
    let endpoints = info
        .endpoint
        .iter()
        .map(|e| {
            let ticket = e.ticket.as_ref().map(|t| t.ticket.as_ref()).unwrap_or(&[]);
            let uris: Vec<&str> = e.location.iter().map(|l| l.uri.as_str()).collect();
            (
                PyBytes::new(py, ticket),
                uris,
                PyBytes::new(py, &e.app_metadata),
            )
                .into_pyobject(py)
        })
        .collect::<PyResult<Vec<_>>>()?;
    (
        schema,
        descriptor,
        endpoints,
        info.total_records,
        info.total_bytes,
        info.ordered,
        PyBytes::new(py, &info.app_metadata),
    )
        .into_pyobject(py)
}

/// A running server: its runtime, the signal that stops it and the serving task.
struct Serving {
    runtime: Runtime,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), FlightError>>,
}

/// The native part of ``cudabuf.flight.FlightServer`` (which see).
#[pyclass(module = "cudabuf._native", name = "_FlightServer", frozen, subclass)]
pub(crate) struct PyFlightServer {
    server: DeviceFlightServer,
    host: String,
    port: u16,
    serving: Mutex<Option<Serving>>,
    pid: u32,
}

impl PyFlightServer {
    fn lock(&self) -> MutexGuard<'_, Option<Serving>> {
        // Only ever replaced whole: a poisoned lock is still consistent.
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The server's map, while it serves.
    fn open(&self) -> PyResult<&DeviceFlightServer> {
        if std::process::id() != self.pid {
            return Err(forked("FlightServer"));
        }
        if self.lock().is_none() {
            return Err(to_pyerr(Error::Closed {
                what: "FlightServer",
            }));
        }
        Ok(&self.server)
    }

    /// Drop every flight the server holds.
    fn clear(&self) {
        for key in self.server.keys() {
            self.server.remove(&key);
        }
    }

    /// The flight under `key` as `(schema, [DeviceRecordBatch])`.
    fn flight_tuple(
        py: Python<'_>,
        flight: Option<cudabuf_flight::DeviceFlight>,
    ) -> PyResult<Option<(Py<PyAny>, Vec<PyDeviceRecordBatch>)>> {
        flight
            .map(|f| {
                Ok((
                    python_schema(py, &f.schema)?,
                    device_batches(py, &f.schema, f.batches)?,
                ))
            })
            .transpose()
    }
}

impl Drop for PyFlightServer {
    fn drop(&mut self) {
        let serving = self.lock().take();
        if std::process::id() != self.pid {
            // A forked child's copy: its runtime has no threads here.
            std::mem::forget(serving);
            return;
        }
        if let Some(serving) = serving {
            // Without waiting: the runtime cancels its tasks (connections included) on
            // its own threads.
            let _ = serving.stop.send(());
            serving.runtime.shutdown_background();
        }
    }
}

#[pymethods]
impl PyFlightServer {
    #[new]
    #[pyo3(
        signature = (ctx, *, token = None, host = "127.0.0.1".to_owned(), port = 0, max_message_size = DEFAULT_LIMIT),
        text_signature = "(ctx, *, token=None, host='127.0.0.1', port=0, max_message_size=67108864)"
    )]
    fn py_new(
        py: Python<'_>,
        ctx: &PyContext,
        token: Option<String>,
        host: String,
        port: i64,
        max_message_size: i64,
    ) -> PyResult<Self> {
        const OPERATION: &str = "FlightServer";
        let port = u16::try_from(port).map_err(|_| {
            invalid_argument(OPERATION, format!("port must be in 0..=65535, got {port}"))
        })?;
        let token = token_arg(OPERATION, token)?;
        let max_message_size = limit_arg(OPERATION, max_message_size)?;
        let runtime = build_runtime("cudabuf-flight-server")?;
        let listener = py
            .detach(|| {
                let listener = std::net::TcpListener::bind((host.as_str(), port))?;
                listener.set_nonblocking(true)?;
                let _entered = runtime.enter();
                tokio::net::TcpListener::from_std(listener)
            })
            .map_err(|e| {
                flight_status(
                    UNAVAILABLE,
                    format!("FlightServer cannot listen on {host}:{port}: {e}"),
                )
            })?;
        let port = listener
            .local_addr()
            .map_err(|e| flight_status(UNAVAILABLE, format!("FlightServer: {e}")))?
            .port();
        let server = DeviceFlightServer::with_max_message_size(&ctx.inner, max_message_size);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = server.clone();
        let task = runtime.spawn(async move {
            let result = serving
                .serve(listener, token.as_deref(), async {
                    stopped.await.ok();
                })
                .await;
            if let Err(e) = &result {
                log::error!("cudabuf FlightServer stopped serving: {e}");
            }
            result
        });
        Ok(PyFlightServer {
            server,
            host,
            port,
            serving: Mutex::new(Some(Serving {
                runtime,
                stop,
                task,
            })),
            pid: std::process::id(),
        })
    }

    /// The port the server listens on (the one the OS picked for ``port=0``).
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The host it listens on, as given.
    #[getter]
    fn host(&self) -> &str {
        &self.host
    }

    /// ``grpc://host:port``, what a client connects to.
    #[getter]
    fn location(&self) -> String {
        if self.host.contains(':') {
            format!("grpc://[{}]:{}", self.host, self.port)
        } else {
            format!("grpc://{}:{}", self.host, self.port)
        }
    }

    /// The limit on one incoming ``DoPut`` message (header and body), in bytes.
    #[getter]
    fn max_message_size(&self) -> usize {
        self.server.max_message_size()
    }

    /// Whether ``shutdown()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// Serve ``batches`` under ``key`` (bytes), replacing what was there.
    #[pyo3(signature = (key, batches, schema = None))]
    fn _insert(
        &self,
        key: Vec<u8>,
        batches: Vec<Py<PyDeviceRecordBatch>>,
        schema: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        const OPERATION: &str = "FlightServer.insert";
        let server = self.open()?;
        let (schema, batches) = batches_arg(OPERATION, batches, schema)?;
        server.insert(key, schema, batches).map_err(flight_error)
    }

    /// The flight under ``key``: ``(schema, [DeviceRecordBatch])``, or ``None``.
    fn _get(
        &self,
        py: Python<'_>,
        key: Vec<u8>,
    ) -> PyResult<Option<(Py<PyAny>, Vec<PyDeviceRecordBatch>)>> {
        let flight = self.open()?.get(&key);
        Self::flight_tuple(py, flight)
    }

    /// Take the flight under ``key`` out: ``(schema, [DeviceRecordBatch])``, or ``None``.
    fn _remove(
        &self,
        py: Python<'_>,
        key: Vec<u8>,
    ) -> PyResult<Option<(Py<PyAny>, Vec<PyDeviceRecordBatch>)>> {
        let flight = self.open()?.remove(&key);
        Self::flight_tuple(py, flight)
    }

    /// Every key, in order, as ``bytes``.
    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        Ok(self
            .open()?
            .keys()
            .iter()
            .map(|k| PyBytes::new(py, k))
            .collect())
    }

    /// Stop serving and drop the flights the server holds. Calls in progress get up to
    /// ``grace`` seconds to finish; then their connections are closed (their clients see
    /// an error). Idempotent.
    #[pyo3(signature = (grace = 5.0))]
    fn shutdown(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let grace = Duration::try_from_secs_f64(grace).map_err(|_| {
            invalid_argument(
                "FlightServer.shutdown",
                format!("grace must be a finite number of seconds >= 0, got {grace}"),
            )
        })?;
        let Some(serving) = self.lock().take() else {
            return Ok(());
        };
        if std::process::id() != self.pid {
            std::mem::forget(serving);
            return Err(forked("FlightServer"));
        }
        let Serving {
            runtime,
            stop,
            task,
        } = serving;
        let _ = stop.send(());
        // Graceful: no new connections; calls in progress finish, up to `grace`.
        let served = wait(py, &runtime, "FlightServer.shutdown", None, async move {
            match tokio::time::timeout(grace, task).await {
                Ok(Ok(result)) => result.map(|()| true),
                Ok(Err(join)) => Err(FlightError::from(tonic::Status::internal(format!(
                    "the serving task failed: {join}"
                )))),
                Err(_) => Ok(false),
            }
        });
        // Then the runtime goes, cancelling the connections still open.
        match &served {
            Err(_) => runtime.shutdown_background(),
            Ok(_) => py.detach(|| runtime.shutdown_timeout(Duration::from_secs(1))),
        }
        py.detach(|| self.clear());
        served.map(|finished| {
            if !finished {
                log::debug!("FlightServer.shutdown: calls still running after the grace period were cancelled");
            }
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "<cudabuf.flight.FlightServer location={:?}{}>",
            self.location(),
            if self.closed() { " closed" } else { "" }
        )
    }
}

/// A schema's fields, for messages.
fn fields(schema: &Schema) -> String {
    let names: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| format!("{}: {}", f.name(), f.data_type()))
        .collect();
    format!("[{}]", names.join(", "))
}
