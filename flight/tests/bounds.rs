//! cudabuf-flight against peers that try to make it hold memory or time it should not:
//! row counts no buffer backs, compressed bodies that expand past the message limit,
//! schemas arrow-rs cannot build arrays of, a client that stops reading a `DoGet`, a
//! server that answers a `DoPut` for ever or stops reading it, and the timeouts of a long
//! upload. On the simulator over loopback; every network wait is bounded.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::encode::{DictionaryHandling, FlightDataEncoderBuilder};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use bytes::Bytes;
use cudabuf_arrow::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use cudabuf_arrow::arrow::datatypes::{DataType, Field, Schema};
use cudabuf_arrow::arrow::ipc::writer::IpcWriteOptions;
use cudabuf_arrow::arrow::ipc::{self, CompressionType};
use cudabuf_flight::{
    DeviceFlightDecoder, DeviceFlightServer, FlightDeviceClient, FlightError, ServerLimits,
};
use futures::stream::BoxStream;
use futures::{stream, StreamExt, TryStreamExt};
use tonic::{Request, Response, Status, Streaming};

use common::{bounded, eventually, new_sim, numbers, upload, Serving};

async fn encoded(
    descriptor: Option<FlightDescriptor>,
    batches: &[RecordBatch],
    options: IpcWriteOptions,
) -> Vec<FlightData> {
    let owned = batches.to_vec();
    FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_flight_descriptor(descriptor)
        .with_dictionary_handling(DictionaryHandling::Resend)
        // One message per batch (arrow-flight splits at 2 MiB by default).
        .with_max_flight_data_size(usize::MAX)
        .build(stream::iter(owned.into_iter().map(Ok)))
        .try_collect()
        .await
        .expect("encodes")
}

/// One non-null int64 column of `rows` zeros.
fn zeros(rows: usize) -> RecordBatch {
    RecordBatch::try_from_iter_with_nullable([(
        "z",
        Arc::new(Int64Array::from(vec![0i64; rows])) as ArrayRef,
        false,
    )])
    .unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A raw tonic client of `url` (no checks of its own).
async fn raw(url: &str) -> FlightServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightServiceClient::new(channel)
}

/// Every message of `answer` read and dropped: `Ok` at a complete end, else its status.
async fn read_to_end(answer: &mut Streaming<FlightData>) -> Result<(), Status> {
    while answer.message().await?.is_some() {}
    Ok(())
}

/// The default server limits with an idle timeout of `millis`.
fn idle_limits(millis: u64) -> ServerLimits {
    let mut limits = ServerLimits::default();
    limits.idle_timeout = Some(Duration::from_millis(millis));
    limits
}

