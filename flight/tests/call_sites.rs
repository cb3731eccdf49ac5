//! Race reports name the user's call of the Flight layer, whose copies run on tokio's
//! blocking threads: `FlightDeviceClient::do_put` at a line of this file (captured where
//! the user calls it: an `async fn` cannot track its caller), not
//! `DeviceRecordBatch::to_host_slice` at a line of `flight/src/`; a server's copies,
//! which no call of the user's makes, are named as the request they answer.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use arrow::array::{Int32Array, RecordBatch};
use arrow_flight::FlightDescriptor;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
use cudabuf_test_support::{assert_internal_free, logged, non_blocking};
use futures::TryStreamExt;

fn host_batch() -> RecordBatch {
    RecordBatch::try_from_iter([(
        "x",
        Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>())) as _,
    )])
    .unwrap()
}

/// A server on a loopback port for `body`, stopped after it.
async fn serving<F, Fut>(server: DeviceFlightServer, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        server
            .serve(listener, None, async {
                stopped.await.ok();
            })
            .await
    });
    body(url).await;
    stop.send(()).ok();
    serving.await.unwrap().unwrap();
}

/// `do_put` of a batch still being uploaded on the user's non-blocking stream: its
/// download (on a blocking thread) races, reported as the user's `do_put`.
#[test]
fn a_do_puts_downloads_name_the_users_call() {
    let (sim, ctx) = logged();
    let stream = non_blocking(&ctx);
    let batch = DeviceRecordBatch::from_host_on(&host_batch(), &stream).unwrap();
    let server = DeviceFlightServer::new(&ctx);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let line = Arc::new(AtomicU32::new(0));
    let at = line.clone();
    runtime.block_on(serving(server, |url| async move {
        let mut client = FlightDeviceClient::connect(&url, None).await.unwrap();
        let descriptor = FlightDescriptor::new_path(vec!["put".into()]);
        at.store(line!() + 1, Ordering::Relaxed);
        let put = client.do_put(descriptor, host_batch().schema(), vec![batch]);
        put.await.unwrap();
    }));
    let text = sim.race_report().to_string();
    let line = line.load(Ordering::Relaxed);
    let wanted = format!("`FlightDeviceClient::do_put` at {}:{line}:", file!());
    assert!(
        text.contains(&wanted),
        "the report should say {wanted:?}:\n{text}"
    );
    assert_internal_free(&text);
    stream.synchronize().unwrap();
}

/// A server's download for a `DoGet` of a batch the user inserted while its upload is
/// still in flight: named as the request it answers.
#[test]
fn a_servers_downloads_name_the_request() {
    let (sim, ctx) = logged();
    let stream = non_blocking(&ctx);
    let batch = DeviceRecordBatch::from_host_on(&host_batch(), &stream).unwrap();
    let server = DeviceFlightServer::new(&ctx);
    server
        .insert(b"numbers".to_vec(), host_batch().schema(), vec![batch])
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client_ctx = ctx.clone();
    runtime.block_on(serving(server, |url| async move {
        let mut client = FlightDeviceClient::connect(&url, None).await.unwrap();
        let got = client.do_get("numbers", &client_ctx).await.unwrap();
        let _: Vec<DeviceRecordBatch> = got.try_collect().await.unwrap();
    }));
    let text = sim.race_report().to_string();
    assert!(
        text.contains("a DeviceFlightServer answering DoGet"),
        "the report should name the request:\n{text}"
    );
    assert_internal_free(&text);
    stream.synchronize().unwrap();
}

/// `do_get` into a context whose staging pool is warm: the decoder's uploads of the
/// answer run on tokio's blocking threads (a current-thread runtime: no other thread of
/// it touches the client's simulator; the server's context is of a simulator of its
/// own), each followed by an event record. A copy made there, inside the decoder's
/// upload (the record hook's read of a buffer a non-blocking stream is still
/// rewriting), is reported as the user's `do_get`: the decoder's copies go into memory
/// of its own, which nothing of the user's can race with, so the hook's read stands for
/// them on their thread.
#[test]
fn a_do_gets_uploads_name_the_users_call() {
    let (_, server_ctx) = logged();
    let server_batch = DeviceRecordBatch::from_host(&host_batch(), &server_ctx).unwrap();
    let server = DeviceFlightServer::new(&server_ctx);
    server
        .insert(
            b"numbers".to_vec(),
            host_batch().schema(),
            vec![server_batch],
        )
        .unwrap();

    let (sim, ctx) = logged();
    ctx.set_staging_pool_limit(64 << 20);
    ctx.pin_staging_in_background(64 << 10, 64 << 10, 4);
    ctx.wait_background_pinning();
    let target = ctx.buffer_from_data(&[7u8; 4096][..]).unwrap();
    let stream = non_blocking(&ctx);
    stream
        .copy_from_slice(&target, &target.to_vec().unwrap())
        .unwrap();
    let fired = Arc::new(AtomicBool::new(false));
    let flag = fired.clone();
    sim.set_record_hook(Some(Arc::new(move |_| {
        let blocking = std::thread::current().name() == Some(BLOCKING_THREAD);
        if blocking && !flag.swap(true, Ordering::SeqCst) {
            // Logged, not failed: the read goes ahead.
            let _ = target.to_vec();
        }
    })));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(BLOCKING_THREAD)
        .build()
        .unwrap();
    let line = Arc::new(AtomicU32::new(0));
    let at = line.clone();
    let client_ctx = ctx.clone();
    runtime.block_on(serving(server, |url| async move {
        let mut client = FlightDeviceClient::connect(&url, None).await.unwrap();
        at.store(line!() + 1, Ordering::Relaxed);
        let got = client.do_get("numbers", &client_ctx);
        let got = got.await.unwrap();
        let batches: Vec<DeviceRecordBatch> = got.try_collect().await.unwrap();
        assert_eq!(batches[0].to_host().unwrap(), host_batch());
    }));
    sim.set_record_hook(None);
    assert!(fired.load(Ordering::SeqCst), "no blocking thread recorded");
    let text = sim.race_report().to_string();
    let line = line.load(Ordering::Relaxed);
    let wanted = format!("`FlightDeviceClient::do_get` at {}:{line}:", file!());
    assert!(
        text.contains(&wanted),
        "the report should say {wanted:?}:\n{text}"
    );
    assert_internal_free(&text);
    stream.synchronize().unwrap();
}

/// The name of the test runtimes' blocking threads.
const BLOCKING_THREAD: &str = "call-sites-blocking";
