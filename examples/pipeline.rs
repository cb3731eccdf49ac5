//! A double-buffered upload pipeline on two streams: the host fills one pinned staging
//! buffer while the other is copied to the device on a copy stream, and a second stream
//! moves each chunk into place (standing in for a kernel that consumes it). Events order
//! the two streams; nothing blocks the host but the wait for a staging buffer's previous
//! copy.
//!
//! ```text
//! cargo run --example pipeline                                      # on the simulator
//! CUDABUF_BACKEND=cuda cargo run --release --features cuda --example pipeline
//! cargo run --example pipeline -- 256M 8M                           # total size, chunk size
//! ```
//!
//! On the simulator the race detector checks every ordering: remove the
//! `compute.wait_event(..)` line and the run stops with a `DataRace` error naming both
//! copies.

use std::process::ExitCode;
use std::time::Instant;

use cudabuf::{Event, HostRange, StreamFlags, Transfer};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pipeline failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn arg_size(n: usize, default: usize) -> AnyResult<usize> {
    match std::env::args().nth(n) {
        None => Ok(default),
        Some(text) => cudabuf::parse_size(&text)
            .filter(|&s| s > 0)
            .ok_or_else(|| format!("{text:?} is not a size such as 64M").into()),
    }
}

/// The byte at `i` of the data set (cheap to make and to check).
fn byte_at(i: usize) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 13) as u8
}

fn run() -> AnyResult<()> {
    let total = arg_size(1, 64 << 20)?;
    let chunk = arg_size(2, 4 << 20)?.min(total);
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    println!(
        "backend {}: {} MiB in {} KiB chunks through two pinned staging buffers",
        backend.kind(),
        total >> 20,
        chunk >> 10
    );

    let non_blocking = StreamFlags {
        non_blocking: true,
        priority: 0,
    };
    let copy = ctx.new_stream_with(non_blocking)?; // host -> device staging
    let compute = ctx.new_stream_with(non_blocking)?; // staging -> final place
    let out = ctx.new_buffer(total)?;
    let staging = [ctx.new_buffer(chunk)?, ctx.new_buffer(chunk)?];

    // Per slot: its pinned buffer (while the host fills it) or the transfer that holds it,
    // and the event after which the compute stream is done with the device staging.
    let mut hosts = [
        Some(ctx.new_host_buffer(chunk)?),
        Some(ctx.new_host_buffer(chunk)?),
    ];
    let mut transfers: [Option<Transfer<HostRange>>; 2] = [None, None];
    let mut consumed: [Option<Event>; 2] = [None, None];

    let start = Instant::now();
    for (i, at) in (0..total).step_by(chunk).enumerate() {
        let slot = i % 2;
        let len = chunk.min(total - at);
        // The slot's previous upload must be done before the host writes its buffer.
        let mut host = match transfers[slot].take() {
            Some(transfer) => transfer
                .wait()?
                .into_buffer()
                .map_err(|_| "a window from into_range gives its whole buffer back")?,
            None => hosts[slot]
                .take()
                .ok_or("a slot holds its buffer or a transfer")?,
        };
        for (j, b) in host[..len].iter_mut().enumerate() {
            *b = byte_at(at + j);
        }
        // The device staging of this slot may be overwritten only after the compute
        // stream has moved its previous chunk out.
        if let Some(event) = &consumed[slot] {
            copy.wait_event(event)?;
        }
        let range = host.into_range(..len)?;
        transfers[slot] = Some(copy.copy_from_host(&staging[slot].slice(0, len)?, range)?);
        compute.wait_event(&copy.record_event()?)?;
        compute.copy_device(&out.slice(at, len)?, &staging[slot].slice(0, len)?)?;
        consumed[slot] = Some(compute.record_event()?);
    }
    compute.synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    for transfer in transfers.into_iter().flatten() {
        transfer.wait()?;
    }

    let back = out.to_vec()?;
    let wrong = back
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != byte_at(i))
        .count();
    println!(
        "uploaded {} MiB in {:.1} ms ({:.2} GB/s, host fill included); {} wrong bytes",
        total >> 20,
        seconds * 1e3,
        total as f64 / seconds / 1e9,
        wrong
    );
    if wrong != 0 {
        return Err(format!("{wrong} bytes landed wrong").into());
    }
    Ok(())
}