/// A raw `DoPut` of `messages`, its answers collected.
async fn raw_put(url: &str, messages: Vec<FlightData>) -> Result<Vec<PutResult>, Status> {
    let mut client = raw(url).await;
    bounded(async {
        client
            .do_put(stream::iter(messages))
            .await?
            .into_inner()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
}

/// A raw `DoExchange` of `messages`, its answers collected.
async fn raw_exchange(url: &str, messages: Vec<FlightData>) -> Result<Vec<FlightData>, Status> {
    let mut client = raw(url).await;
    bounded(async {
        client
            .do_exchange(stream::iter(messages))
            .await?
            .into_inner()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
}

/// The messages of a DoPut/DoExchange of `count` zero-column batches whose row counts
/// are patched to `rows`.
async fn rowless(rows: i64, count: usize, key: &str) -> Vec<FlightData> {
    use cudabuf_arrow::arrow::array::RecordBatchOptions;
    let batch = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(12345)),
    )
    .unwrap();
    let batches = vec![batch; count];
    let mut messages = encoded(
        Some(FlightDescriptor::new_path(vec![key.into()])),
        &batches,
        IpcWriteOptions::default(),
    )
    .await;
    assert_eq!(messages.len(), count + 1);
    for m in &mut messages[1..] {
        let header = m.data_header.to_vec();
        let at = (0..header.len() - 7)
            .find(|&i| {
                let mut p = header.clone();
                p[i..i + 8].copy_from_slice(&rows.to_le_bytes());
                header[i..i + 8] == 12345i64.to_le_bytes()
                    && ipc::root_as_message(&p)
                        .ok()
                        .and_then(|m| m.header_as_record_batch())
                        .is_some_and(|b| b.length() == rows)
            })
            .expect("the length's bytes");
        let mut patched = header;
        patched[at..at + 8].copy_from_slice(&rows.to_le_bytes());
        m.data_header = Bytes::from(patched);
    }
    messages
}

/// A schema message for one `FixedSizeBinary` field whose byte width is patched to `width`.
fn fsb_schema_message(width: i32, descriptor: Option<FlightDescriptor>) -> FlightData {
    const MARK: i32 = 0x0123_4567;
    let schema = Schema::new(vec![Field::new("f", DataType::FixedSizeBinary(MARK), true)]);
    let mut data = FlightData::from(SchemaAsIpc::new(&schema, &IpcWriteOptions::default()));
    let header = data.data_header.to_vec();
    let at = (0..header.len() - 3)
        .find(|&i| header[i..i + 4] == MARK.to_le_bytes())
        .expect("the width's bytes");
    let mut patched = header;
    patched[at..at + 4].copy_from_slice(&width.to_le_bytes());
    assert!(ipc::root_as_message(&patched).is_ok());
    data.data_header = Bytes::from(patched);
    data.flight_descriptor = descriptor;
    data
}

// ---- Row counts no buffer backs -------------------------------------------------

/// A zero-column batch may declare any row count (it holds no bytes): the echo of one
/// claiming `i64::MAX` rows is one run (it was cut into 2^41 runs of rows, a 32 TiB
/// vector whose allocation failure aborted the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_column_batch_of_i64_max_rows_is_echoed_and_served() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx);
    let serving = Serving::start(server.clone(), None).await;
    let answer = raw_exchange(&serving.url, rowless(i64::MAX, 1, "x").await).await;
    let answer = answer.expect("the echo");
    // The schema, then the batch.
    assert_eq!(answer.len(), 2, "{answer:?}");
    let rows = ipc::root_as_message(&answer[1].data_header)
        .unwrap()
        .header_as_record_batch()
        .unwrap()
        .length();
    assert_eq!(rows, i64::MAX);

    // Stored by a DoPut, then fetched by a DoGet, and counted by GetFlightInfo.
    raw_put(&serving.url, rowless(i64::MAX, 1, "one").await)
        .await
        .expect("stored");
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap();
    let got: Vec<_> = bounded(async {
        client
            .do_get("one", &ctx)
            .await?
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .expect("the DoGet");
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].num_rows(), i64::MAX as usize);
    assert_eq!(got[0].num_columns(), 0);
    let info = bounded(client.get_flight_info(FlightDescriptor::new_path(vec!["one".into()])))
        .await
        .unwrap();
    assert_eq!(info.total_records, i64::MAX);
    drop(got);
    serving.stop().await;
}

/// Three such batches: their rows add up past `i64::MAX`. GetFlightInfo and ListFlights
/// answer `total_records` -1 (unknown); the sum panicked (debug) or wrapped (release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_counts_that_overflow_their_sum_are_an_unknown_total() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx);
    let serving = Serving::start(server.clone(), None).await;
    raw_put(&serving.url, rowless(i64::MAX, 3, "x").await)
        .await
        .expect("stored");
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap();
    let info = bounded(client.get_flight_info(FlightDescriptor::new_path(vec!["x".into()])))
        .await
        .expect("an answer");
    assert_eq!(info.total_records, -1);
    let listed = bounded(async {
        raw(&serving.url)
            .await
            .list_flights(Criteria::default())
            .await?
            .into_inner()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .expect("listed");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].total_records, -1);
    serving.stop().await;
}

// ---- Compressed bodies -------------------------------------------------------------

