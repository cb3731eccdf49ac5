//! cudabuf-flight on the simulator, the data paths beyond `DoGet`: the client's `DoPut`
//! from device batches, `DoExchange` both ways (the server's echo and a handler),
//! dictionary-encoded columns (replacements, compressed dictionaries, deltas refused),
//! the blocking client, and a current-thread runtime that keeps running while uploads
//! are held on the device. Every network call is bounded by a timeout; every case checks
//! that nothing leaks and that the race detector saw nothing.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use cudabuf_arrow::arrow::array::{
    ArrayRef, AsArray, DictionaryArray, Int32Array, Int64Array, Int8Array, ListArray, RecordBatch,
    StringArray, UInt64Array,
};
use cudabuf_arrow::arrow::compute::concat_batches;
use cudabuf_arrow::arrow::datatypes::{Int32Type, Int64Type, Int8Type};
use cudabuf_arrow::arrow::ipc::writer::{
    DictionaryHandling, DictionaryTracker, IpcDataGenerator, IpcWriteOptions,
};
use cudabuf_arrow::arrow::ipc::CompressionType;
use cudabuf_arrow::{DeviceRecordBatch, DeviceStreamReader};
use cudabuf_core::Context;
use cudabuf_flight::{
    BlockingFlightClient, DeviceFlightDecoder, DeviceFlightServer, FlightDeviceClient, FlightError,
    ServerLimits,
};
use cudabuf_sim::{FaultOp, SimBackend};
use futures::{stream, StreamExt, TryStreamExt};
use tokio::task::JoinHandle;

mod common;
use common::{assert_clean, bounded, new_sim, to_host, Serving};

const TOKEN: &str = "s3cret";

