//! Flight from device memory to device memory on the simulator, server and client in one
//! program: `cargo run -p cudabuf-flight --example flight_to_device`.
//!
//! A `DeviceFlightServer` on one context serves batches of two int64 columns from device
//! memory; a `FlightDeviceClient` on another context `DoGet`s them into its device memory;
//! the sums of the columns, read back with `to_host`, must equal the originals'; then the
//! client `DoPut`s what it received back to the server, which keeps it on its device, and
//! the sums are checked once more. Prints each step.

use std::sync::Arc;

use cudabuf_arrow::arrow::array::{AsArray, Int64Array, RecordBatch};
use cudabuf_arrow::arrow::datatypes::Int64Type;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_flight::arrow_flight::FlightDescriptor;
use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
use futures::TryStreamExt;

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn batch(start: i64, rows: i64) -> AnyResult<RecordBatch> {
    let ids: Int64Array = (start..start + rows).collect();
    let squares: Int64Array = (start..start + rows).map(|i| i * i).collect();
    Ok(RecordBatch::try_from_iter([
        ("id", Arc::new(ids) as _),
        ("square", Arc::new(squares) as _),
    ])?)
}

/// The wrapping sum of every int64 value of the batches, column by column.
fn checksum(batches: &[RecordBatch]) -> Vec<i64> {
    let columns = batches.first().map_or(0, |b| b.num_columns());
    (0..columns)
        .map(|c| {
            batches
                .iter()
                .flat_map(|b| b.column(c).as_primitive::<Int64Type>().values().iter())
                .fold(0i64, |sum, v| sum.wrapping_add(*v))
        })
        .collect()
}

/// The checksum of device batches, read back to the host.
fn device_checksum(batches: &[DeviceRecordBatch]) -> AnyResult<Vec<i64>> {
    let host = batches
        .iter()
        .map(|b| b.to_host())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(checksum(&host))
}

fn main() -> AnyResult<()> {
    // The simulator has two devices: device 0 is the server's, device 1 the client's.
    let backend = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new());
    let server_ctx = backend.context(0)?;
    let client_ctx = backend.context(1)?;

    let original = vec![
        batch(0, 100_000)?,
        batch(100_000, 50_000)?,
        batch(150_000, 7)?,
    ];
    let schema = original[0].schema();
    let expected = checksum(&original);
    let on_server = original
        .iter()
        .map(|b| DeviceRecordBatch::from_host(b, &server_ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let server = DeviceFlightServer::new(&server_ctx);
    server.insert("squares", schema.clone(), on_server)?;
    println!(
        "served {} batches ({} rows) from device 0: {} device bytes, checksum {expected:?}",
        original.len(),
        original.iter().map(|b| b.num_rows()).sum::<usize>(),
        server_ctx.bytes_allocated()
    );

    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn({
            let server = server.clone();
            async move {
                server
                    .serve(listener, None, async {
                        stopped.await.ok();
                    })
                    .await
            }
        });

        let mut client = FlightDeviceClient::connect(&url, None).await?;
        let received: Vec<DeviceRecordBatch> = client
            .do_get(&b"squares"[..], &client_ctx)
            .await?
            .try_collect()
            .await?;
        let got = device_checksum(&received)?;
        println!(
            "DoGet {url} squares: {} batches on device 1 ({} device bytes), checksum {got:?}",
            received.len(),
            client_ctx.bytes_allocated()
        );
        if got != expected {
            return Err(format!("DoGet's checksum {got:?} differs from {expected:?}").into());
        }

        let descriptor = FlightDescriptor::new_path(vec!["returned".into()]);
        client.do_put(descriptor, schema, received).await?;
        let kept = server
            .get(b"returned")
            .ok_or("the server kept no flight `returned`")?;
        let back = device_checksum(&kept.batches)?;
        println!(
            "DoPut returned: the server keeps {} batches on device 0, checksum {back:?}",
            kept.batches.len()
        );
        if back != expected {
            return Err(format!("DoPut's checksum {back:?} differs from {expected:?}").into());
        }

        stop.send(()).ok();
        serving.await??;
        AnyResult::Ok(())
    })?;
    println!("checksums match both ways");
    Ok(())
}