/// 128 MiB of zeros compressed with ZSTD is a few KiB on the wire; under a 1 MiB message
/// limit the decoder refuses it before allocating (the decompression limit follows the
/// message limit; it was 4 GiB whatever the message limit).
#[test]
fn a_compressed_body_may_not_expand_past_the_message_limit() {
    let (_sim, ctx) = new_sim();
    let batch = zeros(16 << 20);
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .unwrap();
    let messages = runtime().block_on(encoded(None, std::slice::from_ref(&batch), options));
    drop(batch);
    let mut decoder = DeviceFlightDecoder::new(&ctx)
        .unwrap()
        .with_max_message_size(1 << 20);
    assert_eq!(decoder.decompression_limit(), 1 << 20);
    let result = messages
        .iter()
        .try_for_each(|m| decoder.push(m).map(drop))
        .and_then(|()| decoder.finish());
    match result {
        Err(FlightError::TooLarge { size, limit }) => {
            assert_eq!(limit, 1 << 20);
            assert!(size > limit, "{size}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert_eq!(ctx.bytes_allocated(), 0);
    // Set apart from the message limit, it is that limit.
    let mut decoder = DeviceFlightDecoder::new(&ctx)
        .unwrap()
        .with_max_message_size(1 << 20)
        .with_decompression_limit(256 << 20);
    for m in &messages {
        decoder.push(m).unwrap();
    }
    assert_eq!(decoder.finish().unwrap().unwrap().num_rows(), 16 << 20);
}

/// The same through a server with a 1 MiB message limit: refused, nothing stored or held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_refuses_a_compressed_batch_past_its_message_limit() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::with_max_message_size(&ctx, 1 << 20);
    let serving = Serving::start(server.clone(), None).await;
    let batch = zeros(16 << 20);
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .unwrap();
    let descriptor = FlightDescriptor::new_path(vec!["bomb".into()]);
    let messages = encoded(Some(descriptor), std::slice::from_ref(&batch), options).await;
    drop(batch);
    let status = raw_put(&serving.url, messages.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(server.get(b"bomb").is_none());
    eventually("nothing held", Duration::from_secs(5), || {
        ctx.bytes_allocated() == 0
    })
    .await;
    serving.stop().await;
    // A server that trusts its clients with more: the same message lands whole.
    let server = DeviceFlightServer::with_max_message_size(&ctx, 1 << 20)
        .with_decompression_limit(256 << 20);
    let serving = Serving::start(server.clone(), None).await;
    raw_put(&serving.url, messages).await.expect("stored");
    let stored = server.get(b"bomb").expect("stored");
    assert_eq!(stored.batches[0].num_rows(), 16 << 20);
    drop(stored);
    server.remove(b"bomb");
    serving.stop().await;
}

/// The flight's check counts each declared length as cudabuf-arrow lays it out (from a
/// 64-byte boundary), so a body between the two sums is `TooLarge` too (it passed the
/// flight's check and failed cudabuf-arrow's as `Device(InvalidData)`).
#[test]
fn the_decompression_limit_counts_buffers_as_laid_out() {
    let (_sim, ctx) = new_sim();
    // Three int64 columns of 3 rows: 24 bytes declared each, 64 laid out each.
    let batch = RecordBatch::try_from_iter_with_nullable([
        (
            "a",
            Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef,
            false,
        ),
        (
            "b",
            Arc::new(Int64Array::from(vec![4, 5, 6])) as ArrayRef,
            false,
        ),
        (
            "c",
            Arc::new(Int64Array::from(vec![7, 8, 9])) as ArrayRef,
            false,
        ),
    ])
    .unwrap();
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::LZ4_FRAME))
        .unwrap();
    let messages = runtime().block_on(encoded(None, std::slice::from_ref(&batch), options));
    for (limit, fits) in [(72, false), (150, false), (191, false), (192, true)] {
        let mut decoder = DeviceFlightDecoder::new(&ctx)
            .unwrap()
            .with_decompression_limit(limit);
        let result = messages
            .iter()
            .try_for_each(|m| decoder.push(m).map(drop))
            .and_then(|()| decoder.finish());
        if fits {
            assert_eq!(result.unwrap().unwrap().to_host().unwrap(), batch);
        } else {
            assert!(
                matches!(result, Err(FlightError::TooLarge { size, limit: l })
                    if l == limit && size > limit && size % 64 == 0),
                "limit {limit}: {result:?}"
            );
        }
    }
}

// ---- Schemas arrow-rs cannot build arrays of -------------------------------------

/// `FixedSizeBinary(-1)`: arrow-rs converts the schema but panics building even an empty
/// array of it (the echo of a schema-only exchange did, tearing the connection down).
/// Refused with the schema, `InvalidArgument`, on every call that takes one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_fixed_size_in_a_schema_is_invalid_argument() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx);
    let serving = Serving::start(server.clone(), None).await;
    let descriptor = || Some(FlightDescriptor::new_path(vec!["x".into()]));
    let exchanged = raw_exchange(&serving.url, vec![fsb_schema_message(-1, descriptor())]).await;
    let status = exchanged.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("negative fixed size"),
        "{status:?}"
    );
    let put = raw_put(&serving.url, vec![fsb_schema_message(-1, descriptor())]).await;
    assert_eq!(put.unwrap_err().code(), tonic::Code::InvalidArgument);
    assert!(server.get(b"x").is_none());
    // The decoder alone: InvalidData.
    let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
    let err = decoder.push(&fsb_schema_message(-1, None)).unwrap_err();
    assert!(matches!(err, FlightError::InvalidData(_)), "{err:?}");
    // A width of 0 is a valid type.
    let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
    decoder.push(&fsb_schema_message(0, None)).unwrap();
    serving.stop().await;
}