/// `batches` on the device, through one device IPC stream (so batches with the same
/// dictionary share it, as a reader of a stream gets them).
fn upload(batches: &[RecordBatch], ctx: &Context) -> Vec<DeviceRecordBatch> {
    let stream = cudabuf_arrow::serialize_stream(&batches[0].schema(), batches, ctx).unwrap();
    DeviceStreamReader::from_buffer(&stream)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Until `ctx` (of `sim`) holds no device memory (a server frees a cancelled call's memory
/// when it sees the reset, a moment after the client has returned). Past
/// [`common::LIMIT`] the test fails with what is still held.
async fn until_freed(ctx: &Context, sim: &SimBackend) {
    let freed = tokio::time::timeout(common::LIMIT, async {
        while ctx.bytes_allocated() != 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    if freed.is_err() {
        panic!(
            "{} bytes of device memory still held after {:?}: {}",
            ctx.bytes_allocated(),
            common::LIMIT,
            sim.leak_report()
        );
    }
}

/// A batch with a dictionary-encoded column (its dictionary `words`, a different one per
/// batch when the words differ), a nullable string column and a list column.
fn tagged(start: i64, rows: usize, words: &[&str]) -> RecordBatch {
    let ids: Vec<i64> = (start..start + rows as i64).collect();
    let keys = Int32Array::from_iter(
        ids.iter()
            .map(|&i| (i % 5 != 0).then(|| (i as usize % words.len()) as i32)),
    );
    let tags =
        DictionaryArray::<Int32Type>::try_new(keys, Arc::new(StringArray::from(words.to_vec())))
            .unwrap();
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        ids.iter()
            .map(|&i| (i % 4 != 0).then(|| (0..(i % 3) as i32).map(Some).collect::<Vec<_>>())),
    );
    RecordBatch::try_from_iter_with_nullable([
        (
            "id",
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            false,
        ),
        ("tag", Arc::new(tags) as _, true),
        (
            "note",
            Arc::new(StringArray::from_iter(
                ids.iter().map(|&i| (i % 6 != 0).then(|| format!("n{i}"))),
            )) as _,
            true,
        ),
        ("list", Arc::new(list) as _, true),
    ])
    .unwrap()
}

/// Three batches of [`tagged`]: the second replaces the first's dictionary, the third
/// has no rows.
fn tagged_batches() -> Vec<RecordBatch> {
    vec![
        tagged(0, 700, &["red", "green", "blue"]),
        tagged(700, 300, &["cyan", "magenta", "yellow", "black"]),
        tagged(1000, 0, &["red"]),
    ]
}

/// `batches` on the device of `ctx`, dictionaries included: written as one IPC stream
/// into device memory and read back with cudabuf-arrow's stream reader.
fn path(key: &str) -> FlightDescriptor {
    FlightDescriptor::new_path(vec![key.into()])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_put_sends_device_batches_dictionaries_included() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx);
    let serving = Serving::start(server.clone(), Some(TOKEN)).await;
    let batches = tagged_batches();
    let schema = batches[0].schema();
    let on_device = upload(&batches, &client_ctx);

    // Without the token: refused, nothing stored.
    let mut intruder = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();
    let err = bounded(intruder.do_put(path("t"), schema.clone(), on_device.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");
    assert!(server.keys().is_empty());

    let mut client = bounded(FlightDeviceClient::connect(&serving.url, Some(TOKEN)))
        .await
        .unwrap();
    let results = bounded(client.do_put(path("t"), schema.clone(), on_device.clone()))
        .await
        .unwrap();
    assert_eq!(results.len(), 1);
    let flight = server.get(b"t").expect("stored");
    assert_eq!(flight.schema, schema);
    assert!(flight
        .batches
        .iter()
        .all(|b| b.context().same_as(&server_ctx)));
    // arrow-rs's encoder sends nothing for the batch of 0 rows.
    assert_eq!(to_host(&flight.batches), batches[..2].to_vec());

    // A batch of another schema is refused before anything is sent.
    let other = upload(
        &[
            RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1])) as ArrayRef)])
                .unwrap(),
        ],
        &client_ctx,
    );
    let err = bounded(client.do_put(path("mixed"), schema.clone(), other))
        .await
        .unwrap_err();
    assert!(matches!(err, FlightError::InvalidData(_)), "{err}");
    assert_eq!(server.keys(), vec![b"t".to_vec()]);

    // A schema-only put stores a flight of no batches.
    bounded(client.do_put(path("empty"), schema.clone(), vec![]))
        .await
        .unwrap();
    assert!(server.get(b"empty").unwrap().batches.is_empty());

    drop((client, intruder, on_device, flight));
    serving.stop().await;
    drop(server);
    assert_eq!(server_ctx.bytes_allocated(), 0);
    assert_eq!(client_ctx.bytes_allocated(), 0);
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_download_cancels_the_put_and_the_server_keeps_nothing() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    // A short idle timeout: should the reset not reach the server (seen twice in a few
    // hundred runs, not explained yet), it still frees the call's memory within seconds.
    // A failed put is cancelled with the body's error, not by dropping the call: a drop
    // could reset the stream with CANCEL, which tonic's server reads as the end of a
    // complete stream (about one run of the whole file in 70 failed so before). Should the
    // server keep memory, the failure lists the live allocations.
    let mut limits = ServerLimits::default();
    limits.idle_timeout = Some(Duration::from_secs(5));
    let server = DeviceFlightServer::new(&server_ctx).with_limits(limits);
    let serving = Serving::start(server.clone(), None).await;
    let batches: Vec<RecordBatch> = (0..4).map(|i| tagged(i * 100, 100, &["a", "b"])).collect();
    let on_device = upload(&batches, &client_ctx);
    // The copies one download makes, then a failure in the third batch's download: the
    // schema and two batches have gone out when it fails.
    let before = client_sim.op_count(FaultOp::Copy);
    on_device[0].to_host().unwrap();
    let per_batch = client_sim.op_count(FaultOp::Copy) - before;
    let injected = cudabuf_core::Error::Driver {
        call: "cuMemcpyDtoH_v2",
        name: "CUDA_ERROR_UNKNOWN".into(),
        code: 999,
        message: "injected".into(),
    };
    client_sim
        .fail_nth(FaultOp::Copy, 2 * per_batch + 1, injected.clone())
        .unwrap();

    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();
    let err = bounded(client.do_put(path("t"), batches[0].schema(), on_device.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FlightError::Device(e) if *e == injected),
        "{err}"
    );
    // The server saw a reset stream (or, at worst, its idle timeout), never a complete
    // one: it stores nothing and frees what it had received.
    let waited = std::time::Instant::now();
    until_freed(&server_ctx, &sim).await;
    assert!(server.keys().is_empty());
    if waited.elapsed() > Duration::from_secs(2) {
        eprintln!(
            "the server freed the cancelled put after {:?}: by its idle timeout, the reset did not reach it",
            waited.elapsed()
        );
    }

    // The client works on.
    client_sim.clear_faults();
    bounded(client.do_put(path("t"), batches[0].schema(), on_device.clone()))
        .await
        .unwrap();
    assert_eq!(to_host(&server.get(b"t").unwrap().batches), batches);

    drop((client, on_device));
    serving.stop().await;
    drop(server);
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_exchange_echoes_device_batches_by_default() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx);
    let serving = Serving::start(server.clone(), Some(TOKEN)).await;
    let mut client = bounded(FlightDeviceClient::connect(&serving.url, Some(TOKEN)))
        .await
        .unwrap();

    // Dictionaries, a replacement, a batch of no rows.
    let batches = tagged_batches();
    let schema = batches[0].schema();
    let answer = bounded(client.do_exchange(
        path("echo"),
        schema.clone(),
        upload(&batches, &client_ctx),
        &client_ctx,
    ))
    .await
    .unwrap();
    assert_eq!(answer.schema(), &schema);
    let echoed: Vec<DeviceRecordBatch> = bounded(answer.try_collect()).await.unwrap();
    assert!(echoed.iter().all(|b| b.context().same_as(&client_ctx)));
    assert_eq!(to_host(&echoed), batches[..2].to_vec());
    drop(echoed);

    // A 3 MiB batch: split into messages of at most 2 MiB both ways.
    let big = RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter_values(0..(3 << 17))) as ArrayRef,
    )])
    .unwrap();
    let answer = bounded(client.do_exchange(
        path("echo"),
        big.schema(),
        upload(std::slice::from_ref(&big), &client_ctx),
        &client_ctx,
    ))
    .await
    .unwrap();
    let echoed: Vec<DeviceRecordBatch> = bounded(answer.try_collect()).await.unwrap();
    assert!(echoed.len() >= 2, "{} batch(es)", echoed.len());
    assert_eq!(
        concat_batches(&big.schema(), &to_host(&echoed)).unwrap(),
        big
    );
    drop(echoed);

    // A schema and no batches: answered with the schema alone.
    let answer = bounded(client.do_exchange(path("echo"), schema.clone(), vec![], &client_ctx))
        .await
        .unwrap();
    assert_eq!(answer.schema(), &schema);
    assert_eq!(bounded(answer.count()).await, 0);

    // Without the token: refused.
    let mut intruder = bounded(FlightDeviceClient::connect(&serving.url, Some("wrong")))
        .await
        .unwrap();
    let err = bounded(intruder.do_exchange(path("echo"), schema.clone(), vec![], &client_ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::Unauthenticated), "{err}");

    // An exchange that sends no schema at all is InvalidArgument.
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut request = tonic::Request::new(stream::iter([
        FlightData::new().with_descriptor(path("echo"))
    ]));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let err = bounded(FlightServiceClient::new(channel).do_exchange(request))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");

    assert!(server.keys().is_empty(), "an exchange stores nothing");
    drop((client, intruder));
    serving.stop().await;
    drop(server);
    assert_eq!(server_ctx.bytes_allocated(), 0);
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

