//! cudabuf-flight against peers that misbehave, on the simulator over loopback:
//!
//! - at the socket level, through a TCP proxy that cuts a connection after any number of
//!   bytes in either direction, or stalls it (client: typed errors, never a hang, whole
//!   batches before the cut; server: nothing leaked, other clients served, a stalled
//!   client dropped by the idle timeout or the HTTP/2 keepalive);
//! - message by message (what `tests/flight.rs` does not cover: a schema changed
//!   mid-stream, huge declared sizes, compressed lengths that lie, a dictionary batch
//!   before the schema, garbage `app_metadata`);
//! - a property test that mutates real encoded streams (bit flips, truncations, length
//!   fields, dropped and repeated messages): typed errors or the batches arrow-rs reads
//!   from the same bytes, never a panic, nothing left allocated.
//!
//! Every network wait is bounded.

mod common;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use bytes::Bytes;
use cudabuf_arrow::arrow::array::{ArrayRef, DictionaryArray, Int64Array, RecordBatch};
use cudabuf_arrow::arrow::datatypes::{Int32Type, Schema};
use cudabuf_arrow::arrow::ipc::writer::IpcWriteOptions;
use cudabuf_arrow::arrow::ipc::{self, CompressionType, MessageHeader};
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::{Context, ErrorKind};
use cudabuf_flight::{
    DeviceBatchStream, DeviceFlightDecoder, DeviceFlightServer, FlightDeviceClient, FlightError,
    Result, ServerLimits,
};
use futures::{stream, StreamExt, TryStreamExt};
use proptest::prelude::*;

use common::{
    assert_clean, bounded, eventually, new_sim, numbers, put_messages, upload, Dir, Fault, Proxy,
    Serving,
};

/// How long the tests' clients and servers wait for a silent peer.
const SHORT: Duration = Duration::from_millis(300);

/// The batches the socket-level tests `DoGet`.
fn flight_batches() -> Vec<RecordBatch> {
    vec![numbers(1, 40), numbers(2, 7), numbers(3, 60)]
}

/// What a `DoGet` through `url` gave: its items in order (an error ends them), or the
/// error of the call or of the connection as the only item.
async fn do_get_items(
    url: &str,
    ctx: &Context,
    timeouts: Option<Duration>,
) -> Vec<Result<DeviceRecordBatch>> {
    let client = match FlightDeviceClient::connect(url, None).await {
        Ok(client) => client,
        Err(e) => return vec![Err(e)],
    };
    let mut client = match timeouts {
        Some(t) => client.with_timeout(Some(t)).with_idle_timeout(Some(t)),
        None => client,
    };
    match client.do_get("t", ctx).await {
        Ok(stream) => stream.collect().await,
        Err(e) => vec![Err(e)],
    }
}

/// `items` are whole batches equal to the first of `expected`, then at most one error,
/// which `typed` accepts; without an error, every batch came. Returns the error.
fn check_prefix<'a>(
    items: &'a [Result<DeviceRecordBatch>],
    expected: &[RecordBatch],
    what: &str,
    typed: impl Fn(&FlightError) -> bool,
) -> Option<&'a FlightError> {
    let ok = items.iter().take_while(|i| i.is_ok()).count();
    assert!(ok <= expected.len(), "{what}: {ok} batches");
    for (i, item) in items[..ok].iter().enumerate() {
        let batch = item.as_ref().unwrap().to_host().unwrap();
        assert_eq!(batch, expected[i], "{what}: batch {i} is not whole");
    }
    match &items[ok..] {
        [] => {
            assert_eq!(
                ok,
                expected.len(),
                "{what}: the stream ended early, no error"
            );
            None
        }
        [Err(e)] => {
            assert!(typed(e), "{what}: {e:?}");
            Some(e)
        }
        rest => panic!("{what}: {} items after the first error", rest.len()),
    }
}