// ---- A client that stops reading a DoGet -------------------------------------------

/// A client that reads one message of a `DoGet` and then nothing (its connection healthy,
/// answering pings): the server ends the call after its idle timeout and frees what the
/// answer held, while the client still holds the call; reading on, the client gets what
/// was in flight and then `DeadlineExceeded`, never the end of a complete stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_get_client_that_stops_reading_is_dropped_after_the_idle_timeout() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx).with_limits(idle_limits(300));
    // About 48 MiB of batches: far more than the flow-control windows hold.
    let batches: Vec<_> = (0..6).map(|i| numbers(i, 400_000)).collect();
    server
        .insert("t", batches[0].schema(), upload(&batches, &ctx))
        .unwrap();
    drop(batches);
    let serving = Serving::start(server.clone(), None).await;
    let mut stalled = raw(&serving.url)
        .await
        .do_get(Ticket::new("t"))
        .await
        .unwrap()
        .into_inner();
    assert!(bounded(stalled.message()).await.unwrap().is_some());
    // Nothing but the stalled call refers to the flight's memory now.
    server.remove(b"t");
    assert!(ctx.bytes_allocated() > 0);
    let started = Instant::now();
    eventually(
        "the stalled answer's memory freed",
        Duration::from_secs(10),
        || ctx.bytes_allocated() == 0,
    )
    .await;
    eprintln!("freed {:?} after the flight was removed", started.elapsed());
    // Reading on: what was in flight, then the timeout's status.
    let ended = bounded(read_to_end(&mut stalled)).await;
    let status = ended.expect_err("a stream cut short must not end as complete");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    serving.stop().await;
}

/// The same for a `DoExchange` whose client sends its batches and reads none of the
/// answers for longer than the server's idle timeout: the server gives the answer up (and
/// with it what it had received), so the client, reading on, finds it cut with
/// `DeadlineExceeded` (it came whole, late, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_exchange_client_that_reads_no_answer_is_dropped_after_the_idle_timeout() {
    let (_sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx).with_limits(idle_limits(300));
    let serving = Serving::start(server.clone(), None).await;
    let batches: Vec<_> = (0..6).map(|i| numbers(i, 400_000)).collect();
    // Messages of at most 2 MiB (arrow-flight's default), so that the server reads the
    // upload as its answers go out.
    let messages: Vec<FlightData> = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec!["echo".into()])))
        .build(stream::iter(batches.into_iter().map(Ok)))
        .try_collect()
        .await
        .unwrap();
    let mut client = raw(&serving.url).await;
    let mut unread = bounded(client.do_exchange(stream::iter(messages)))
        .await
        .expect("the exchange starts")
        .into_inner();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ended = bounded(read_to_end(&mut unread)).await;
    let status = ended.expect_err("an answer given up must not end as complete");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    eventually("nothing held", Duration::from_secs(5), || {
        ctx.bytes_allocated() == 0
    })
    .await;
    serving.stop().await;
}