/// The handler of [`do_exchange_runs_the_handler_on_each_batch`]: the batch's row count
/// and the sum of its `id` column, uploaded to the batch's device; a batch whose first id
/// is negative is refused.
fn summarize(batch: DeviceRecordBatch) -> cudabuf_flight::Result<DeviceRecordBatch> {
    let host = batch.to_host()?;
    let ids = host.column(0).as_primitive::<Int64Type>();
    if !ids.is_empty() && ids.value(0) < 0 {
        return Err(FlightError::InvalidData("negative ids are refused".into()));
    }
    let sum: i64 = ids.iter().flatten().sum();
    let answer = RecordBatch::try_from_iter([
        (
            "rows",
            Arc::new(UInt64Array::from(vec![host.num_rows() as u64])) as ArrayRef,
        ),
        ("sum", Arc::new(Int64Array::from(vec![sum])) as _),
    ])
    .map_err(|e| FlightError::InvalidData(e.to_string()))?;
    Ok(DeviceRecordBatch::from_host(&answer, batch.context())?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_exchange_runs_the_handler_on_each_batch() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let server = DeviceFlightServer::new(&server_ctx).with_exchange(move |batch| {
        counted.fetch_add(1, Ordering::SeqCst);
        summarize(batch)
    });
    let serving = Serving::start(server.clone(), None).await;
    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();

    let batches = tagged_batches();
    let answer = bounded(client.do_exchange(
        path("sum"),
        batches[0].schema(),
        upload(&batches, &client_ctx),
        &client_ctx,
    ))
    .await
    .unwrap();
    assert_eq!(answer.schema().field(0).name(), "rows");
    let answers: Vec<DeviceRecordBatch> = bounded(answer.try_collect()).await.unwrap();
    let sums = concat_batches(&answers[0].schema().clone(), &to_host(&answers)).unwrap();
    drop(answers);
    // The batch of 0 rows is not sent, so the handler sees two.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(
        sums.column(0)
            .as_primitive::<cudabuf_arrow::arrow::datatypes::UInt64Type>()
            .values(),
        &[700, 300]
    );
    assert_eq!(
        sums.column(1).as_primitive::<Int64Type>().values(),
        &[(0..700).sum::<i64>(), (700..1000).sum::<i64>()]
    );

    // The handler's error ends the exchange with its status, after the answers before.
    let refused =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![-1, 2])) as ArrayRef)])
            .unwrap();
    let fine =
        RecordBatch::try_from_iter([("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)])
            .unwrap();
    let answer = bounded(client.do_exchange(
        path("sum"),
        fine.schema(),
        upload(&[fine.clone(), refused, fine], &client_ctx),
        &client_ctx,
    ))
    .await
    .unwrap();
    let items: Vec<_> = bounded(answer.collect()).await;
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(items[0].is_ok());
    let err = items[1].as_ref().unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    assert!(err.to_string().contains("negative ids"), "{err}");
    drop(items);

    drop(client);
    serving.stop().await;
    drop(server);
    until_freed(&server_ctx, &sim).await;
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_run_one_batch_ahead_of_the_encoder_and_no_further() {
    let (sim, ctx) = new_sim();
    let batches: Vec<RecordBatch> = (0..4).map(|i| tagged(i * 100, 100, &["a", "b"])).collect();
    let on_device = upload(&batches, &ctx);
    // Counted from here: the upload's copies are done (on a threaded simulator they may
    // still be running).
    ctx.synchronize().unwrap();
    // The copies one batch's download makes (its body and its dictionary's).
    let before = sim.op_count(FaultOp::Copy);
    on_device[0].to_host().unwrap();
    let per_batch = sim.op_count(FaultOp::Copy) - before;
    assert!(per_batch > 0);
    let start = sim.op_count(FaultOp::Copy);
    let downloads = || (sim.op_count(FaultOp::Copy) - start) / per_batch;

    let mut encoded = cudabuf_flight::encode_device_batches(batches[0].schema(), on_device, None);
    let mut sent = vec![bounded(encoded.next()).await.unwrap().unwrap()];
    assert_eq!(downloads(), 0, "the schema message needs no download");
    // The first message of batch 0 (its dictionary): batch 1's download runs meanwhile,
    // batch 2's does not start until the encoder asks for batch 1.
    sent.push(bounded(encoded.next()).await.unwrap().unwrap());
    bounded(async {
        while downloads() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(downloads(), 2);
    sent.extend(bounded(encoded.try_collect::<Vec<_>>()).await.unwrap());
    assert_eq!(downloads(), 4);
    assert_eq!(decode(&ctx, &sent).unwrap(), batches);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_fixed_width_batch_is_downloaded_a_piece_at_a_time() {
    let (sim, ctx) = new_sim();
    // 200 000 rows of 8 int64 columns, one with nulls: about 12 MiB, several pieces.
    let rows = 200_000i64;
    let columns: Vec<(String, ArrayRef)> = (0..8)
        .map(|c| {
            let values = (0..rows).map(|i| (c != 3 || i % 7 != 2).then_some(i * 8 + c));
            (
                format!("c{c}"),
                Arc::new(Int64Array::from_iter(values)) as ArrayRef,
            )
        })
        .collect();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let on_device = DeviceRecordBatch::from_host(&batch, &ctx).unwrap();
    assert!(on_device.is_flat());
    ctx.synchronize().unwrap();
    let start = sim.op_count(FaultOp::Copy);
    let copies = || sim.op_count(FaultOp::Copy) - start;

    let mut encoded = cudabuf_flight::encode_device_batches(batch.schema(), vec![on_device], None);
    let mut sent = vec![bounded(encoded.next()).await.unwrap().unwrap()];
    sent.push(bounded(encoded.next()).await.unwrap().unwrap());
    // The first message is out; the next piece may be downloading (9 copies a piece:
    // the bitmap and 8 columns), no more until the encoder asks for it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let early = copies();
    assert!(
        (9..=18).contains(&early),
        "{early} copies when the first message went out"
    );
    sent.extend(bounded(encoded.try_collect::<Vec<_>>()).await.unwrap());
    let pieces = copies() / 9;
    assert!(pieces >= 3, "{pieces} pieces");
    assert_eq!(copies(), pieces * 9);
    for message in &sent {
        assert!(
            message.data_body.len() <= 2 << 20,
            "messages of at most 2 MiB"
        );
    }
    // Sized by the rows' bytes, not by the landing area each column is a slice of: the
    // messages but one a piece hold more than 1 MiB.
    let body: usize = sent.iter().map(|m| m.data_body.len()).sum();
    assert!(
        sent.len() - 1 <= body.div_ceil(1 << 20) + pieces as usize,
        "{} messages for {body} bytes in {pieces} pieces",
        sent.len() - 1
    );
    let got = decode(&ctx, &sent).unwrap();
    assert!(got.len() as u64 >= pieces, "at least one message a piece");
    assert_eq!(concat_batches(&batch.schema(), &got).unwrap(), batch);
    drop(got);
    assert_clean(sim, ctx);
}

#[test]
fn the_message_size_splits_what_client_and_server_send() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx).with_max_flight_data_size(64 << 10);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let serving = runtime.block_on(Serving::start(server.clone(), None));
    // 1 MiB of one int64 column with nulls.
    let rows = 128 << 10;
    let batch = RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter(
            (0..rows).map(|i| (i % 5 != 0).then_some(i)),
        )) as ArrayRef,
    )])
    .unwrap();
    let on_device = vec![DeviceRecordBatch::from_host(&batch, &client_ctx).unwrap()];

    // Default: one message (and so one batch kept by the server).
    let mut client = BlockingFlightClient::connect(&serving.url, None).unwrap();
    client
        .do_put(path("whole"), batch.schema(), on_device.clone())
        .unwrap();
    assert_eq!(server.get(b"whole").unwrap().batches.len(), 1);
    // 64 KiB messages: 16 or more.
    let mut client = client.with_max_flight_data_size(64 << 10);
    client
        .do_put(path("split"), batch.schema(), on_device)
        .unwrap();
    let kept = to_host(&server.get(b"split").unwrap().batches);
    assert!(kept.len() >= 16, "{} batches kept", kept.len());
    assert_eq!(concat_batches(&batch.schema(), &kept).unwrap(), batch);
    // The server sends 64 KiB messages too.
    let (_, got) = client.do_get("whole", &client_ctx).unwrap();
    assert!(got.len() >= 16, "{} batches received", got.len());
    assert_eq!(
        concat_batches(&batch.schema(), &to_host(&got)).unwrap(),
        batch
    );

    drop((client, got));
    runtime.block_on(serving.stop());
    drop((server, runtime));
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[test]
fn a_large_batch_of_strings_goes_up_in_pieces_and_lands_equal() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let serving = runtime.block_on(Serving::start(server.clone(), None));
    // About 10 MiB: strings of 0 to 60 bytes with nulls, and an int64 column.
    let rows = 300_000usize;
    let words =
        StringArray::from_iter((0..rows).map(|i| (i % 11 != 3).then(|| "flight".repeat(i % 11))));
    let batch = RecordBatch::try_from_iter([
        ("w", Arc::new(words) as ArrayRef),
        (
            "v",
            Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _,
        ),
    ])
    .unwrap();
    let on_device = DeviceRecordBatch::from_host(&batch, &client_ctx).unwrap();
    assert!(on_device.is_flat());
    client_ctx.synchronize().unwrap();
    let before = client_sim.op_count(FaultOp::Copy);
    let mut client = BlockingFlightClient::connect(&serving.url, None).unwrap();
    client
        .do_put(path("words"), batch.schema(), vec![on_device])
        .unwrap();
    // In pieces: each copies the bitmap, the offsets and the int64 values, then the
    // strings' data (a download of the whole batch is one copy of its body).
    let copies = client_sim.op_count(FaultOp::Copy) - before;
    assert!(copies >= 3 * 4, "{copies} copies for the upload");
    let kept = to_host(&server.get(b"words").unwrap().batches);
    assert_eq!(concat_batches(&batch.schema(), &kept).unwrap(), batch);

    drop((client, kept));
    runtime.block_on(serving.stop());
    drop((server, runtime));
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_no_rows_without_offsets_is_sent_as_its_schema() {
    let (sim, ctx) = new_sim();
    let host = RecordBatch::try_from_iter([(
        "s",
        Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef,
    )])
    .unwrap();
    let device = DeviceRecordBatch::from_host(&host, &ctx).unwrap();
    // Through the C Device Data Interface a string column of no slots has no offsets.
    let mut exported = cudabuf_arrow::export_device_record_batch(&device).unwrap();
    // SAFETY: exported by cudabuf just above, for this schema and context.
    let imported =
        unsafe { cudabuf_arrow::import_device_record_batch(&mut exported, host.schema(), &ctx) }
            .unwrap();
    assert!(imported.columns()[0].buffers()[0].is_empty());
    let sent: Vec<FlightData> = bounded(
        cudabuf_flight::encode_device_batches(host.schema(), vec![imported], None).try_collect(),
    )
    .await
    .unwrap();
    assert_eq!(sent.len(), 1, "the schema message alone");
    drop(device);
    assert_clean(sim, ctx);
}

#[test]
fn the_blocking_client_puts_and_exchanges() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let serving = runtime.block_on(Serving::start(server.clone(), None));

    let batches = tagged_batches();
    let schema = batches[0].schema();
    let mut client = BlockingFlightClient::connect(&serving.url, None).unwrap();
    let results = client
        .do_put(path("t"), schema.clone(), upload(&batches, &client_ctx))
        .unwrap();
    assert_eq!(results.len(), 1);
    assert_eq!(to_host(&server.get(b"t").unwrap().batches), batches[..2]);
    let (answer_schema, echoed) = client
        .do_exchange(
            path("echo"),
            schema.clone(),
            upload(&batches, &client_ctx),
            &client_ctx,
        )
        .unwrap();
    assert_eq!(answer_schema, schema);
    assert_eq!(to_host(&echoed), batches[..2]);

    drop((client, echoed));
    runtime.block_on(serving.stop());
    drop((server, runtime));
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

// ---- Dictionaries, message by message ---------------------------------------------------

/// The IPC messages of `batches` as a Flight peer sends them: the schema, then before
/// each batch the dictionary batches it needs (what arrow-rs's IPC writer emits with
/// `options`: a replacement when a dictionary changes, a delta with
/// `DictionaryHandling::Delta` when it only grows).
fn messages(batches: &[RecordBatch], options: &IpcWriteOptions) -> Vec<FlightData> {
    let generator = IpcDataGenerator::default();
    let mut tracker = DictionaryTracker::new(false);
    let mut out = vec![FlightData::from(
        generator.schema_to_bytes_with_dictionary_tracker(
            &batches[0].schema(),
            &mut tracker,
            options,
        ),
    )];
    for batch in batches {
        let (dictionaries, data) = generator
            .encode(batch, &mut tracker, options, &mut Default::default())
            .unwrap();
        out.extend(dictionaries.into_iter().map(FlightData::from));
        out.push(FlightData::from(data));
    }
    out
}

/// Push `messages`; the batches, or the first error (with every allocation gone once the
/// decoder and the batches are dropped).
fn decode(ctx: &Context, messages: &[FlightData]) -> Result<Vec<RecordBatch>, FlightError> {
    let mut decoder = DeviceFlightDecoder::new(ctx).unwrap();
    let mut landed = Vec::new();
    let outcome = messages
        .iter()
        .try_for_each(|m| decoder.push(m).map(|b| landed.extend(b)))
        .and_then(|()| decoder.finish().map(|b| landed.extend(b)));
    let result = outcome.map(|()| to_host(&landed));
    drop((decoder, landed));
    assert_eq!(ctx.bytes_allocated(), 0);
    result
}

#[test]
fn dictionaries_replacements_compressed_and_refused_deltas() {
    let (sim, ctx) = new_sim();
    // Two dictionary columns (int8 and int32 keys); the second batch replaces both.
    let two = |start: i64, words: &[&str], codes: &[&str]| {
        let base = tagged(start, 50, words);
        let keys = Int8Array::from_iter((0..50).map(|i| Some((i % codes.len()) as i8)));
        let codes =
            DictionaryArray::<Int8Type>::try_new(keys, Arc::new(StringArray::from(codes.to_vec())))
                .unwrap();
        let mut columns = base.columns().to_vec();
        columns.push(Arc::new(codes));
        let mut fields = base.schema().fields().to_vec();
        fields.push(Arc::new(cudabuf_arrow::arrow::datatypes::Field::new(
            "code",
            columns[4].data_type().clone(),
            false,
        )));
        RecordBatch::try_new(
            Arc::new(cudabuf_arrow::arrow::datatypes::Schema::new(fields)),
            columns,
        )
        .unwrap()
    };
    let batches = vec![
        two(0, &["a", "b"], &["x", "y", "z"]),
        two(50, &["c", "d", "e"], &["w"]),
        two(100, &["c", "d", "e"], &["w"]),
    ];
    let lz4 = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::LZ4_FRAME))
        .unwrap();
    let zstd = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .unwrap();
    for (name, options) in [
        ("plain", IpcWriteOptions::default()),
        ("lz4", lz4),
        ("zstd", zstd),
    ] {
        let sent = messages(&batches, &options);
        // Two dictionaries before the first batch, two replacements before the second,
        // none before the third (unchanged).
        assert_eq!(sent.len(), 1 + 3 + 3 + 1, "{name}");
        assert_eq!(decode(&ctx, &sent).unwrap(), batches, "{name}");
    }

    // A delta dictionary (the third batch's grows the second's) is Unsupported.
    let preserving = |start: i64| {
        let mut builder = cudabuf_arrow::arrow::array::StringDictionaryBuilder::<Int32Type>::new();
        for i in 0..start + 3 {
            builder.append(format!("w{i}")).unwrap();
        }
        let tags = builder.finish();
        RecordBatch::try_from_iter([("tag", Arc::new(tags) as ArrayRef)]).unwrap()
    };
    let delta = IpcWriteOptions::default().with_dictionary_handling(DictionaryHandling::Delta);
    let sent = messages(&[preserving(0), preserving(2)], &delta);
    let is_delta = |m: &FlightData| {
        cudabuf_arrow::arrow::ipc::root_as_message(&m.data_header)
            .ok()
            .and_then(|m| m.header_as_dictionary_batch())
            .is_some_and(|d| d.isDelta())
    };
    assert!(sent.iter().any(is_delta), "arrow-rs wrote no delta");
    let err = decode(&ctx, &sent).unwrap_err();
    assert!(
        matches!(err, FlightError::Unsupported(ref m) if m.contains("delta")),
        "{err}"
    );

    // A dictionary before the schema, a batch before its dictionary, a dictionary whose
    // id no field uses: typed errors.
    let sent = messages(&batches[..1], &IpcWriteOptions::default());
    let err = decode(&ctx, &sent[1..]).unwrap_err();
    assert!(matches!(err, FlightError::InvalidData(_)), "{err}");
    let err = decode(&ctx, &[sent[0].clone(), sent[3].clone()]).unwrap_err();
    assert!(matches!(err, FlightError::Device(_)), "{err}");
    let plain =
        RecordBatch::try_from_iter([("x", Arc::new(Int32Array::from(vec![1])) as ArrayRef)])
            .unwrap();
    let other_schema = messages(std::slice::from_ref(&plain), &IpcWriteOptions::default());
    let err = decode(&ctx, &[other_schema[0].clone(), sent[1].clone()]).unwrap_err();
    assert!(matches!(err, FlightError::Device(_)), "{err}");

    // The encoder side: device batches with dictionary columns encode to the same
    // batches (dictionaries sent before each).
    let on_device = upload(&batches, &ctx);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let encoded: Vec<FlightData> = runtime
        .block_on(
            cudabuf_flight::encode_device_batches(batches[0].schema(), on_device, None)
                .try_collect(),
        )
        .unwrap();
    assert_eq!(decode(&ctx, &encoded).unwrap(), batches);
    drop(runtime);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

