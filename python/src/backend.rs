//! Which backend new contexts and host buffers come from: `CUDABUF_BACKEND=sim|cuda` (read
//! on first use), or `cudabuf.set_backend(...)` in code.
//!
//! Objects keep the backend they were made with; a switch affects only what is made
//! afterwards. Each backend is made once per process, so switching back to the simulator
//! finds the same simulated devices and allocations. A child forked from the process
//! inherits the current backend (whose calls the simulator then refuses, as CUDA refuses
//! a forked child its parent's contexts), and makes its own on `set_backend`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use cudabuf::Backend;
use pyo3::prelude::*;

use crate::errors::{invalid_argument, OrRaise};

/// The backends there are, by canonical name.
const KNOWN: [&str; 2] = ["sim", "cuda"];

#[derive(Default)]
struct Selection {
    current: Option<Backend>,
    made: HashMap<&'static str, Backend>,
    /// The process `made` belongs to (0 before the first backend is made).
    pid: u32,
}

static SELECTION: Mutex<Option<Selection>> = Mutex::new(None);

fn selection() -> MutexGuard<'static, Option<Selection>> {
    SELECTION.lock().unwrap_or_else(|p| p.into_inner())
}

/// The canonical name of a backend name (`""` is the simulator).
fn canonical(name: &str) -> &str {
    match name.trim() {
        "" => "sim",
        other => other,
    }
}

fn make(selection: &mut Selection, name: &str) -> cudabuf::Result<Backend> {
    let pid = std::process::id();
    if selection.pid != pid {
        // A forked child: the backends made so far are its parent's.
        selection.made.clear();
        selection.pid = pid;
    }
    let backend = match selection.made.get(canonical(name)) {
        Some(backend) => backend.clone(),
        None => {
            let backend = cudabuf::backend_named(canonical(name))?;
            selection
                .made
                .insert(backend.kind().name(), backend.clone());
            backend
        }
    };
    Ok(backend)
}

/// The current backend (chosen from `CUDABUF_BACKEND` on first use).
pub(crate) fn current() -> PyResult<Backend> {
    let mut guard = selection();
    let selection = guard.get_or_insert_with(Selection::default);
    if let Some(backend) = &selection.current {
        return Ok(backend.clone());
    }
    let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
    let backend = make(selection, &name).or_raise()?;
    selection.current = Some(backend.clone());
    Ok(backend)
}

/// Use the backend called `name` for every context and host buffer made from now on:
/// ``"sim"`` (the simulator, the default) or ``"cuda"`` (the CUDA driver, loaded now).
///
/// Objects made before keep their backend. Overrides ``CUDABUF_BACKEND``. In a child made
/// by ``os.fork``, whose parent's simulator refuses it (``NoDriverError``, as CUDA
/// refuses a forked child), it makes the child a backend of its own. A test suite
/// that must run without a GPU calls ``cudabuf.set_backend("sim")`` in its
/// ``conftest.py`` (or sets ``CUDABUF_BACKEND=sim``).
///
/// Raises:
///     InvalidArgumentError: for an unknown name.
///     NoDriverError: for ``"cuda"`` when no CUDA driver can be loaded.
#[pyfunction]
pub(crate) fn set_backend(py: Python<'_>, name: &str) -> PyResult<()> {
    // An unknown name is the caller's, not `CUDABUF_BACKEND`'s (which the core's message
    // would name).
    if !KNOWN.contains(&canonical(name)) {
        return Err(invalid_argument(
            "set_backend",
            format!("unknown backend {name:?}: expected \"sim\" or \"cuda\""),
        ));
    }
    let name = name.to_owned();
    py.detach(move || {
        let mut guard = selection();
        let selection = guard.get_or_insert_with(Selection::default);
        let backend = make(selection, &name)?;
        selection.current = Some(backend);
        Ok::<_, cudabuf::Error>(())
    })
    .or_raise()
}

/// The name of the current backend: ``"sim"`` or ``"cuda"`` (chosen from
/// ``CUDABUF_BACKEND`` on first use, default ``"sim"``). Needs no CUDA driver: with
/// ``CUDABUF_BACKEND=cuda`` on a machine without one it says ``"cuda"``, and making a
/// context raises ``NoDriverError``.
///
/// Raises:
///     InvalidArgumentError: ``CUDABUF_BACKEND`` names no backend.
#[pyfunction]
pub(crate) fn get_backend() -> PyResult<&'static str> {
    let mut guard = selection();
    let selection = guard.get_or_insert_with(Selection::default);
    if let Some(backend) = &selection.current {
        return Ok(backend.kind().name());
    }
    let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
    match KNOWN.iter().find(|&&known| known == canonical(&name)) {
        Some(known) => Ok(known),
        // Unknown: the core's error, which names the variable.
        None => make(selection, &name).map(|b| b.kind().name()).or_raise(),
    }
}
