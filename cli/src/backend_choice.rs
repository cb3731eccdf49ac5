//! Which backend a subcommand runs on: `--backend sim|cuda`, or `CUDABUF_BACKEND`.

use cudabuf::{Backend, Result};

/// A backend this binary can open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BackendChoice {
    /// The simulator: host memory that behaves like device memory (always built in).
    Sim,
    /// The CUDA driver (with the `cuda` feature, on by default).
    Cuda,
}

/// The `--backend` option, shared by the subcommands that run on one backend.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct BackendArg {
    /// The backend to run on [default: CUDABUF_BACKEND, else sim]
    #[arg(long, value_enum)]
    backend: Option<BackendChoice>,
}

impl BackendArg {
    /// The backend asked for: `--backend`, else `CUDABUF_BACKEND` read as
    /// [`cudabuf::backend_from_env`] reads it (unset or empty: the simulator).
    ///
    /// # Errors
    /// An unknown name in `CUDABUF_BACKEND`.
    pub(crate) fn choice(&self) -> Result<BackendChoice> {
        if let Some(choice) = self.backend {
            return Ok(choice);
        }
        let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
        match name.trim() {
            "" | "sim" => Ok(BackendChoice::Sim),
            "cuda" => Ok(BackendChoice::Cuda),
            other => Err(cudabuf::Error::invalid_argument(
                "choosing the backend",
                format!(
                    "{}={other:?}: expected \"sim\" or \"cuda\"",
                    cudabuf::BACKEND_VAR
                ),
            )),
        }
    }

    /// Open the backend asked for.
    ///
    /// # Errors
    /// As [`choice`](Self::choice) and [`BackendChoice::open`].
    pub(crate) fn open(&self) -> Result<Backend> {
        self.choice()?.open()
    }
}

impl BackendChoice {
    /// Open this backend.
    ///
    /// # Errors
    /// `NoDriver` for CUDA without a driver; `Unsupported` for CUDA in a build without
    /// the `cuda` feature.
    pub(crate) fn open(self) -> Result<Backend> {
        match self {
            BackendChoice::Sim => Ok(cudabuf::sim_backend()),
            BackendChoice::Cuda => open_cuda(),
        }
    }
}

/// The CUDA backend.
#[cfg(feature = "cuda")]
pub(crate) fn open_cuda() -> Result<Backend> {
    Ok(Backend::new(cudabuf_cuda::CudaBackend::new()?))
}

/// The CUDA backend, which this build lacks.
#[cfg(not(feature = "cuda"))]
pub(crate) fn open_cuda() -> Result<Backend> {
    Err(cudabuf::Error::unsupported(
        "the cuda backend",
        NO_CUDA_FEATURE,
    ))
}

/// Why a build without the `cuda` feature has no CUDA backend, and how to get one.
#[cfg(not(feature = "cuda"))]
pub(crate) const NO_CUDA_FEATURE: &str = "this cudabuf binary was built without the `cuda` \
    feature; `cargo install cudabuf-cli` builds it in (the feature is on by default)";