/// The byte counts at which to cut or stall a stream of `total` bytes: every byte of the
/// first 160 (the HTTP/2 preface, settings and headers), then every `step`-th, and the
/// last few.
fn sweep(total: usize, step: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (0..total.min(160)).collect();
    at.extend((160..total).step_by(step));
    at.extend(total.saturating_sub(4)..=total);
    at.sort_unstable();
    at.dedup();
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_get_cut_anywhere_is_a_typed_error_after_whole_batches() {
    let (server_sim, server_ctx) = new_sim();
    let (sim, ctx) = new_sim();
    let expected = flight_batches();
    let server = DeviceFlightServer::new(&server_ctx);
    server
        .insert("t", expected[0].schema(), upload(&expected, &server_ctx))
        .unwrap();
    let serving = Serving::start(server.clone(), None).await;
    let held = server_ctx.bytes_allocated();

    // The whole exchange, measured through a proxy that forwards everything.
    let pass = Proxy::start(serving.addr, Fault::Pass).await;
    let items = bounded(do_get_items(&pass.url, &ctx, None)).await;
    assert!(check_prefix(&items, &expected, "pass", |_| false).is_none());
    drop(items);
    let (up, down) = pass.forwarded();
    drop(pass);
    assert!(up > 100 && down > 1000, "{up} up, {down} down");

    // Eight cuts at a time, each client on a simulator of its own, whose reports must be
    // clean once the case is over.
    let started = Instant::now();
    let cuts: Vec<(Dir, usize, usize)> = [(Dir::Up, up, 5), (Dir::Down, down, 19)]
        .into_iter()
        .flat_map(|(dir, total, step)| sweep(total, step).into_iter().map(move |n| (dir, n, total)))
        .collect();
    let outcomes: Vec<(bool, bool)> = stream::iter(cuts.iter().copied())
        .map(|(dir, n, total)| {
            let (addr, expected) = (serving.addr, &expected);
            async move {
                let (sim, ctx) = new_sim();
                let proxy = Proxy::start(addr, Fault::Cut(dir, n)).await;
                let items = do_get_items(&proxy.url, &ctx, None).await;
                let what = format!("cut {dir:?} after {n} of {total} bytes");
                // A cut is seen at once: a status or a failed connection, never a timeout.
                let err = check_prefix(&items, expected, &what, |e| {
                    matches!(e, FlightError::Status(_) | FlightError::Transport(_))
                });
                let outcome = (err.is_some(), err.is_some() && items.len() > 1);
                drop(items);
                assert_eq!(ctx.bytes_allocated(), 0, "{what}: left allocated");
                assert_clean(sim, ctx);
                outcome
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let cases = outcomes.len();
    let errors = outcomes.iter().filter(|o| o.0).count();
    let partial = outcomes.iter().filter(|o| o.1).count();
    eprintln!(
        "{cases} cuts ({up} bytes up, {down} down): {errors} errors, {partial} after some \
         batches, in {:?}",
        started.elapsed()
    );
    assert!(errors > cases / 2, "{errors} errors in {cases} cuts");
    assert!(partial > 0, "no cut fell between batches");

    // The server serves on, holding what it held.
    let items = bounded(do_get_items(&serving.url, &ctx, None)).await;
    assert!(check_prefix(&items, &expected, "after the cuts", |_| false).is_none());
    drop(items);
    assert_eq!(server_ctx.bytes_allocated(), held);
    serving.stop().await;
    drop(server);
    assert_eq!(server_ctx.bytes_allocated(), 0);
    assert_clean(server_sim, server_ctx);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_ends_the_do_get_with_a_timeout() {
    let (server_sim, server_ctx) = new_sim();
    let (sim, ctx) = new_sim();
    let expected = flight_batches();
    let server = DeviceFlightServer::new(&server_ctx);
    server
        .insert("t", expected[0].schema(), upload(&expected, &server_ctx))
        .unwrap();
    let serving = Serving::start(server.clone(), None).await;
    let pass = Proxy::start(serving.addr, Fault::Pass).await;
    drop(bounded(do_get_items(&pass.url, &ctx, None)).await);
    let (up, down) = pass.forwarded();
    drop(pass);

    let mut timeouts = 0;
    let points = [
        (Dir::Up, 0),
        (Dir::Up, 40),
        (Dir::Up, up / 2),
        (Dir::Down, 0),
        (Dir::Down, 30),
        (Dir::Down, down / 3),
        (Dir::Down, down * 2 / 3),
        // Near the end of the response, with room for the few bytes by which one
        // exchange's count differs from the next one's.
        (Dir::Down, down - 80),
    ];
    for (dir, n) in points {
        let proxy = Proxy::start(serving.addr, Fault::Stall(dir, n)).await;
        let start = Instant::now();
        // Bounded well below the test's own limit: the client's timeouts end the call.
        let items = tokio::time::timeout(
            Duration::from_secs(10),
            do_get_items(&proxy.url, &ctx, Some(SHORT)),
        )
        .await
        .unwrap_or_else(|_| panic!("stall {dir:?} after {n}: the client hung"));
        let what = format!("stall {dir:?} after {n} of {up}/{down} bytes");
        let err = check_prefix(
            &items,
            &expected,
            &what,
            |e| matches!(e, FlightError::Timeout { after, .. } if *after == SHORT),
        );
        assert!(err.is_some(), "{what}: completed");
        assert!(proxy.struck() > 0, "{what}: the proxy never stalled");
        timeouts += 1;
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{what}: {:?}",
            start.elapsed()
        );
        drop(items);
        drop(proxy);
        assert_eq!(ctx.bytes_allocated(), 0, "{what}: left allocated");
    }
    assert_eq!(timeouts, points.len());
    serving.stop().await;
    drop(server);
    assert_clean(server_sim, server_ctx);
    assert_clean(sim, ctx);
}

/// A raw `DoPut` of `messages` through `url`: the server's answer, or the error.
async fn raw_put(url: String, messages: Vec<FlightData>) -> std::result::Result<(), tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = FlightServiceClient::new(channel);
    client
        .do_put(stream::iter(messages))
        .await?
        .into_inner()
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_put_cut_anywhere_leaks_nothing_and_the_server_serves_on() {
    let (sim, ctx) = new_sim();
    let expected = flight_batches();
    let server = DeviceFlightServer::new(&ctx);
    server
        .insert("t", expected[0].schema(), upload(&expected, &ctx))
        .unwrap();
    let (serving, activity) = Serving::start_counted(server.clone()).await;
    let held = ctx.bytes_allocated();
    let put = [numbers(10, 50), numbers(11, 30)];
    let messages = put_messages("put", &put).await;

    let pass = Proxy::start(serving.addr, Fault::Pass).await;
    bounded(raw_put(pass.url.clone(), messages.clone()))
        .await
        .unwrap();
    let stored = server.remove(b"put").expect("stored");
    assert_eq!(
        stored
            .batches
            .iter()
            .map(|b| b.to_host().unwrap())
            .collect::<Vec<_>>(),
        put
    );
    drop(stored);
    let (up, down) = pass.forwarded();
    drop(pass);

    let started = Instant::now();
    let (mut cases, mut kept) = (0, 0);
    for (dir, total, step) in [(Dir::Up, up, 23), (Dir::Down, down, 3)] {
        for n in sweep(total, step) {
            let what = format!("DoPut cut {dir:?} after {n} of {total} bytes");
            let proxy = Proxy::start(serving.addr, Fault::Cut(dir, n)).await;
            let answer = bounded(raw_put(proxy.url.clone(), messages.clone())).await;
            // The server sees the cut on its own time: wait until it has closed the
            // connection and ended the call.
            eventually(&what, Duration::from_secs(10), || activity.settled()).await;
            if let Some(flight) = server.remove(b"put") {
                let got: Vec<_> = flight
                    .batches
                    .iter()
                    .map(|b| b.to_host().unwrap())
                    .collect();
                assert_eq!(got, put, "{what}: stored, but not whole");
                kept += 1;
            } else {
                assert!(answer.is_err(), "{what}: answered Ok, stored nothing");
            }
            // A call's decoder is dropped on a blocking thread (it may wait for uploads),
            // a moment after the call has ended.
            eventually(
                &format!("{what}: left allocated"),
                Duration::from_secs(10),
                || ctx.bytes_allocated() == held,
            )
            .await;
            cases += 1;
        }
    }
    eprintln!(
        "{cases} DoPut cuts ({up} bytes up, {down} down): {kept} stored whole, the rest \
         dropped, in {:?}",
        started.elapsed()
    );
    assert!(kept < cases / 2, "{kept} of {cases} stored");

    // Still serving, holding what it held.
    let items = bounded(do_get_items(&serving.url, &ctx, None)).await;
    assert!(check_prefix(&items, &expected, "after the cuts", |_| false).is_none());
    drop(items);
    assert_eq!(server.keys(), vec![b"t".to_vec()]);
    serving.stop().await;
    drop(server);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

/// The bytes of `messages`' headers and bodies (what they take on the wire, less a few
/// bytes of framing each).
fn wire_len(messages: &[FlightData]) -> usize {
    messages
        .iter()
        .map(|m| m.data_header.len() + m.data_body.len())
        .sum()
}

/// Several clients `DoGet` the flight `t` from `url` while something else stalls.
async fn others_are_served(url: &str, ctx: &Context, expected: &[RecordBatch]) {
    let gets = (0..4).map(|_| async {
        let items = do_get_items(url, ctx, None).await;
        assert!(check_prefix(&items, expected, "another client", |_| false).is_none());
    });
    bounded(futures::future::join_all(gets)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_do_put_is_dropped_by_the_idle_timeout_while_others_are_served() {
    let (sim, ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let expected = flight_batches();
    let mut limits = ServerLimits::default();
    limits.idle_timeout = Some(SHORT * 2);
    limits.http2_keepalive_interval = None;
    let server = DeviceFlightServer::new(&ctx).with_limits(limits);
    server
        .insert("t", expected[0].schema(), upload(&expected, &ctx))
        .unwrap();
    let serving = Serving::start(server.clone(), None).await;
    let held = ctx.bytes_allocated();
    // A small batch, then a large one: a stall half way through the stream falls in the
    // large one, the small one landed.
    let put = [numbers(20, 50), numbers(21, 5000)];
    let messages = put_messages("put", &put).await;

    // A client that sends the schema and a batch, then nothing (its connection alive):
    // the server holds the batch until the idle timeout, then answers DeadlineExceeded.
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let silent = stream::iter(messages[..2].to_vec()).chain(stream::pending());
    let stalled =
        tokio::spawn(async move { FlightServiceClient::new(channel).do_put(silent).await });
    eventually("the stalled DoPut's batch", Duration::from_secs(10), || {
        ctx.bytes_allocated() > held
    })
    .await;
    others_are_served(&serving.url, &client_ctx, &expected).await;
    let answer = bounded(stalled).await.unwrap();
    assert_eq!(
        answer.unwrap_err().code(),
        tonic::Code::DeadlineExceeded,
        "the stalled DoPut's answer"
    );
    assert_eq!(ctx.bytes_allocated(), held);

    // A connection that goes dark mid-batch (the proxy forwards nothing more either
    // way): the server drops the call after the idle timeout all the same.
    let mid = (wire_len(&messages[..2]) + wire_len(&messages)) / 2;
    let proxy = Proxy::start(serving.addr, Fault::Stall(Dir::Up, mid)).await;
    let dark = tokio::spawn(raw_put(proxy.url.clone(), messages.clone()));
    eventually("the stall, a batch held", Duration::from_secs(10), || {
        proxy.struck() > 0 && ctx.bytes_allocated() > held
    })
    .await;
    others_are_served(&serving.url, &client_ctx, &expected).await;
    eventually(
        "the dark DoPut freed by the idle timeout",
        Duration::from_secs(10),
        || ctx.bytes_allocated() == held,
    )
    .await;
    assert!(server.get(b"put").is_none());
    dark.abort();
    drop(proxy);

    serving.stop().await;
    drop(server);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http2_keepalive_drops_a_connection_gone_dark() {
    let (sim, ctx) = new_sim();
    // No idle timeout: only the keepalive can free what the stalled call holds.
    let mut limits = ServerLimits::default();
    limits.idle_timeout = None;
    limits.http2_keepalive_interval = Some(Duration::from_millis(200));
    limits.http2_keepalive_timeout = Duration::from_millis(200);
    let server = DeviceFlightServer::new(&ctx).with_limits(limits);
    let serving = Serving::start(server.clone(), None).await;
    let put = [numbers(30, 50), numbers(31, 5000)];
    let messages = put_messages("put", &put).await;
    let mid = (wire_len(&messages[..2]) + wire_len(&messages)) / 2;
    let proxy = Proxy::start(serving.addr, Fault::Stall(Dir::Up, mid)).await;
    let dark = tokio::spawn(raw_put(proxy.url.clone(), messages));
    eventually("the stalled DoPut's batch", Duration::from_secs(10), || {
        proxy.struck() > 0 && ctx.bytes_allocated() > 0
    })
    .await;
    let start = Instant::now();
    eventually(
        "the keepalive's disconnection",
        Duration::from_secs(10),
        || ctx.bytes_allocated() == 0,
    )
    .await;
    eprintln!("freed {:?} after the stall", start.elapsed());
    assert!(server.keys().is_empty());
    dark.abort();
    drop(proxy);
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_streams_bounds_the_calls_of_one_connection() {
    let (sim, ctx) = new_sim();
    let mut limits = ServerLimits::default();
    limits.idle_timeout = Some(Duration::from_millis(800));
    limits.max_concurrent_streams = Some(2);
    let server = DeviceFlightServer::new(&ctx).with_limits(limits);
    let serving = Serving::start(server.clone(), None).await;
    let batch = numbers(40, 1000);
    let messages = put_messages("put", std::slice::from_ref(&batch)).await;
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    // One call first, so that the client has the server's settings.
    let err = bounded(
        FlightServiceClient::new(channel.clone())
            .get_flight_info(FlightDescriptor::new_path(vec!["none".into()])),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // What one stalled DoPut holds: its batch, decoded and waiting for the next message.
    let one = {
        let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
        assert!(decoder.push(&messages[0]).unwrap().is_none());
        assert!(decoder.push(&messages[1]).unwrap().is_none());
        ctx.bytes_allocated()
    };
    assert!(one >= 8000, "{one} bytes");
    assert_eq!(ctx.bytes_allocated(), 0);

    // Three stalled DoPuts on the connection: two are served (each holds its batch on
    // the device), the third waits for a free stream.
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let silent = stream::iter(messages[..2].to_vec()).chain(stream::pending());
            let channel = channel.clone();
            tokio::spawn(async move { FlightServiceClient::new(channel).do_put(silent).await })
        })
        .collect();
    eventually("two stalled DoPuts", Duration::from_secs(10), || {
        ctx.bytes_allocated() == 2 * one
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ctx.bytes_allocated(), 2 * one, "a third call was admitted");
    // Each times out in turn, the third once a stream is free.
    for call in calls {
        let answer = bounded(call).await.unwrap();
        assert_eq!(answer.unwrap_err().code(), tonic::Code::DeadlineExceeded);
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
}

// ---- Message by message ---------------------------------------------------------------

/// The messages of `batches` as arrow-rs's encoder sends them (schema first).
async fn encoded(batches: &[RecordBatch], options: IpcWriteOptions) -> Vec<FlightData> {
    // The encoder's stream is 'static: it takes the batches by value.
    let owned = batches.to_vec();
    FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_dictionary_handling(DictionaryHandling::Resend)
        .build(stream::iter(owned.into_iter().map(Ok)))
        .try_collect()
        .await
        .expect("encodes")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Every error from an untrusted stream is one of these (never a status, a transport
/// error or a timeout, which come from the network).
fn decode_typed(e: &FlightError) -> bool {
    match e {
        FlightError::InvalidData(_)
        | FlightError::TooLarge { .. }
        | FlightError::Unsupported(_) => true,
        FlightError::Device(e) => matches!(
            e.kind(),
            ErrorKind::InvalidData | ErrorKind::OutOfRange | ErrorKind::InvalidArgument
        ),
        _ => false,
    }
}

/// Push `messages` into a fresh decoder: the batches, and the first error.
fn decode(
    ctx: &Context,
    messages: &[FlightData],
    decoder: impl FnOnce(DeviceFlightDecoder) -> DeviceFlightDecoder,
) -> (Vec<DeviceRecordBatch>, Option<FlightError>) {
    let mut decoder = decoder(DeviceFlightDecoder::new(ctx).unwrap());
    let mut batches = Vec::new();
    for message in messages {
        match decoder.push(message) {
            Ok(batch) => batches.extend(batch),
            Err(e) => return (batches, Some(e)),
        }
    }
    match decoder.finish() {
        Ok(batch) => batches.extend(batch),
        Err(e) => return (batches, Some(e)),
    }
    (batches, None)
}

/// A little-endian `i64` field of `header` replaced: the occurrence of `from` whose
/// replacement makes `field` of the parsed message read `to`.
fn patch_i64(
    header: &[u8],
    from: i64,
    to: i64,
    field: impl Fn(ipc::Message<'_>) -> Option<i64>,
) -> Bytes {
    (0..header.len().saturating_sub(7))
        .filter(|&at| header[at..at + 8] == from.to_le_bytes())
        .map(|at| {
            let mut patched = header.to_vec();
            patched[at..at + 8].copy_from_slice(&to.to_le_bytes());
            patched
        })
        .find(|p| ipc::root_as_message(p).is_ok_and(|m| field(m) == Some(to)))
        .map(Bytes::from)
        .expect("the field's bytes")
}

fn buffers(header: &[u8]) -> Vec<(i64, i64)> {
    let message = ipc::root_as_message(header).unwrap();
    let batch = message.header_as_record_batch().unwrap();
    batch
        .buffers()
        .unwrap()
        .iter()
        .map(|b| (b.offset(), b.length()))
        .collect()
}

#[test]
fn a_schema_changed_mid_stream_is_invalid_after_the_batches_before_it() {
    let (sim, ctx) = new_sim();
    let rt = runtime();
    let first = [numbers(1, 10), numbers(2, 10)];
    let other =
        RecordBatch::try_from_iter([("other", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)])
            .unwrap();
    let mut messages = rt.block_on(encoded(&first, IpcWriteOptions::default()));
    messages.extend(rt.block_on(encoded(
        std::slice::from_ref(&other),
        IpcWriteOptions::default(),
    )));
    // schema A, batch, batch, schema B, batch of B
    assert_eq!(messages.len(), 5);
    let incoming = stream::iter(messages.into_iter().map(Ok)).boxed();
    let items: Vec<_> = rt.block_on(async {
        let stream = DeviceBatchStream::start(incoming, DeviceFlightDecoder::new(&ctx).unwrap())
            .await
            .unwrap();
        stream.collect().await
    });
    // The first batch came whole; the second was pending when schema B arrived.
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(items[0].as_ref().unwrap().to_host().unwrap(), first[0]);
    assert!(
        matches!(&items[1], Err(FlightError::InvalidData(m)) if m.contains("second schema")),
        "{:?}",
        items[1]
    );
    drop(items);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

#[test]
fn huge_declared_sizes_are_refused_before_anything_is_allocated() {
    let (sim, ctx) = new_sim();
    let rt = runtime();
    let batch = numbers(5, 100);
    let messages = rt.block_on(encoded(
        std::slice::from_ref(&batch),
        IpcWriteOptions::default(),
    ));
    let (schema, good) = (&messages[0], &messages[1]);
    let body_len = good.data_body.len() as i64;

    // A body length far beyond the body: refused before allocating it.
    for huge in [1i64 << 40, i64::MAX] {
        let mut lying = good.clone();
        lying.data_header = patch_i64(&good.data_header, body_len, huge, |m| Some(m.bodyLength()));
        let (batches, err) = decode(&ctx, &[schema.clone(), lying], |d| d);
        assert!(batches.is_empty());
        assert!(
            matches!(err, Some(FlightError::InvalidData(_))),
            "{huge}: {err:?}"
        );
        assert_eq!(ctx.bytes_allocated(), 0);
    }

    // A buffer whose offset or length is huge: refused against the body.
    let (offset, length) = *buffers(&good.data_header)
        .iter()
        .rfind(|(_, l)| *l > 0)
        .unwrap();
    for (from, to) in [(length, 1i64 << 62), (offset, i64::MAX - 8), (length, -8)] {
        let mut lying = good.clone();
        lying.data_header = patch_i64(&good.data_header, from, to, |m| {
            let b = m.header_as_record_batch()?.buffers()?;
            b.iter()
                .find(|b| b.offset() == to || b.length() == to)
                .map(|_| to)
        });
        let (batches, err) = decode(&ctx, &[schema.clone(), lying], |d| d);
        assert!(batches.is_empty());
        let err = err.expect("an error");
        assert!(
            matches!(&err, FlightError::Device(e) if e.kind() == ErrorKind::InvalidData)
                || matches!(err, FlightError::InvalidData(_)),
            "{from} -> {to}: {err:?}"
        );
        assert_eq!(ctx.bytes_allocated(), 0);
    }

    // Compressed buffers declaring more than their codec can produce from their bytes
    // (arrow-rs would allocate the declared length before decompressing: a terabyte
    // aborted the process), or more than the decompression limit.
    for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
        let options = IpcWriteOptions::default()
            .try_with_compression(Some(codec))
            .unwrap();
        let messages = rt.block_on(encoded(std::slice::from_ref(&batch), options));
        let (schema, good) = (&messages[0], &messages[1]);
        let (batches, err) = decode(&ctx, &messages, |d| d);
        assert!(err.is_none(), "{codec:?}: {err:?}");
        assert_eq!(batches[0].to_host().unwrap(), batch);
        drop(batches);
        let (offset, _) = *buffers(&good.data_header)
            .iter()
            .rfind(|(_, l)| *l >= 8)
            .unwrap();
        let at = offset as usize;
        for declared in [1i64 << 40, i64::MAX, -2] {
            let mut body = good.data_body.to_vec();
            body[at..at + 8].copy_from_slice(&declared.to_le_bytes());
            let mut lying = good.clone();
            lying.data_body = Bytes::from(body);
            let (batches, err) = decode(&ctx, &[schema.clone(), lying], |d| d);
            assert!(batches.is_empty());
            assert!(
                matches!(err, Some(FlightError::InvalidData(_))),
                "{codec:?} {declared}: {err:?}"
            );
        }
        let (batches, err) = decode(&ctx, &[schema.clone(), good.clone()], |d| {
            d.with_decompression_limit(1000)
        });
        assert!(batches.is_empty());
        assert!(
            matches!(err, Some(FlightError::TooLarge { limit: 1000, .. })),
            "{codec:?}: {err:?}"
        );
        assert_eq!(ctx.bytes_allocated(), 0);
    }
    assert_clean(sim, ctx);
}

#[test]
fn a_dictionary_batch_before_the_schema_is_invalid() {
    let (sim, ctx) = new_sim();
    let rt = runtime();
    let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let batch = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
    let messages = rt.block_on(encoded(
        std::slice::from_ref(&batch),
        IpcWriteOptions::default(),
    ));
    let dictionary = messages
        .iter()
        .find(|m| {
            ipc::root_as_message(&m.data_header)
                .is_ok_and(|m| m.header_type() == MessageHeader::DictionaryBatch)
        })
        .expect("a dictionary batch");
    let (batches, err) = decode(&ctx, std::slice::from_ref(dictionary), |d| d);
    assert!(batches.is_empty());
    assert!(
        matches!(&err, Some(FlightError::InvalidData(m)) if m.contains("before the schema")),
        "{err:?}"
    );
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

#[test]
fn garbage_app_metadata_is_ignored() {
    let (sim, ctx) = new_sim();
    let rt = runtime();
    let batches = [numbers(7, 30), numbers(8, 0), numbers(9, 3)];
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut garbage = |n: usize| -> Bytes {
        (0..n)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as u8
            })
            .collect::<Vec<u8>>()
            .into()
    };
    let mut messages = Vec::new();
    for mut message in rt.block_on(encoded(&batches, IpcWriteOptions::default())) {
        // Metadata on every message, and messages of metadata alone in between.
        message.app_metadata = garbage(100);
        messages.push(message);
        messages.push(FlightData::new().with_app_metadata(garbage(1000)));
    }
    let (got, err) = decode(&ctx, &messages, |d| d);
    assert!(err.is_none(), "{err:?}");
    let host: Vec<_> = got.iter().map(|b| b.to_host().unwrap()).collect();
    // arrow-rs's encoder sends no message for the batch of 0 rows.
    assert_eq!(host, vec![batches[0].clone(), batches[2].clone()]);
    drop(got);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

// ---- Mutated streams ------------------------------------------------------------------

/// One change to an encoded stream.
#[derive(Debug, Clone)]
enum Mutation {
    /// Flip bit `bit` of byte `at` (modulo the part's length) of message `message`'s
    /// header (`body == false`) or body.
    Flip {
        message: usize,
        body: bool,
        at: usize,
        bit: u8,
    },
    /// Cut the header or body of a message to `len` bytes (modulo its length).
    Truncate {
        message: usize,
        body: bool,
        len: usize,
    },
    /// Overwrite 4 or 8 bytes of a header at `at` (an offset or length field, where it
    /// lands on one) with `value`.
    Field {
        message: usize,
        at: usize,
        wide: bool,
        value: i64,
    },
    /// Drop a message.
    Drop { message: usize },
    /// Send a message twice.
    Repeat { message: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let value = prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(8),
        Just(i32::MAX as i64),
        Just(i64::MAX),
        Just(1 << 40),
        Just(-(1 << 40)),
        any::<i64>(),
    ];
    prop_oneof![
        4 => (0..8usize, any::<bool>(), any::<usize>(), 0..8u8)
            .prop_map(|(message, body, at, bit)| Mutation::Flip { message, body, at, bit }),
        2 => (0..8usize, any::<bool>(), any::<usize>())
            .prop_map(|(message, body, len)| Mutation::Truncate { message, body, len }),
        3 => (0..8usize, any::<usize>(), any::<bool>(), value)
            .prop_map(|(message, at, wide, value)| Mutation::Field { message, at, wide, value }),
        1 => (0..8usize).prop_map(|message| Mutation::Drop { message }),
        1 => (0..8usize).prop_map(|message| Mutation::Repeat { message }),
    ]
}

fn apply(messages: &mut Vec<FlightData>, m: &Mutation) {
    let n = messages.len();
    let part = |data: &mut FlightData, body: bool| -> Vec<u8> {
        if body {
            data.data_body.to_vec()
        } else {
            data.data_header.to_vec()
        }
    };
    let set = |data: &mut FlightData, body: bool, bytes: Vec<u8>| {
        if body {
            data.data_body = bytes.into();
        } else {
            data.data_header = bytes.into();
        }
    };
    match *m {
        Mutation::Flip {
            message,
            body,
            at,
            bit,
        } => {
            let data = &mut messages[message % n];
            let mut bytes = part(data, body);
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] ^= 1 << bit;
                set(data, body, bytes);
            }
        }
        Mutation::Truncate { message, body, len } => {
            let data = &mut messages[message % n];
            let mut bytes = part(data, body);
            if !bytes.is_empty() {
                bytes.truncate(len % bytes.len());
                set(data, body, bytes);
            }
        }
        Mutation::Field {
            message,
            at,
            wide,
            value,
        } => {
            let data = &mut messages[message % n];
            let mut bytes = data.data_header.to_vec();
            let width = if wide { 8 } else { 4 };
            if bytes.len() >= width {
                // Fields are aligned to their width.
                let at = (at % (bytes.len() - width + 1)) / width * width;
                bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
                data.data_header = bytes.into();
            }
        }
        Mutation::Drop { message } => {
            messages.remove(message % n);
        }
        Mutation::Repeat { message } => {
            let copy = messages[message % n].clone();
            messages.insert(message % n, copy);
        }
    }
}

/// The streams mutated: mixed types over three batches, plain, LZ4_FRAME and ZSTD.
fn streams() -> Vec<(Vec<RecordBatch>, Vec<FlightData>)> {
    let rt = runtime();
    let batches = vec![numbers(1, 20), numbers(2, 1), numbers(3, 9)];
    [
        None,
        Some(CompressionType::LZ4_FRAME),
        Some(CompressionType::ZSTD),
    ]
    .into_iter()
    .map(|codec| {
        let options = IpcWriteOptions::default()
            .try_with_compression(codec)
            .unwrap();
        (batches.clone(), rt.block_on(encoded(&batches, options)))
    })
    .collect()
}

/// What arrow-rs reads from `message` with `schema` (`None`: an error or a panic).
fn arrow_rs_reads(message: &FlightData, schema: &Arc<Schema>) -> Option<RecordBatch> {
    catch_unwind(AssertUnwindSafe(|| {
        arrow_flight::utils::flight_data_to_arrow_batch(message, schema.clone(), &HashMap::new())
    }))
    .ok()?
    .ok()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: None,
        max_shrink_iters: 1024,
        ..ProptestConfig::default()
    })]

    /// Mutated streams decode to typed errors or to the batches arrow-rs reads from the
    /// same bytes (the untouched ones to the originals), never panic, and leave nothing
    /// allocated.
    #[test]
    fn mutated_streams_are_typed_errors_or_correct_batches(
        which in 0..3usize,
        mutations in prop::collection::vec(mutation(), 0..4),
    ) {
        thread_local! {
            static STREAMS: Vec<(Vec<RecordBatch>, Vec<FlightData>)> = streams();
            static SIM: (cudabuf_sim::SimBackend, Context) = new_sim();
        }
        let (originals, mut messages) = STREAMS.with(|s| s[which].clone());
        let pristine = messages.clone();
        for m in &mutations {
            apply(&mut messages, m);
        }
        let ctx = SIM.with(|(_, ctx)| ctx.clone());
        let (batches, err) = decode(&ctx, &messages, |d| d.with_max_message_size(1 << 20));
        if let Some(e) = &err {
            prop_assert!(decode_typed(e), "untyped: {e:?}");
        }
        // Which message each batch came from: the record batches pushed, in order.
        let sources: Vec<&FlightData> = messages
            .iter()
            .filter(|m| {
                ipc::root_as_message(&m.data_header)
                    .is_ok_and(|m| m.header_type() == MessageHeader::RecordBatch)
            })
            .collect();
        let schema = messages
            .iter()
            .find_map(|m| {
                let message = ipc::root_as_message(&m.data_header).ok()?;
                let fb = message.header_as_schema()?;
                ipc::convert::try_fb_to_schema(fb).ok()
            })
            .map(Arc::new);
        for (i, batch) in batches.iter().enumerate() {
            let source = sources[i];
            let host = batch.to_host();
            if let Some(k) = pristine.iter().skip(1).position(|p| p == source) {
                if messages[0] == pristine[0] {
                    // An untouched batch under the untouched schema: the original.
                    prop_assert_eq!(host.as_ref().ok(), Some(&originals[k]));
                    continue;
                }
            }
            match host {
                Ok(host) => {
                    if let Some(read) = schema.as_ref().and_then(|s| arrow_rs_reads(source, s)) {
                        prop_assert_eq!(&host, &read, "differs from arrow-rs");
                    }
                }
                Err(e) => prop_assert_eq!(e.kind(), ErrorKind::InvalidData, "{}", e),
            }
        }
        drop(batches);
        prop_assert_eq!(ctx.bytes_allocated(), 0);
    }
}

#[test]
fn the_mutation_test_streams_decode_untouched() {
    let (sim, ctx) = new_sim();
    for (originals, messages) in streams() {
        let (batches, err) = decode(&ctx, &messages, |d| d.with_max_message_size(1 << 20));
        assert!(err.is_none(), "{err:?}");
        let got: Vec<_> = batches.iter().map(|b| b.to_host().unwrap()).collect();
        assert_eq!(got, originals);
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

// ---- The fuzz target's seeds ----------------------------------------------------------

/// `messages` in the input form of `fuzz/fuzz_targets/flight_decoder.rs`: for each, three
/// little-endian `u32` lengths (header, body, `app_metadata`), then those bytes.
fn frame(messages: &[FlightData]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages {
        for part in [&m.data_header, &m.data_body, &m.app_metadata] {
            out.extend_from_slice(&u32::try_from(part.len()).unwrap().to_le_bytes());
        }
        for part in [&m.data_header, &m.data_body, &m.app_metadata] {
            out.extend_from_slice(part);
        }
    }
    out
}

/// The messages of a seed (its framing read strictly: every length within the input).
fn unframe(mut data: &[u8]) -> Vec<FlightData> {
    let mut messages = Vec::new();
    while !data.is_empty() {
        let (lengths, rest) = data.split_first_chunk::<12>().expect("three lengths");
        data = rest;
        let mut part = |at: usize| {
            let len = u32::from_le_bytes(lengths[at..at + 4].try_into().unwrap()) as usize;
            let (bytes, rest) = data.split_at(len);
            data = rest;
            Bytes::copy_from_slice(bytes)
        };
        let (header, body, app_metadata) = (part(0), part(4), part(8));
        messages.push(
            FlightData::new()
                .with_data_header(header)
                .with_data_body(body)
                .with_app_metadata(app_metadata),
        );
    }
    messages
}

/// The seed streams: real encoder output, by name (`dictionary` is refused with
/// `Unsupported`; every other one decodes).
fn seed_streams() -> Vec<(&'static str, Vec<FlightData>)> {
    let rt = runtime();
    let batches = [numbers(1, 20), numbers(2, 3)];
    let with = |codec| {
        IpcWriteOptions::default()
            .try_with_compression(codec)
            .unwrap()
    };
    let mut seeds = vec![
        ("plain", rt.block_on(encoded(&batches, with(None)))),
        (
            "lz4",
            rt.block_on(encoded(&batches, with(Some(CompressionType::LZ4_FRAME)))),
        ),
        (
            "zstd",
            rt.block_on(encoded(&batches, with(Some(CompressionType::ZSTD)))),
        ),
    ];
    seeds.push(("schema_only", vec![seeds[0].1[0].clone()]));
    let mut split = rt.block_on(async {
        FlightDataEncoderBuilder::new()
            .with_max_flight_data_size(400)
            .build(stream::iter([Ok(RecordBatch::try_from_iter([(
                "v",
                Arc::new(Int64Array::from_iter_values(0..160)) as ArrayRef,
            )])
            .unwrap())]))
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
    });
    assert!(split.len() > 3);
    seeds.push(("split", std::mem::take(&mut split)));
    let mut with_metadata = seeds[0].1.clone();
    for m in &mut with_metadata {
        m.app_metadata = Bytes::from_static(b"app metadata");
    }
    with_metadata.insert(
        1,
        FlightData::new().with_app_metadata(&b"metadata alone"[..]),
    );
    seeds.push(("app_metadata", with_metadata));
    let list = cudabuf_arrow::arrow::array::ListArray::from_iter_primitive::<Int32Type, _, _>([
        Some(vec![Some(1), None]),
        None,
        Some(vec![]),
    ]);
    let nested = RecordBatch::try_from_iter([
        ("list", Arc::new(list) as ArrayRef),
        (
            "flag",
            Arc::new(cudabuf_arrow::arrow::array::BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
            ])) as _,
        ),
    ])
    .unwrap();
    seeds.push(("nested", rt.block_on(encoded(&[nested], with(None)))));
    let dict: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
    let dict = RecordBatch::try_from_iter([("d", Arc::new(dict) as ArrayRef)]).unwrap();
    seeds.push(("dictionary", rt.block_on(encoded(&[dict], with(None)))));
    seeds
}

/// The seeds in `fuzz/seeds/flight_decoder/` are the streams of [`seed_streams`] in the
/// fuzz target's framing, and decode (`CUDABUF_WRITE_FUZZ_SEEDS=1` writes them first).
#[test]
fn the_fuzz_seeds_are_real_streams_that_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/flight_decoder");
    let seeds = seed_streams();
    if std::env::var("CUDABUF_WRITE_FUZZ_SEEDS").as_deref() == Ok("1") {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, messages) in &seeds {
            std::fs::write(dir.join(format!("{name}.flight")), frame(messages)).unwrap();
        }
    }
    if !dir.is_dir() {
        // A packaged crate has no fuzz/ beside it.
        eprintln!(
            "SKIPPED: {} not found (outside the repository)",
            dir.display()
        );
        return;
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".flight"))
        .collect();
    names.sort();
    let mut want: Vec<String> = seeds.iter().map(|(n, _)| format!("{n}.flight")).collect();
    want.sort();
    assert_eq!(names, want, "rerun with CUDABUF_WRITE_FUZZ_SEEDS=1");
    let (sim, ctx) = new_sim();
    for (name, _) in &seeds {
        let bytes = std::fs::read(dir.join(format!("{name}.flight"))).unwrap();
        assert!(bytes.len() < 4096, "{name}: {} bytes", bytes.len());
        let (batches, err) = decode(&ctx, &unframe(&bytes), |d| d.with_max_message_size(1 << 20));
        match *name {
            "schema_only" => assert!(err.is_none() && batches.is_empty(), "{err:?}"),
            _ => {
                assert!(err.is_none(), "{name}: {err:?}");
                assert!(!batches.is_empty(), "{name}");
                for batch in &batches {
                    batch.to_host().unwrap();
                }
            }
        }
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

/// A client that resets its `DoPut` with `CANCEL` mid-upload (what dropping the call
/// does before the answer) gets nothing stored, and what the server had received is
/// freed at once. tonic's server reads a request body that ends with a `Cancelled`
/// error as a complete stream: without the server's own check of how the body ended,
/// the batches that had arrived were stored as the flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_put_the_client_resets_with_cancel_stores_nothing() {
    let (sim, ctx) = new_sim();
    // No idle timeout: only the reset can end the call.
    let mut limits = ServerLimits::default();
    limits.idle_timeout = None;
    let server = DeviceFlightServer::new(&ctx).with_limits(limits);
    let serving = Serving::start(server.clone(), None).await;
    // The connection outlives each call: dropping a call resets its stream alone.
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    for round in 0..5 {
        let messages = put_messages("put", &[numbers(40 + round, 500), numbers(41, 500)]).await;
        // The schema and the first batch, then nothing more: the call stays open.
        let head: Vec<FlightData> = messages[..2].to_vec();
        let mut client = FlightServiceClient::new(channel.clone());
        let call = tokio::spawn(async move {
            let body = stream::iter(head).chain(stream::pending());
            client.do_put(body).await.map(|_| ())
        });
        eventually(
            "the first batch on the server",
            Duration::from_secs(10),
            || ctx.bytes_allocated() > 0,
        )
        .await;
        call.abort();
        eventually(
            "the reset put's batch freed",
            Duration::from_secs(10),
            || ctx.bytes_allocated() == 0,
        )
        .await;
        assert!(
            server.get(b"put").is_none(),
            "round {round}: the server stored a put its client reset"
        );
    }
    drop(channel);
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
}
