//! cudabuf-flight on the simulator: round trips over loopback gRPC, the bearer token,
//! DoPut into device memory, and an untrusted peer's bad messages (typed errors, nothing
//! leaked). Every network call is bounded by a timeout.

use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor, SchemaAsIpc};
use bytes::Bytes;
use cudabuf_arrow::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int32Array, Int64Array, ListArray, RecordBatch,
    StringArray,
};
use cudabuf_arrow::arrow::datatypes::{Int32Type, Schema};
use cudabuf_arrow::arrow::ipc::writer::IpcWriteOptions;
use cudabuf_arrow::arrow::ipc::CompressionType;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::Context;
use cudabuf_flight::{
    DeviceBatchStream, DeviceFlightDecoder, DeviceFlightServer, FlightDeviceClient, FlightError,
};
use cudabuf_sim::FaultOp;
use futures::{stream, StreamExt, TryStreamExt};

mod common;
use common::{assert_clean, bounded, new_sim, to_host, upload, Serving};

fn mixed(start: i32, rows: i32) -> RecordBatch {
    let ids: Vec<i32> = (start..start + rows).collect();
    let list = ListArray::from_iter_primitive::<Int32Type, _, _>(
        ids.iter()
            .map(|&i| (i % 4 != 0).then(|| (0..i % 3).map(Some).collect::<Vec<_>>())),
    );
    RecordBatch::try_from_iter_with_nullable([
        (
            "id",
            Arc::new(Int32Array::from(ids.clone())) as ArrayRef,
            false,
        ),
        (
            "big",
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|&i| i as i64 * 1_000_003),
            )) as _,
            false,
        ),
        (
            "score",
            Arc::new(Float64Array::from_iter(
                ids.iter()
                    .map(|&i| (i % 5 != 0).then_some(f64::from(i) / 4.0)),
            )) as _,
            true,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(
                ids.iter().map(|&i| (i % 6 != 0).then(|| format!("n{i}"))),
            )) as _,
            true,
        ),
        (
            "flag",
            Arc::new(BooleanArray::from_iter(
                ids.iter().map(|&i| Some(i % 2 == 0)),
            )) as _,
            false,
        ),
        ("list", Arc::new(list) as _, true),
    ])
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_get_lands_every_batch_on_the_device_and_nothing_leaks() {
    let (sim, server_ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let batches = vec![mixed(0, 1000), mixed(1000, 0), mixed(1000, 77)];
    let server = DeviceFlightServer::new(&server_ctx);
    server
        .insert("t", batches[0].schema(), upload(&batches, &server_ctx))
        .unwrap();
    server.insert("empty", batches[0].schema(), vec![]).unwrap();
    let serving = Serving::start(server.clone(), None).await;

    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();
    let stream = bounded(client.do_get("t", &client_ctx)).await.unwrap();
    assert_eq!(stream.schema(), &batches[0].schema());
    let got: Vec<DeviceRecordBatch> = bounded(stream.try_collect()).await.unwrap();
    // arrow-rs's encoder sends no message for the batch of 0 rows.
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|b| b.context().same_as(&client_ctx)));
    assert!(client_ctx.bytes_allocated() > 0);
    assert_eq!(to_host(&got), vec![batches[0].clone(), batches[2].clone()]);
    drop(got);
    assert_eq!(client_ctx.bytes_allocated(), 0);

    // A schema-only flight: the schema, no batches.
    let stream = bounded(client.do_get("empty", &client_ctx)).await.unwrap();
    assert_eq!(stream.schema(), &batches[0].schema());
    assert_eq!(bounded(stream.count()).await, 0);

    // An unknown ticket is the server's NotFound.
    let err = bounded(client.do_get("nothing", &client_ctx))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");

    // GetFlightInfo describes the flight, its ticket the key.
    let info = bounded(client.get_flight_info(FlightDescriptor::new_path(vec!["t".into()])))
        .await
        .unwrap();
    assert_eq!(info.total_records, 1077);
    assert_eq!(&info.endpoint[0].ticket.as_ref().unwrap().ticket[..], b"t");
    assert_eq!(info.try_decode_schema().unwrap(), *batches[0].schema());

    drop(client);
    serving.stop().await;
    drop(server);
    assert_eq!(server_ctx.bytes_allocated(), 0);
    assert_clean(sim, server_ctx);
    assert_clean(client_sim, client_ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_batches_arrive_in_several_messages_and_uploads() {
    let (sim, ctx) = new_sim();
    // 3 MiB of int64: arrow-rs's encoder splits it into messages of at most 2 MiB.
    let big = RecordBatch::try_from_iter([(
        "v",
        Arc::new(Int64Array::from_iter_values(0..(3 << 17))) as ArrayRef,
    )])
    .unwrap();
    let server = DeviceFlightServer::new(&ctx);
    server
        .insert(
            "big",
            big.schema(),
            upload(std::slice::from_ref(&big), &ctx),
        )
        .unwrap();
    let serving = Serving::start(server.clone(), None).await;
    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();
    let got: Vec<_> = bounded(async {
        client
            .do_get("big", &ctx)
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .unwrap();
    assert!(got.len() >= 2, "{} message(s)", got.len());
    let host = to_host(&got);
    let joined = cudabuf_arrow::arrow::compute::concat_batches(&big.schema(), &host).unwrap();
    assert_eq!(joined, big);
    drop((got, client));
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_the_bearer_token_are_unauthenticated() {
    let (sim, ctx) = new_sim();
    let batch = mixed(0, 10);
    let server = DeviceFlightServer::new(&ctx);
    server
        .insert(
            "t",
            batch.schema(),
            upload(std::slice::from_ref(&batch), &ctx),
        )
        .unwrap();
    let serving = Serving::start(server.clone(), Some("s3cret")).await;

    for token in [None, Some("wrong"), Some("s3cre"), Some("s3cret!")] {
        let mut client = bounded(FlightDeviceClient::connect(&serving.url, token))
            .await
            .unwrap();
        let err = bounded(client.do_get("t", &ctx)).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(tonic::Code::Unauthenticated),
            "{token:?}: {err}"
        );
        let err = bounded(client.get_flight_info(FlightDescriptor::new_path(vec!["t".into()])))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(tonic::Code::Unauthenticated),
            "{token:?}: {err}"
        );
    }
    // An unauthenticated DoPut changes nothing.
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let put = put_stream(&batch, "intruder", IpcWriteOptions::default());
    let err = bounded(FlightServiceClient::new(channel).do_put(put))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(server.keys(), vec![b"t".to_vec()]);

    let mut client = bounded(FlightDeviceClient::connect(&serving.url, Some("s3cret")))
        .await
        .unwrap();
    let got: Vec<_> = bounded(async {
        client
            .do_get("t", &ctx)
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .unwrap();
    assert_eq!(to_host(&got), vec![batch]);
    drop((got, client));
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
}

/// The FlightData of a DoPut of `batch` under the path `key`.
fn put_stream(
    batch: &RecordBatch,
    key: &str,
    options: IpcWriteOptions,
) -> impl futures::Stream<Item = FlightData> + Send + 'static {
    let encoded = FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![key.into()])))
        .build(stream::iter([Ok(batch.clone())]));
    encoded.map(|m| m.expect("encodes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn do_put_lands_on_the_device_plain_and_lz4() {
    let (sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx);
    let serving = Serving::start(server.clone(), None).await;
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = FlightServiceClient::new(channel);
    let batch = mixed(5, 3000);
    let lz4 = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::LZ4_FRAME))
        .unwrap();
    for (key, options) in [("plain", IpcWriteOptions::default()), ("lz4", lz4)] {
        let results: Vec<_> = bounded(async {
            raw.do_put(put_stream(&batch, key, options))
                .await
                .unwrap()
                .into_inner()
                .try_collect::<Vec<_>>()
                .await
        })
        .await
        .unwrap();
        assert_eq!(results.len(), 1);
        let flight = server.get(key.as_bytes()).expect("stored");
        assert!(flight.batches.iter().all(|b| b.context().same_as(&ctx)));
        assert_eq!(to_host(&flight.batches), vec![batch.clone()], "{key}");
    }
    assert!(ctx.bytes_allocated() > 0);
    // A DoPut without a descriptor is refused.
    let no_descriptor = FlightDataEncoderBuilder::new()
        .build(stream::iter([Ok(batch.clone())]))
        .map(|m| m.unwrap());
    let err = bounded(raw.do_put(no_descriptor)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    drop(raw);
    serving.stop().await;
    drop(server);
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_do_put_is_refused_and_nothing_is_kept() {
    let (sim, ctx) = new_sim();
    let server = DeviceFlightServer::with_max_message_size(&ctx, 256 << 10);
    let serving = Serving::start(server.clone(), None).await;
    let channel = tonic::transport::Endpoint::from_shared(serving.url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = FlightServiceClient::new(channel);
    for rows in [33_000, 200_000] {
        // 264 KB (over the limit, within tonic's headroom), then 1.6 MB (over both).
        let batch = RecordBatch::try_from_iter([(
            "v",
            Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
        )])
        .unwrap();
        let err = bounded(async {
            raw.do_put(put_stream(&batch, "big", IpcWriteOptions::default()))
                .await?
                .into_inner()
                .try_collect::<Vec<_>>()
                .await
        })
        .await
        .unwrap_err();
        assert!(
            matches!(
                err.code(),
                tonic::Code::ResourceExhausted | tonic::Code::OutOfRange
            ),
            "{rows}: {err}"
        );
    }
    assert!(server.keys().is_empty());
    drop(raw);
    serving.stop().await;
    assert_eq!(ctx.bytes_allocated(), 0);
    drop(server);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_do_get_message_is_a_typed_error() {
    let (sim, ctx) = new_sim();
    let (client_sim, client_ctx) = new_sim();
    let server = DeviceFlightServer::new(&ctx);
    let batch = |rows| {
        RecordBatch::try_from_iter([(
            "v",
            Arc::new(Int64Array::from_iter_values(0..rows)) as ArrayRef,
        )])
        .unwrap()
    };
    server
        .insert("near", batch(0).schema(), upload(&[batch(33_000)], &ctx))
        .unwrap();
    server
        .insert("far", batch(0).schema(), upload(&[batch(200_000)], &ctx))
        .unwrap();
    let serving = Serving::start(server.clone(), None).await;
    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap()
        .with_max_message_size(256 << 10);
    let near: Vec<_> = bounded(client.do_get("near", &client_ctx).await.unwrap().collect()).await;
    assert!(
        matches!(near[..], [Err(FlightError::TooLarge { limit, .. })] if limit == 256 << 10),
        "{near:?}"
    );
    let far: Vec<_> = bounded(client.do_get("far", &client_ctx).await.unwrap().collect()).await;
    assert!(
        matches!(&far[..], [Err(e)] if e.code() == Some(tonic::Code::OutOfRange)),
        "{far:?}"
    );
    assert_eq!(client_ctx.bytes_allocated(), 0);
    drop(client);
    serving.stop().await;
    drop(server);
    assert_clean(sim, ctx);
    assert_clean(client_sim, client_ctx);
}

// ---- An untrusted peer, message by message --------------------------------------------

fn schema_message(schema: &Schema) -> FlightData {
    FlightData::from(SchemaAsIpc::new(schema, &IpcWriteOptions::default()))
}

fn batch_message(batch: &RecordBatch) -> FlightData {
    let mut messages =
        arrow_flight::utils::batches_to_flight_data(&batch.schema(), [batch]).unwrap();
    assert_eq!(messages.len(), 2);
    messages.pop().unwrap()
}

/// `header` with one little-endian `from` replaced by `to`: the occurrence after whose
/// replacement `field` of the parsed message reads `to`.
fn patch_i64(
    header: &Bytes,
    from: i64,
    to: i64,
    field: impl Fn(cudabuf_arrow::arrow::ipc::Message<'_>) -> i64,
) -> Bytes {
    let needle = from.to_le_bytes();
    (0..header.len().saturating_sub(7))
        .filter(|&at| header[at..at + 8] == needle)
        .map(|at| {
            let mut patched = header.to_vec();
            patched[at..at + 8].copy_from_slice(&to.to_le_bytes());
            patched
        })
        .find(|patched| {
            cudabuf_arrow::arrow::ipc::root_as_message(patched).is_ok_and(|m| field(m) == to)
        })
        .map(Bytes::from)
        .expect("the field's bytes")
}

/// Push `messages` into a fresh decoder; the first error, with every allocation gone
/// once the decoder is dropped.
fn decode_error(ctx: &Context, messages: &[FlightData]) -> FlightError {
    let mut decoder = DeviceFlightDecoder::new(ctx).unwrap();
    let mut kept = Vec::new();
    let err = messages
        .iter()
        .find_map(|m| match decoder.push(m) {
            Ok(batch) => {
                kept.extend(batch);
                None
            }
            Err(e) => Some(e),
        })
        .or_else(|| decoder.finish().err())
        .expect("an error");
    drop((decoder, kept));
    assert_eq!(ctx.bytes_allocated(), 0, "after {err}");
    err
}

#[test]
fn untrusted_messages_are_typed_errors_and_free_everything() {
    let (sim, ctx) = new_sim();
    let batch = mixed(0, 100);
    let schema = schema_message(&batch.schema());
    let good = batch_message(&batch);
    let body_len = good.data_body.len();

    // The body is shorter than the metadata says.
    let mut short = good.clone();
    short.data_body = good.data_body.slice(..body_len - 8);
    let err = decode_error(&ctx, &[schema.clone(), short]);
    assert!(matches!(err, FlightError::InvalidData(_)), "{err}");

    // The metadata lies about the body length: too small for its buffers, or negative.
    for lie in [8, -1] {
        let mut lying = good.clone();
        lying.data_header = patch_i64(&good.data_header, body_len as i64, lie, |m| m.bodyLength());
        let err = decode_error(&ctx, &[schema.clone(), lying]);
        assert!(
            matches!(err, FlightError::InvalidData(_) | FlightError::Device(_)),
            "{lie}: {err}"
        );
    }

    // A row count far beyond what the buffers hold.
    let mut rows = good.clone();
    rows.data_header = patch_i64(&good.data_header, 100, 1 << 40, |m| {
        m.header_as_record_batch().map_or(0, |b| b.length())
    });
    let err = decode_error(&ctx, &[schema.clone(), rows]);
    assert!(matches!(err, FlightError::Device(_)), "{err}");

    // Corrupt metadata: every single-byte change of the header is refused or decodes
    // (a byte of padding); none panics, none leaks.
    let mut refused = 0;
    for at in 0..good.data_header.len() {
        let mut header = good.data_header.to_vec();
        header[at] ^= 0xFF;
        let mut corrupt = good.clone();
        corrupt.data_header = Bytes::from(header);
        let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
        decoder.push(&schema).unwrap();
        let outcome = decoder.push(&corrupt).and_then(|_| decoder.finish());
        if let Ok(Some(batch)) = &outcome {
            // A corrupt value that still describes a valid layout: to_host validates it.
            let _ = batch.to_host();
        }
        refused += usize::from(outcome.is_err());
        drop((outcome, decoder));
        assert_eq!(ctx.bytes_allocated(), 0, "byte {at}");
    }
    assert!(refused > good.data_header.len() / 4, "{refused} refused");

    // Garbage, a body without header, a batch before the schema, two schemas.
    let garbage = FlightData::new().with_data_header(Bytes::from_static(&[7; 40]));
    assert!(matches!(
        decode_error(&ctx, &[garbage]),
        FlightError::InvalidData(_)
    ));
    let headless = FlightData::new().with_data_body(Bytes::from_static(&[1; 16]));
    assert!(matches!(
        decode_error(&ctx, &[headless]),
        FlightError::InvalidData(_)
    ));
    assert!(matches!(
        decode_error(&ctx, std::slice::from_ref(&good)),
        FlightError::InvalidData(_)
    ));
    assert!(matches!(
        decode_error(&ctx, &[schema.clone(), schema.clone()]),
        FlightError::InvalidData(_)
    ));

    // Over the limit: refused before anything is allocated.
    let mut decoder = DeviceFlightDecoder::new(&ctx)
        .unwrap()
        .with_max_message_size(1024);
    decoder.push(&schema).unwrap();
    let err = decoder.push(&good).unwrap_err();
    assert!(
        matches!(err, FlightError::TooLarge { size, limit: 1024 } if size == good.data_header.len() + body_len),
        "{err}"
    );
    drop(decoder);

    assert_clean(sim, ctx);
}

#[test]
fn empty_batches_decode_to_batches_of_no_rows() {
    let (sim, ctx) = new_sim();
    let empty = mixed(0, 0);
    let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
    assert!(decoder
        .push(&schema_message(&empty.schema()))
        .unwrap()
        .is_none());
    assert!(decoder.push(&batch_message(&empty)).unwrap().is_none());
    let first = decoder
        .push(&batch_message(&empty))
        .unwrap()
        .expect("the first");
    let second = decoder.finish().unwrap().expect("the second");
    assert!(decoder.finish().unwrap().is_none());
    assert_eq!(decoder.batches(), 2);
    for batch in [first, second] {
        assert_eq!(batch.num_rows(), 0);
        assert_eq!(batch.to_host().unwrap(), empty);
    }
    drop(decoder);
    assert_clean(sim, ctx);
}

/// The first body pins nothing on the decoder's path (it is copied straight from the
/// message, every pinned allocation failing changes nothing); the two staging buffers of
/// its size class are pinned in the background, and the bodies after it go through them,
/// reused rather than pinned anew.
#[test]
fn bodies_go_through_two_pooled_pinned_staging_buffers() {
    let (sim, ctx) = new_sim();
    ctx.set_staging_pool_limit(1 << 20);
    let batch = mixed(0, 200);
    let message = batch_message(&batch);
    let class = message.data_body.len().max(64 << 10).next_power_of_two();
    let mut decoder = DeviceFlightDecoder::new(&ctx).unwrap();
    decoder.push(&schema_message(&batch.schema())).unwrap();
    let injected = cudabuf_core::Error::OutOfMemory {
        device: 0,
        requested: 0,
        detail: "injected".into(),
    };
    sim.fail_randomly(FaultOp::AllocHost, 1.0, 3, injected)
        .unwrap();
    let mut landed: Vec<_> = decoder.push(&message).unwrap().into_iter().collect();
    ctx.wait_background_pinning();
    assert_eq!(
        sim.op_count(FaultOp::AllocHost),
        1,
        "the background try alone"
    );
    sim.clear_faults();
    landed.extend(decoder.push(&message).unwrap());
    ctx.wait_background_pinning();
    assert_eq!(ctx.staging_buffers_pinned_in_background(), 2);
    let pins = sim.op_count(FaultOp::AllocHost);
    for _ in 0..10 {
        landed.extend(decoder.push(&message).unwrap());
        // One body in flight, the one before it back in the pool: never more than two
        // staging buffers.
        assert!(ctx.bytes_pooled() <= class, "{} pooled", ctx.bytes_pooled());
    }
    landed.extend(decoder.finish().unwrap());
    assert_eq!(
        sim.op_count(FaultOp::AllocHost),
        pins,
        "nothing pinned anew"
    );
    assert_eq!(ctx.bytes_pooled(), 2 * class);
    assert_eq!(landed.len(), 12);
    for batch_on_device in &landed {
        assert_eq!(batch_on_device.to_host().unwrap(), batch);
    }
    drop((landed, decoder));
    assert_eq!(ctx.bytes_allocated(), 0);
    assert_clean(sim, ctx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_way_is_an_error_after_the_batches_before() {
    let (sim, ctx) = new_sim();
    let batch = mixed(0, 50);
    let incoming = stream::iter([
        Ok(schema_message(&batch.schema())),
        Ok(batch_message(&batch)),
        Ok(batch_message(&batch)),
        Err(FlightError::from(tonic::Status::unavailable(
            "h2 protocol error: stream reset mid-message",
        ))),
    ])
    .boxed();
    let stream = bounded(DeviceBatchStream::start(
        incoming,
        DeviceFlightDecoder::new(&ctx).unwrap(),
    ))
    .await
    .unwrap();
    let items: Vec<_> = bounded(stream.collect()).await;
    // Both batches came out (the second, received whole, once its upload was done),
    // then the error; the stream ended there.
    assert_eq!(items.len(), 3, "{items:?}");
    for item in &items[..2] {
        assert_eq!(item.as_ref().unwrap().to_host().unwrap(), batch);
    }
    assert_eq!(
        items[2].as_ref().unwrap_err().code(),
        Some(tonic::Code::Unavailable)
    );
    drop(items);
    assert_eq!(ctx.bytes_allocated(), 0);

    // A stream that ends before its schema.
    let err = bounded(DeviceBatchStream::start(
        stream::empty().boxed(),
        DeviceFlightDecoder::new(&ctx).unwrap(),
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, FlightError::InvalidData(_)), "{err}");
    assert_clean(sim, ctx);
}
