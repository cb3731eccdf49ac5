//! `cudabuf.sim.Simulator`: a simulator instance of its own, configured from Python, with
//! its contexts, reports and fault injection (the Rust `cudabuf::sim::SimBackend`).
//!
//! The native class carries the Rust calls; `cudabuf/sim.py` subclasses it to turn the
//! reports into Python objects and to raise `SimulatorNotCleanError`.

use cudabuf::sim::{FaultOp, RaceMode, Schedule, SimBackend, SimConfig};
use cudabuf::Error;
use pyo3::prelude::*;

use crate::context::PyContext;
use crate::errors::{invalid_argument, non_negative, OrRaise};
use crate::host_memory::HostMemory;

/// The operation names `fail_nth`, `fail_randomly` and `op_count` take.
const OPS: [(&str, FaultOp); 6] = [
    ("allocate", FaultOp::Allocate),
    ("alloc_host", FaultOp::AllocHost),
    ("copy", FaultOp::Copy),
    ("ipc_export", FaultOp::IpcExport),
    ("ipc_open", FaultOp::IpcOpen),
    ("synchronize", FaultOp::Synchronize),
];

fn fault_op(operation: &'static str, name: &str) -> PyResult<FaultOp> {
    OPS.iter()
        .find(|(known, _)| *known == name)
        .map(|(_, op)| *op)
        .ok_or_else(|| {
            let known: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
            invalid_argument(
                operation,
                format!(
                    "unknown operation {name:?}: expected one of {}",
                    known.join(", ")
                ),
            )
        })
}

/// The error an injected fault raises: `"out_of_memory"` (`OutOfMemoryError`, naming the
/// request), `"driver"` (`DriverError`, `CUDA_ERROR_UNKNOWN`), or by default the first for
/// allocations and the second for everything else.
fn injected_error(
    operation: &'static str,
    op: FaultOp,
    op_name: &str,
    error: Option<&str>,
) -> PyResult<Error> {
    let error = error.unwrap_or(match op {
        FaultOp::Allocate | FaultOp::AllocHost => "out_of_memory",
        _ => "driver",
    });
    match error {
        "out_of_memory" => Ok(Error::OutOfMemory {
            device: 0,
            // 0: the simulator fills in the device and size of the request that fails.
            requested: 0,
            detail: format!("injected by {operation} on {op_name}"),
        }),
        "driver" => Ok(Error::Driver {
            call: "simulated driver call",
            name: "CUDA_ERROR_UNKNOWN".into(),
            code: 999,
            message: format!("injected by {operation} on {op_name}"),
        }),
        other => Err(invalid_argument(
            operation,
            format!("unknown error {other:?}: expected \"out_of_memory\" or \"driver\""),
        )),
    }
}

/// One race as Python gets it: operation, conflicting operation, range, hint, message.
type RaceTuple = (String, String, String, String, String);

/// A simulator of its own (the native part of ``cudabuf.sim.Simulator``).
#[pyclass(module = "cudabuf._native", name = "Simulator", frozen, subclass)]
pub(crate) struct PySimulator {
    sim: SimBackend,
    backend: cudabuf::Backend,
}

#[pymethods]
impl PySimulator {
    #[new]
    #[pyo3(signature = (devices = 2, capacity = 1_073_741_824, *, seed = None, schedule = None, races = None, name = None, fill = 0xA5))]
    fn py_new(
        devices: i64,
        capacity: i64,
        seed: Option<u64>,
        schedule: Option<&str>,
        races: Option<&str>,
        name: Option<String>,
        fill: i64,
    ) -> PyResult<Self> {
        let devices = non_negative("Simulator", "devices", devices)?;
        let capacity = non_negative("Simulator", "capacity", capacity)?;
        let fill = u8::try_from(fill).map_err(|_| {
            invalid_argument(
                "Simulator",
                format!("fill must be a byte value (0 to 255), got {fill}"),
            )
        })?;
        let schedule = schedule
            .map(|s| s.parse::<Schedule>())
            .transpose()
            .or_raise()?;
        let races = races
            .map(|s| s.parse::<RaceMode>())
            .transpose()
            .or_raise()?;
        let defaults = SimConfig::default();
        let config = SimConfig {
            devices,
            capacity_per_device: capacity,
            name: name.unwrap_or(defaults.name),
            seed,
            schedule,
            races,
            cost: defaults.cost,
            uninit_fill: fill,
        };
        let sim = SimBackend::with_config(config).or_raise()?;
        let backend = cudabuf::Backend::new(sim.clone());
        Ok(PySimulator { sim, backend })
    }

