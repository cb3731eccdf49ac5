//! `sweep` (CUDA): staged pageable copies for each number of staging threads and chunk
//! size, to choose the defaults.

#[cfg(feature = "cuda")]
use std::time::Duration;

use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
#[cfg(feature = "cuda")]
use crate::report::human;
use crate::report::{progress, Records};
#[cfg(feature = "cuda")]
use crate::timing::{gbps, median, pattern, time_calls};
use crate::AnyResult;
#[cfg(feature = "cuda")]
use crate::MIB;

#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn sweep(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    match bench {
        Bench::Sim(_) => {
            progress("sweep: CUDA only (staging of pageable copies)");
            Ok(())
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            use cudabuf::cuda::StagingConfig;
            let raw = cuda.cuda_device(0)?.primary_driver_context()?;
            let default = raw.staging_config();
            let size = opts
                .sweep_size
                .unwrap_or(if opts.quick { 16 * MIB } else { 256 * MIB });
            let d = ctx.new_buffer(size)?;
            let src = pattern(size);
            let mut dst = pattern(size);
            let threads = [1usize, 2, 4, 6, 8, 12, 16];
            let chunks = [MIB / 2, MIB, 2 * MIB, 4 * MIB, 8 * MIB];
            let mut result = Ok(());
            'outer: for &t in &threads {
                for &c in &chunks {
                    let config = StagingConfig::uniform(t, c, 0);
                    raw.set_staging_config(config);
                    raw.start_staging()?;
                    let label = format!("t{t}_c{}", human(c).replace(' ', ""));
                    for (op, h2d) in [("h2d", true), ("d2h", false)] {
                        let r = time_calls(1, 3, 40, Duration::from_millis(150), || {
                            if h2d {
                                d.copy_from_host(&src, 0, None)?;
                            } else {
                                d.copy_to_host_into(0, &mut dst, None)?;
                            }
                            Ok(())
                        });
                        match r {
                            Ok(mut s) => {
                                let n = s.len();
                                let v = gbps(size, median(&mut s));
                                rec.push(
                                    "sweep",
                                    format!("{op}_{label}"),
                                    Some(size),
                                    v,
                                    "GB/s",
                                    n,
                                    "",
                                );
                            }
                            Err(e) => {
                                result = Err(e);
                                break 'outer;
                            }
                        }
                    }
                }
            }
            raw.set_staging_config(default);
            raw.start_staging()?;
            result
        }
    }
}
