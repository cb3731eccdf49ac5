//! `cudabuf`: the command-line tool of the cudabuf workspace.
//!
//! - `cudabuf info`: the backends this binary has, their devices, memory, capabilities
//!   and peer access;
//! - `cudabuf bandwidth`: host <-> device and device <-> device copy bandwidth;
//! - `cudabuf handle`: decode and check an IPC handle.
//!
//! Each prints text, or JSON with `--json`. Results go to stdout; errors, and the progress
//! bar of `bandwidth` on a terminal, go to stderr. Exit status: 0 on success, 1 on an
//! error (or a handle that fails its checks), 2 on a usage error.

mod backend_choice;
mod bandwidth;
mod handle;
mod info;
mod size_text;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// What a subcommand returns: its whole output, or an error for stderr.
type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The output of a subcommand, and whether it counts as a success.
struct Outcome {
    /// What goes to stdout.
    stdout: String,
    /// `false` when the output reports a failed check (exit status 1).
    ok: bool,
}

impl Outcome {
    fn success(stdout: String) -> Self {
        Outcome { stdout, ok: true }
    }
}

/// cudabuf's command-line tool: devices, bandwidth and IPC handles, on the simulator or
/// CUDA.
#[derive(Parser)]
#[command(name = "cudabuf", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the backends, their devices, memory, capabilities and peer access.
    Info(info::InfoArgs),
    /// Measure copy bandwidth: host-to-device and device-to-host (pinned and pageable
    /// host memory) and device-to-device.
    Bandwidth(bandwidth::BandwidthArgs),
    /// Decode and check an IPC handle given as hex (argument or standard input) or as a
    /// file of handle bytes.
    Handle(handle::HandleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Info(args) => info::run(&args).map(Outcome::success),
        Command::Bandwidth(args) => bandwidth::run(&args).map(Outcome::success),
        Command::Handle(args) => handle::run(&args),
    };
    match outcome {
        Ok(outcome) => {
            let mut stdout = io::stdout().lock();
            let written = stdout
                .write_all(outcome.stdout.as_bytes())
                .and_then(|()| stdout.flush());
            match written {
                // A closed pipe (`cudabuf info | head -1`) is the reader's choice.
                Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
                    eprintln!("cudabuf: error: writing the output: {e}");
                    ExitCode::FAILURE
                }
                _ if outcome.ok => ExitCode::SUCCESS,
                _ => ExitCode::FAILURE,
            }
        }
        Err(e) => {
            eprintln!("cudabuf: error: {e}");
            ExitCode::FAILURE
        }
    }
}