    /// The number of simulated devices.
    #[getter]
    fn devices(&self) -> usize {
        self.sim.config().devices
    }

    /// Each device's capacity in bytes.
    #[getter]
    fn capacity(&self) -> usize {
        self.sim.config().capacity_per_device
    }

    /// The name of the devices (device ``n`` is ``"{name} {n}"``) and of the reports.
    #[getter]
    fn name(&self) -> String {
        self.sim.config().name.clone()
    }

    /// The byte new device memory holds before anything is written to it (default
    /// ``0xA5``; pinned host memory is zero-filled whatever it is).
    #[getter]
    fn fill(&self) -> u8 {
        self.sim.config().uninit_fill
    }

    /// The seed of the stream scheduler.
    #[getter]
    fn seed(&self) -> u64 {
        self.sim.seed()
    }

    /// How streams run: ``"deterministic"`` or ``"threaded"``.
    #[getter]
    fn schedule(&self) -> String {
        self.sim.schedule().to_string()
    }

    /// What the race detector does: ``"fail"``, ``"log"`` or ``"off"``.
    #[getter]
    fn races(&self) -> String {
        self.sim.race_mode().to_string()
    }

    /// Device ``device``'s (primary) context on this simulator (not on the global
    /// backend): its buffers count in this simulator's reports. Its caching allocator is
    /// off, whatever ``CUDABUF_ALLOCATOR_CACHE`` says, so that each ``new_buffer`` is one
    /// allocation (as ``fail_nth("allocate", n)`` counts them) and a dropped buffer is
    /// freed at once (no cached segment looks like a leak).
    ///
    /// Raises:
    ///     InvalidDeviceError: for a device number out of range.
    #[pyo3(signature = (device = 0))]
    fn context(&self, py: Python<'_>, device: i64) -> PyResult<PyContext> {
        let device = non_negative("Simulator.context", "device", device)?;
        let backend = self.backend.clone();
        let ctx = py
            .detach(move || {
                let ctx = backend.context(device)?;
                // Exact reports and fault counts: every `new_buffer` one allocation, every
                // dropped buffer freed at once, whatever `CUDABUF_ALLOCATOR_CACHE` says.
                if ctx.allocator_cache_limit() != 0 {
                    ctx.set_allocator_cache_limit(0);
                }
                Ok::<_, cudabuf::Error>(ctx)
            })
            .or_raise()?;
        Ok(PyContext::new(ctx))
    }

