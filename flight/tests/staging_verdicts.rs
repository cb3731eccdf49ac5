//! Race verdicts of `DeviceFlightDecoder` on the simulator, whichever memory a message
//! body is uploaded from: a pinned staging buffer the context's pool lends (an
//! asynchronous copy on the decoder's own blocking stream), or, when none can be lent
//! (the pool off, or unable to pin), gRPC's buffer by a synchronous copy cudabuf makes for
//! that stream (`OrderingHooks::copy_host_to_device_as_on`). The decoder promises only that
//! the batches it returns are complete: a program that relies on it for another blocking
//! stream's work is flagged under every mode, seed (12 unless `HUNT_SEEDS` says
//! otherwise) and schedule.

use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use cudabuf_core::{Context, Result};
use cudabuf_flight::{DeviceFlightDecoder, FlightError};
use cudabuf_sim::{FaultOp, Schedule, SimBackend};
use cudabuf_test_support::{lies, sim, NON_BLOCKING};

/// A simulator whose races fail the call, and its device 0's primary context.
fn one(schedule: Schedule, seed: u64) -> (SimBackend, Context) {
    sim(schedule, seed).context()
}

/// Where the decoder's uploads come from, each forced deterministically.
#[derive(Clone, Copy, Debug)]
enum Upload {
    /// The pool off: every body straight from gRPC's buffer.
    PoolOff,
    /// The pool on, but pinning fails: the same.
    PoolOnPinFails,
    /// The pool warmed: every body through a pooled pinned buffer.
    PooledPinned,
}

impl Upload {
    const ALL: [Upload; 3] = [
        Upload::PoolOff,
        Upload::PoolOnPinFails,
        Upload::PooledPinned,
    ];

    fn set_up(self, sim: &SimBackend, ctx: &Context) {
        match self {
            Upload::PoolOff => ctx.set_staging_pool_limit(0),
            Upload::PoolOnPinFails => {
                ctx.set_staging_pool_limit(64 << 20);
                let oom = cudabuf_core::Error::OutOfMemory {
                    device: 0,
                    requested: 0,
                    detail: "injected: the decoder uploads from pageable memory".into(),
                };
                sim.fail_randomly(FaultOp::AllocHost, 1.0, 0, oom).unwrap();
            }
            Upload::PooledPinned => {
                ctx.set_staging_pool_limit(64 << 20);
                ctx.pin_staging_in_background(64 << 10, 64 << 10, 4);
                ctx.wait_background_pinning();
            }
        }
    }
}

fn device(e: FlightError) -> cudabuf_core::Error {
    match e {
        FlightError::Device(e) => e,
        other => panic!("not a device error: {other}"),
    }
}

/// A blocking stream `x` copies `a` to `b`; the decoder decodes one batch (its upload
/// issued after the copy); then, with `sync_x`, the host synchronizes `x`; a non-blocking
/// stream copies `b` to `out`.
fn decode_beside_a_blocking_stream(ctx: &Context, sync_x: bool) -> Result<()> {
    let host = RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>())) as _,
    )])
    .unwrap();
    let messages = arrow_flight::utils::batches_to_flight_data(&host.schema(), [&host]).unwrap();
    let [schema, data] = <[_; 2]>::try_from(messages).unwrap();
    let a = ctx.buffer_from_data(&[3u8; 4096][..])?;
    let b = ctx.new_buffer(4096)?;
    let out = ctx.new_buffer(4096)?;
    let x = ctx.new_stream()?;
    let nb = ctx.new_stream_with(NON_BLOCKING)?;
    let mut decoder = DeviceFlightDecoder::new(ctx).map_err(device)?;
    assert!(decoder.push(&schema).map_err(device)?.is_none());
    x.copy_device(&b, &a)?;
    assert!(decoder.push(&data).map_err(device)?.is_none());
    let batch = decoder.finish().map_err(device)?.expect("one batch");
    if sync_x {
        x.synchronize()?;
    }
    nb.copy_device(&out, &b)?;
    nb.synchronize()?;
    x.synchronize()?;
    assert_eq!(batch.to_host()?, host);
    if sync_x {
        assert_eq!(out.to_vec()?, vec![3u8; 4096]);
    }
    Ok(())
}

/// Racy without `x` synchronized, correct with it, under every upload mode.
#[test]
fn the_flight_decoder_is_no_synchronization_with_a_blocking_stream() {
    let mut all = Vec::new();
    for (racy, sync_x) in [(true, false), (false, true)] {
        for mode in Upload::ALL {
            all.extend(
                lies(racy, |schedule, seed| {
                    let (sim, ctx) = one(schedule, seed);
                    mode.set_up(&sim, &ctx);
                    let r = decode_beside_a_blocking_stream(&ctx, sync_x);
                    (sim, r)
                })
                .into_iter()
                .map(|l| format!("racy={racy} {mode:?} {l}")),
            );
        }
    }
    assert!(
        all.is_empty(),
        "{} runs differ:\n{}",
        all.len(),
        all.join("\n")
    );
}