// ---- A server that answers a DoPut for ever, or stops reading it ------------------

/// A server that misbehaves on `DoPut`; every other call is `Unimplemented`.
#[derive(Clone, Default)]
struct Evil {
    /// The bytes of `PutResult` metadata sent so far.
    sent: Arc<AtomicUsize>,
    /// What its `DoPut` does.
    put: EvilPut,
}

/// How [`Evil`] answers a `DoPut`.
#[derive(Clone, Copy, Default)]
enum EvilPut {
    /// Read the whole upload, then answer with `PutResult`s for ever.
    #[default]
    EndlessResults,
    /// Read nothing and never answer.
    NeverReads,
    /// Read a message every this long, then answer one `PutResult`.
    SlowReads(Duration),
}

type Boxed<T> = BoxStream<'static, Result<T, Status>>;

#[tonic::async_trait]
impl FlightService for Evil {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoExchangeStream = Boxed<FlightData>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn do_get(&self, _: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let mut incoming = request.into_inner();
        match self.put {
            EvilPut::NeverReads => {
                // Hold the upload unread, and never answer.
                let _held = incoming;
                futures::future::pending::<()>().await;
                unreachable!();
            }
            EvilPut::SlowReads(pause) => {
                while incoming.message().await?.is_some() {
                    tokio::time::sleep(pause).await;
                }
                return Ok(Response::new(
                    stream::iter([Ok(PutResult::default())]).boxed(),
                ));
            }
            EvilPut::EndlessResults => {}
        }
        // Read the whole upload, then answer with PutResults for ever, 256 KiB of
        // app_metadata each.
        while incoming.message().await?.is_some() {}
        let sent = self.sent.clone();
        let meta = Bytes::from(vec![7u8; 256 << 10]);
        Ok(Response::new(
            stream::unfold((), move |()| {
                let sent = sent.clone();
                let meta = meta.clone();
                async move {
                    // 25 MiB/s: far inside every timeout.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    sent.fetch_add(meta.len(), Ordering::SeqCst);
                    Some((Ok(PutResult { app_metadata: meta }), ()))
                }
            })
            .boxed(),
        ))
    }
    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented(""))
    }
    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Err(Status::unimplemented(""))
    }
}

/// 256 KiB `PutResult`s for ever, faster than any timeout: the client keeps at most its
/// message limit of them and fails with `TooLarge` (it collected them all, without end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_put_results_are_too_large_past_the_message_limit() {
    let (_sim, ctx) = new_sim();
    let evil = Evil::default();
    let sent = evil.sent.clone();
    let serving = serve_evil(evil).await;
    let batch = numbers(1, 10);
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap()
        .with_max_message_size(4 << 20);
    let put = client.do_put(
        FlightDescriptor::new_path(vec!["p".into()]),
        batch.schema(),
        upload(std::slice::from_ref(&batch), &ctx),
    );
    let outcome = tokio::time::timeout(Duration::from_secs(10), put)
        .await
        .expect("do_put returns");
    assert!(
        matches!(outcome, Err(FlightError::TooLarge { limit, .. }) if limit == 4 << 20),
        "{outcome:?}"
    );
    // What the server got out before the client gave up: the limit, and what the
    // HTTP/2 windows and buffers held on the way.
    assert!(sent.load(Ordering::SeqCst) <= 16 << 20);
    serving.stop().await;
}

