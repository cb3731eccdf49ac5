//! The command line: which sections, sizes and outputs.

use cudabuf::parse_size;

use crate::{AnyResult, GIB, MIB};

/// Where the JSON goes when `--json` is not given.
const JSON_VAR: &str = "CUDABUF_BENCH_JSON";

// ---------------------------------------------------------------------------------------
// Options, backend, records

pub(crate) struct Options {
    pub(crate) json: Option<String>,
    pub(crate) only: Option<Vec<String>>,
    pub(crate) sizes: Vec<usize>,
    /// Whether `--sizes` was given (sections with sizes of their own take these then).
    pub(crate) sizes_given: bool,
    pub(crate) quick: bool,
    /// Sizes of the `peer` section.
    pub(crate) peer_sizes: Vec<usize>,
    /// Devices of the simulator (the `peer` section needs 2).
    pub(crate) sim_devices: usize,
    /// The copy size of the `sweep` section (`--sweep-size`; 256 MiB, 16 MiB with
    /// `--quick`).
    pub(crate) sweep_size: Option<usize>,
}

pub(crate) fn parse_options() -> AnyResult<Options> {
    let mut opts = Options {
        json: std::env::var(JSON_VAR).ok().filter(|s| !s.is_empty()),
        only: None,
        sizes: vec![MIB, 64 * MIB, GIB],
        sizes_given: false,
        quick: false,
        peer_sizes: vec![64 * MIB, GIB],
        sim_devices: 2,
        sweep_size: None,
    };
    let mut peer_sizes_given = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--json" => opts.json = Some(args.next().ok_or("--json needs a path")?),
            "--only" => {
                let list = args.next().ok_or("--only needs a list")?;
                opts.only = Some(list.split(',').map(|s| s.trim().to_owned()).collect());
            }
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs a list")?;
                opts.sizes = list
                    .split(',')
                    .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?}")))
                    .collect::<Result<_, _>>()?;
                opts.sizes_given = true;
            }
            "--peer-sizes" => {
                let list = args.next().ok_or("--peer-sizes needs a list")?;
                opts.peer_sizes = list
                    .split(',')
                    .map(|s| parse_size(s).ok_or_else(|| format!("bad size {s:?}")))
                    .collect::<Result<_, _>>()?;
                peer_sizes_given = true;
            }
            "--sim-devices" => {
                let n = args.next().ok_or("--sim-devices needs a number")?;
                opts.sim_devices = n.parse().map_err(|e| format!("--sim-devices {n}: {e}"))?;
            }
            "--sweep-size" => {
                let s = args.next().ok_or("--sweep-size needs a size")?;
                opts.sweep_size =
                    Some(parse_size(&s).ok_or_else(|| format!("--sweep-size {s}: not a size"))?);
            }
            "--quick" => {
                opts.quick = true;
                opts.sizes = vec![MIB, 8 * MIB];
                if !peer_sizes_given {
                    opts.peer_sizes = vec![8 * MIB];
                }
            }
            // `cargo bench` passes `--bench`; libtest-style filters are ignored.
            _ => {}
        }
    }
    Ok(opts)
}

impl Options {
    pub(crate) fn wants(&self, section: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|s| s == section))
    }
}
