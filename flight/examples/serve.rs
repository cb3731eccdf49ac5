//! A cudabuf Flight server, for interop tests and trying things out:
//! `cargo run -p cudabuf-flight --example serve -- [--port N] [--token T]`, on the
//! simulator, or on a GPU with `CUDABUF_BACKEND=cuda` (built with `--features cudabuf/cuda`).
//!
//! Serves two flights from device memory: `numbers` (two batches: `id` int64, `score`
//! float64 with nulls, `name` utf8) and `empty` (its schema, no batches); `DoPut` adds
//! more, and `DoExchange` answers with the batches it was sent (landed on the device). Prints `PORT <n>` once listening (port 0, the default, picks a free one) and
//! serves on 127.0.0.1 until its standard input closes.

use std::io::{BufRead, Write};
use std::sync::Arc;

use cudabuf_arrow::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_flight::DeviceFlightServer;

fn numbers(start: i64, rows: i64) -> RecordBatch {
    let ids: Vec<i64> = (start..start + rows).collect();
    let scores: Vec<Option<f64>> = ids
        .iter()
        .map(|&i| (i % 7 != 0).then_some(i as f64 * 0.5))
        .collect();
    let names: Vec<String> = ids.iter().map(|i| format!("row-{i}")).collect();
    RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids)) as _),
        ("score", Arc::new(Float64Array::from(scores)) as _),
        ("name", Arc::new(StringArray::from(names)) as _),
    ])
    .expect("a valid batch")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut port = 0u16;
    let mut token = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--port" => port = args.next().ok_or("--port needs a value")?.parse()?,
            "--token" => token = Some(args.next().ok_or("--token needs a value")?),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    // The simulator unless CUDABUF_BACKEND=cuda (built with `--features cudabuf/cuda`).
    let ctx = cudabuf::backend_from_env()?.context(0)?;
    let server = DeviceFlightServer::new(&ctx);
    let batches = [numbers(0, 1000), numbers(1000, 24)];
    let schema = batches[0].schema();
    let on_device = batches
        .iter()
        .map(|b| DeviceRecordBatch::from_host(b, &ctx))
        .collect::<Result<Vec<_>, _>>()?;
    server.insert("numbers", schema.clone(), on_device)?;
    server.insert("empty", schema, vec![])?;

    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        println!("PORT {}", listener.local_addr()?.port());
        std::io::stdout().flush()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            // Serve until standard input closes (the parent went away or closed it).
            for line in std::io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
            }
            stop.send(()).ok();
        });
        server
            .serve(listener, token.as_deref(), async {
                stopped.await.ok();
            })
            .await?;
        Ok(())
    })
}