/// A server that reads nothing of a `DoPut` and never answers: once the flow-control
/// windows are full the transport takes no message, and the upload fails after the idle
/// timeout, not the (longer) call timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_reading_an_upload_is_an_idle_timeout() {
    let (_sim, ctx) = new_sim();
    let serving = serve_evil(Evil {
        put: EvilPut::NeverReads,
        ..Evil::default()
    })
    .await;
    // About 80 MiB: more than any window.
    let batches: Vec<_> = (0..10).map(|i| numbers(i, 400_000)).collect();
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap()
        .with_timeout(Some(Duration::from_secs(60)))
        .with_idle_timeout(Some(Duration::from_millis(500)));
    let started = Instant::now();
    let put = bounded(client.do_put(
        FlightDescriptor::new_path(vec!["p".into()]),
        batches[0].schema(),
        upload(&batches, &ctx),
    ))
    .await;
    let took = started.elapsed();
    match put {
        Err(FlightError::Timeout { what, after }) => {
            assert_eq!(after, Duration::from_millis(500));
            assert!(what.contains("upload"), "{what}");
        }
        other => panic!("expected the idle timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(30), "{took:?}");
    // Without an idle timeout, the call timeout bounds each wait of the upload instead.
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap()
        .with_timeout(Some(Duration::from_millis(500)))
        .with_idle_timeout(None);
    let put = bounded(client.do_put(
        FlightDescriptor::new_path(vec!["p".into()]),
        batches[0].schema(),
        upload(&batches, &ctx),
    ))
    .await;
    assert!(
        matches!(put, Err(FlightError::Timeout { after, .. }) if after == Duration::from_millis(500)),
        "{put:?}"
    );
    serving.stop().await;
}

async fn serve_evil(evil: Evil) -> Serving {
    Serving::start_with(move |listener, stopped| async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tonic::transport::Server::builder()
            .add_service(FlightServiceServer::new(evil))
            .serve_with_incoming_shutdown(incoming, async {
                stopped.await.ok();
            })
            .await?;
        Ok(())
    })
    .await
}

// ---- A long upload and the call timeout -------------------------------------------

/// A server that reads a message every 100 ms and answers once the whole upload is in
/// (as `DeviceFlightServer` does): the call timeout (600 ms) counts from the upload's last
/// message, so an upload of ten messages, longer than that timeout, completes (it failed
/// with `Timeout` while bytes were flowing). Each message (about 7 MB) is larger than the
/// server's flow-control window, so the last one is taken only once the server has read
/// most of the ones before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_longer_than_the_call_timeout_completes() {
    let (_sim, ctx) = new_sim();
    let pause = Duration::from_millis(100);
    let serving = serve_evil(Evil {
        put: EvilPut::SlowReads(pause),
        ..Evil::default()
    })
    .await;
    let batches: Vec<_> = (0..10).map(|i| numbers(i, 200_000)).collect();
    let timeout = Duration::from_millis(600);
    let mut client = FlightDeviceClient::connect(&serving.url, None)
        .await
        .unwrap()
        .with_timeout(Some(timeout))
        .with_idle_timeout(Some(Duration::from_secs(30)));
    let started = Instant::now();
    let answers = bounded(client.do_put(
        FlightDescriptor::new_path(vec!["big".into()]),
        batches[0].schema(),
        upload(&batches, &ctx),
    ))
    .await
    .expect("the upload completes");
    let took = started.elapsed();
    assert_eq!(answers.len(), 1);
    // The schema message and ten batches, each read after a pause.
    assert!(took >= pause * 11, "{took:?}");
    assert!(took > timeout, "{took:?}");
    serving.stop().await;
}

// ---- A token that cannot be sent ------------------------------------------------

/// Found before anything is sent: `InvalidArgument`, not a status as if the server had
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_is_not_a_header_value_is_invalid_argument() {
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:1").connect_lazy();
    let mut client = FlightDeviceClient::new(channel, Some("line\nbreak"));
    let err = client
        .get_flight_info(FlightDescriptor::new_path(vec!["x".into()]))
        .await
        .unwrap_err();
    assert!(matches!(err, FlightError::InvalidArgument(_)), "{err:?}");
    assert_eq!(err.code(), None);
}
