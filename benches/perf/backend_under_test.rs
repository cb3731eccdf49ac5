//! The backend under test, picked by `CUDABUF_BACKEND`.

use cudabuf::Backend;

use crate::AnyResult;

/// The backend under test, with its concrete type for the dispatch comparison.
pub(crate) enum Bench {
    Sim(cudabuf::sim::SimBackend),
    #[cfg(feature = "cuda")]
    Cuda(cudabuf::cuda::CudaBackend),
}

impl Bench {
    pub(crate) fn from_env(capacity: usize, sim_devices: usize) -> AnyResult<(Bench, Backend)> {
        let name = std::env::var(cudabuf::BACKEND_VAR).unwrap_or_default();
        match name.trim() {
            "" | "sim" => {
                let sim = cudabuf::sim::SimBackend::with_config(cudabuf::sim::SimConfig {
                    devices: sim_devices,
                    capacity_per_device: capacity,
                    ..Default::default()
                })?;
                let backend = Backend::new(sim.clone());
                Ok((Bench::Sim(sim), backend))
            }
            #[cfg(feature = "cuda")]
            "cuda" => {
                let cuda = cudabuf::cuda::CudaBackend::new()?;
                let backend = Backend::new(cuda.clone());
                Ok((Bench::Cuda(cuda), backend))
            }
            other => Err(format!(
                "{}={other:?}: expected sim or cuda (cuda needs --features cuda)",
                cudabuf::BACKEND_VAR
            )
            .into()),
        }
    }

    pub(crate) fn is_sim(&self) -> bool {
        matches!(self, Bench::Sim(_))
    }

    /// The staging configuration of device 0's primary context (CUDA, staging on).
    #[cfg(feature = "cuda")]
    fn staging(cuda: &cudabuf::cuda::CudaBackend) -> Option<cudabuf::cuda::StagingConfig> {
        let raw = cuda.cuda_device(0).ok()?.primary_driver_context().ok()?;
        let config = raw.staging_config();
        config.enabled().then_some(config)
    }

    /// The staging threads of host-to-device copies (CUDA, staging on).
    pub(crate) fn h2d_staging_threads(&self) -> Option<usize> {
        match self {
            Bench::Sim(_) => None,
            #[cfg(feature = "cuda")]
            Bench::Cuda(cuda) => Self::staging(cuda).map(|c| c.threads),
        }
    }

    /// The staging threads of device-to-host copies (CUDA, staging on).
    pub(crate) fn d2h_staging_threads(&self) -> Option<usize> {
        match self {
            Bench::Sim(_) => None,
            #[cfg(feature = "cuda")]
            Bench::Cuda(cuda) => Self::staging(cuda).map(|c| c.d2h_threads),
        }
    }

    /// Adaptive staging's copies of `size` bytes so far (CUDA, `h2d` host to device else
    /// device to host): how many of them took each path, which path wins, and each path's
    /// estimate; empty where nothing chose.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    pub(crate) fn staging_choice_note(&self, h2d: bool, size: usize) -> String {
        match self {
            Bench::Sim(_) => String::new(),
            #[cfg(feature = "cuda")]
            Bench::Cuda(cuda) => {
                let Ok(raw) = cuda.cuda_device(0).and_then(|d| d.primary_driver_context()) else {
                    return String::new();
                };
                let Some(c) = staging_choice(&raw, h2d, size) else {
                    return String::new();
                };
                let rate = |g: Option<f64>| g.map_or("-".to_owned(), |g| format!("{g:.2}"));
                format!(
                    "adaptive: {} staged / {} direct so far, winner {}, estimates staged {} / direct {} GB/s",
                    c.staged_copies,
                    c.direct_copies,
                    match c.staged_wins {
                        Some(true) => "staged",
                        Some(false) => "direct",
                        None => "none yet",
                    },
                    rate(c.staged_gbps),
                    rate(c.direct_gbps)
                )
            }
        }
    }
}

/// Adaptive staging's class of copies of `size` bytes on `raw` (`h2d` host to device,
/// else device to host), once it has learnt a copy.
#[cfg(feature = "cuda")]
pub(crate) fn staging_choice(
    raw: &cudabuf::cuda::CudaDriverContext,
    h2d: bool,
    size: usize,
) -> Option<cudabuf::cuda::StagingChoice> {
    raw.staging_choices()
        .into_iter()
        .find(|c| c.host_to_device == h2d && c.min_bytes <= size && size < c.max_bytes)
}