// ---- A current-thread runtime is never blocked by the device ---------------------------

/// A record hook that holds the first event record of `sim` (the issue of the first
/// upload of a batch's body) until `release` gets a message, for at most 20 s; `held`
/// counts the holds, `released` says whether the message came in time.
struct Hold {
    entered: Arc<AtomicBool>,
    release: mpsc::Sender<()>,
    released: Arc<Mutex<Option<bool>>>,
}

impl Hold {
    fn install(sim: &SimBackend) -> Self {
        let (release, gate) = mpsc::channel::<()>();
        let gate = Mutex::new(gate);
        let entered = Arc::new(AtomicBool::new(false));
        let released = Arc::new(Mutex::new(None));
        let (seen, result) = (entered.clone(), released.clone());
        sim.set_record_hook(Some(Arc::new(move |_| {
            if seen.swap(true, Ordering::SeqCst) {
                return; // only the first record is held
            }
            let came = gate
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(20))
                .is_ok();
            *result.lock().unwrap() = Some(came);
        })));
        Hold {
            entered,
            release,
            released,
        }
    }

    /// A task of the runtime: once the hold is entered, a timer fires (so the runtime
    /// runs while the upload is held) and the hold is released.
    fn release_from_a_timer(&self) -> JoinHandle<usize> {
        let (entered, release) = (self.entered.clone(), self.release.clone());
        tokio::spawn(async move {
            let mut ticks = 0;
            while !entered.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(2)).await;
                ticks += 1;
            }
            release.send(()).ok();
            ticks
        })
    }

    fn released_in_time(&self) -> Option<bool> {
        *self.released.lock().unwrap()
    }
}

