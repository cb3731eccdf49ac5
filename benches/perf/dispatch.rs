//! `dispatch`: the cost of calling the backend through `Arc<dyn RawContext>` and
//! cudabuf's API against calling its concrete type.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use cudabuf::backend;
use cudabuf::{Backend, Context};

use crate::backend_under_test::Bench;
use crate::options::Options;
use crate::report::Records;
use crate::timing::time_batched;
use crate::AnyResult;

/// The same calls on a concrete backend type (monomorphized) and through `dyn`.
fn dispatch_calls<C: backend::RawContext + ?Sized>(
    c: &C,
    dev: u64,
    rec: &mut Records,
    how: &str,
) -> AnyResult<()> {
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(200),
        || {
            black_box(black_box(c).device_ordinal());
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("device_ordinal_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            black_box(black_box(c).address_range(dev)?);
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("address_range_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    let data = [7u8; 8];
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            // SAFETY: `dev` is a live allocation of at least 8 bytes of this context
            // (made by the caller and alive for the call).
            unsafe { black_box(c).copy_host_to_device(dev, &data)? };
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        format!("h2d_8B_{how}"),
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    Ok(())
}

pub(crate) fn dispatch(
    bench: &Bench,
    _backend: &Backend,
    ctx: &Context,
    _opts: &Options,
    rec: &mut Records,
) -> AnyResult<()> {
    let buf = ctx.new_buffer(4096)?;
    let dev = buf.address();
    let dyn_ctx: Arc<dyn backend::RawContext> = ctx.raw().clone();
    match bench {
        Bench::Sim(sim) => {
            let direct = sim.sim_device(0)?.sim_context();
            dispatch_calls(direct.as_ref(), dev, rec, "direct")?;
        }
        #[cfg(feature = "cuda")]
        Bench::Cuda(cuda) => {
            let direct = cuda.cuda_device(0)?.primary_driver_context()?;
            dispatch_calls(direct.as_ref(), dev, rec, "direct")?;
        }
    }
    dispatch_calls(dyn_ctx.as_ref(), dev, rec, "dyn")?;
    // The full API: bounds checks, the context's Arc, then the dyn call.
    let data = [7u8; 8];
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(300),
        || {
            black_box(&buf).copy_from_host(&data, 0, None)?;
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        "h2d_8B_api",
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}; DeviceBuffer::copy_from_host"),
    );
    let (t, n, batch) = time_batched(
        Duration::from_millis(2),
        21,
        Duration::from_millis(200),
        || {
            black_box(black_box(ctx).device_number());
            Ok(())
        },
    )?;
    rec.push(
        "dispatch",
        "device_number_api",
        None,
        t * 1e9,
        "ns",
        n,
        format!("batch {batch}"),
    );
    Ok(())
}