    /// Pinned host memory of ``size`` bytes from this simulator, through device
    /// ``device``'s context (``cudabuf.cuda.new_host_buffer`` on this simulator).
    ///
    /// Raises:
    ///     OutOfMemoryError: an injected ``"alloc_host"`` fault.
    ///     InvalidDeviceError: for a device number out of range.
    #[pyo3(signature = (size, device = 0))]
    fn new_host_buffer<'py>(
        &self,
        py: Python<'py>,
        size: i64,
        device: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let size = non_negative("Simulator.new_host_buffer", "size", size)?;
        let device = non_negative("Simulator.new_host_buffer", "device", device)?;
        let backend = self.backend.clone();
        let host = py
            .detach(move || backend.new_host_buffer(size, device))
            .or_raise()?;
        HostMemory::from_pinned(host).into_object(py)
    }

    /// The bytes of live device allocations on ``device`` (what counts against its
    /// capacity).
    ///
    /// Raises:
    ///     InvalidDeviceError: for a device this simulator does not have (as ``context``
    ///         does: a test asserting 0 of a device that is not there would pass for
    ///         nothing).
    #[pyo3(signature = (device = 0))]
    fn bytes_in_use(&self, device: i64) -> PyResult<usize> {
        let device = non_negative("Simulator.bytes_in_use", "device", device)?;
        self.sim.sim_device(device).or_raise()?;
        Ok(self.sim.bytes_in_use(device))
    }

    /// Live allocations as ``(device, kind, address, size)``, and the report's text.
    fn _leaks(&self) -> (Vec<(usize, &'static str, u64, usize)>, String) {
        let report = self.sim.leak_report();
        let entries = report
            .entries
            .iter()
            .map(|e| (e.device, e.kind.name(), e.address, e.size))
            .collect();
        (entries, report.to_string())
    }

    /// Races as ``(operation, conflicting, range, hint, message)``, how many were not
    /// kept, and the report's text.
    fn _races(&self) -> (Vec<RaceTuple>, usize, String) {
        let report = self.sim.race_report();
        let entries = report
            .races
            .iter()
            .map(|r| {
                (
                    r.operation.clone(),
                    r.conflicting.clone(),
                    r.range.clone(),
                    r.hint.clone(),
                    r.to_string(),
                )
            })
            .collect();
        (entries, report.dropped, report.to_string())
    }

    /// Forget the races detected so far.
    fn clear_race_report(&self) {
        self.sim.clear_race_report();
    }

    /// Make the ``n``-th call (1-based, counting from now) of ``op`` fail, changing
    /// nothing. ``op``: ``"allocate"`` (device memory: ``new_buffer``, the copies that
    /// allocate), ``"alloc_host"`` (pinned host memory), ``"copy"`` (every copy),
    /// ``"ipc_export"``, ``"ipc_open"``, ``"synchronize"``. ``error``:
    /// ``"out_of_memory"`` (``OutOfMemoryError`` naming the request) or ``"driver"``
    /// (``DriverError``, ``CUDA_ERROR_UNKNOWN``); by default the first for allocations,
    /// the second for everything else. Faults hit backend calls: ``"allocate"`` counts
    /// the device allocations of this simulator's contexts (one per ``new_buffer``,
    /// their caching allocator being off), including those cudabuf makes inside a call.
    ///
    /// Raises:
    ///     InvalidArgumentError: an unknown ``op`` or ``error``, or ``n`` below 1.
    #[pyo3(signature = (op, n, error = None))]
    fn fail_nth(&self, op: &str, n: i64, error: Option<&str>) -> PyResult<()> {
        let fault = fault_op("Simulator.fail_nth", op)?;
        let n = non_negative("Simulator.fail_nth", "n", n)?;
        let error = injected_error("Simulator.fail_nth", fault, op, error)?;
        self.sim.fail_nth(fault, n as u64, error).or_raise()
    }

    /// Make each call of ``op`` fail with ``probability``, the same calls for the same
    /// ``seed``. ``op`` and ``error`` as for ``fail_nth``.
    ///
    /// Raises:
    ///     InvalidArgumentError: an unknown ``op`` or ``error``, or a probability
    ///     outside ``0.0..1.0``.
    #[pyo3(signature = (op, probability, seed = 0, error = None))]
    fn fail_randomly(
        &self,
        op: &str,
        probability: f64,
        seed: u64,
        error: Option<&str>,
    ) -> PyResult<()> {
        let fault = fault_op("Simulator.fail_randomly", op)?;
        let error = injected_error("Simulator.fail_randomly", fault, op, error)?;
        self.sim
            .fail_randomly(fault, probability, seed, error)
            .or_raise()
    }

    /// Disarm every injected fault (the call counts go on).
    fn clear_faults(&self) {
        self.sim.clear_faults();
    }

    /// How many calls of ``op`` this simulator has seen, failed ones included.
    ///
    /// Raises:
    ///     InvalidArgumentError: an unknown ``op``.
    fn op_count(&self, op: &str) -> PyResult<u64> {
        Ok(self.sim.op_count(fault_op("Simulator.op_count", op)?))
    }

    fn __repr__(&self) -> String {
        format!(
            "Simulator(devices={}, capacity={}, seed={}, schedule={:?}, races={:?}, fill={:#04x})",
            self.sim.config().devices,
            self.sim.config().capacity_per_device,
            self.sim.seed(),
            self.sim.schedule().to_string(),
            self.sim.race_mode().to_string(),
            self.sim.config().uninit_fill
        )
    }
}