/// Turn `ctx`'s staging pool on and give it two pinned buffers of each size class the
/// decoder stages these bodies in (64 KiB to 1 MiB), so that its first body is staged
/// and uploaded asynchronously (an empty pool sends it with a synchronous copy that pins
/// nothing, which has no upload to hold).
fn warm_staging_pool(ctx: &Context) {
    ctx.set_staging_pool_limit(8 << 20);
    for class in [64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20] {
        let buffers = [
            ctx.staging_buffer(class).unwrap(),
            ctx.staging_buffer(class).unwrap(),
        ];
        for buffer in buffers {
            ctx.recycle_staging_buffer(buffer);
        }
    }
}

#[test]
fn a_current_thread_runtime_keeps_running_while_uploads_are_held() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    warm_staging_pool(&server_ctx);
    warm_staging_pool(&client_ctx);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batches = tagged_batches();
    let server = DeviceFlightServer::new(&server_ctx);
    server
        .insert("t", batches[0].schema(), upload(&batches, &server_ctx))
        .unwrap();
    runtime.block_on(async {
        // One thread runs the server, the client and the timer: a step that blocked it
        // on the held upload would hold the timer too, and the hold would time out.
        let serving = Serving::start(server.clone(), None).await;
        let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
            .await
            .unwrap();

        // The client's DoGet: its first upload is held.
        let hold = Hold::install(&client_sim);
        let timer = hold.release_from_a_timer();
        let got: Vec<_> = bounded(async {
            client
                .do_get("t", &client_ctx)
                .await?
                .try_collect::<Vec<_>>()
                .await
        })
        .await
        .unwrap();
        assert_eq!(bounded(timer).await.unwrap(), 3);
        assert_eq!(hold.released_in_time(), Some(true));
        assert_eq!(to_host(&got), batches[..2]);
        client_sim.set_record_hook(None);

        // The server's side of a DoPut and of a DoExchange: their first uploads held.
        for exchange in [false, true] {
            let hold = Hold::install(&sim);
            let timer = hold.release_from_a_timer();
            let on_device = upload(&batches, &client_ctx);
            if exchange {
                let answer = bounded(client.do_exchange(
                    path("x"),
                    batches[0].schema(),
                    on_device,
                    &client_ctx,
                ))
                .await
                .unwrap();
                let echoed: Vec<_> = bounded(answer.try_collect::<Vec<_>>()).await.unwrap();
                assert_eq!(to_host(&echoed), batches[..2]);
            } else {
                bounded(client.do_put(path("put"), batches[0].schema(), on_device))
                    .await
                    .unwrap();
                assert_eq!(to_host(&server.get(b"put").unwrap().batches), batches[..2]);
            }
            assert_eq!(bounded(timer).await.unwrap(), 3);
            assert_eq!(hold.released_in_time(), Some(true), "exchange: {exchange}");
            sim.set_record_hook(None);
        }

        drop((client, got));
        serving.stop().await;
    });
    drop((server, runtime));
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}
