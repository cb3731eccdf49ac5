//! Fuzz target: bytes as a sequence of Arrow Flight `FlightData` messages pushed into
//! cudabuf-flight's `DeviceFlightDecoder` (the decoder of a `DoGet`'s answer and of a
//! `DoPut`), on a simulator context.
//!
//! The input is cut into messages: each is three little-endian `u32` lengths (header,
//! body, `app_metadata`) followed by those bytes; a length past the end of the input takes
//! what remains; at most 64 messages. `fuzz/seeds/flight_decoder/` holds real streams in
//! this form (written by `tests/untrusted.rs` in cudabuf-flight; see
//! `fuzz/seeds/README.md`).
//!
//! For every input: each push gives a batch, nothing, or a typed error (`InvalidData`,
//! `TooLarge`, `Unsupported`, or a device error of kind `InvalidData`, `OutOfRange` or
//! `InvalidArgument`), after which the decoder is dropped; a batch copies to the host or
//! fails with `InvalidData`; and `bytes_allocated` is back where it was once everything
//! is dropped. The message limit is 1 MiB and the decompression limit 64 MiB, so a lying
//! length is refused rather than allocated. Any panic (including an arithmetic overflow:
//! cargo-fuzz builds with debug assertions), an allocation over libFuzzer's limit or an
//! address-sanitizer report is a crash.

#![no_main]

use std::sync::OnceLock;

use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::{Backend, Context, ErrorKind};
use cudabuf_flight::arrow_flight::FlightData;
use cudabuf_flight::{DeviceFlightDecoder, FlightError};
use cudabuf_sim::SimBackend;
use libfuzzer_sys::fuzz_target;

const MESSAGE_LIMIT: usize = 1 << 20;
const DECOMPRESSION_LIMIT: usize = 64 << 20;
const MAX_MESSAGES: usize = 64;

fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| Backend::new(SimBackend::new()).context(0).expect("context(0)"))
}

/// The messages framed in `data` (see the module documentation).
fn messages(mut data: &[u8]) -> Vec<FlightData> {
    let mut messages = Vec::new();
    while messages.len() < MAX_MESSAGES {
        let Some((lengths, rest)) = data.split_first_chunk::<12>() else {
            break;
        };
        data = rest;
        let mut part = |at: usize| {
            let len = u32::from_le_bytes(lengths[at..at + 4].try_into().unwrap()) as usize;
            let (bytes, rest) = data.split_at(len.min(data.len()));
            data = rest;
            bytes.to_vec()
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

fn check(e: &FlightError) {
    let typed = match e {
        FlightError::InvalidData(_) | FlightError::TooLarge { .. } | FlightError::Unsupported(_) => {
            true
        }
        FlightError::Device(e) => matches!(
            e.kind(),
            ErrorKind::InvalidData | ErrorKind::OutOfRange | ErrorKind::InvalidArgument
        ),
        _ => false,
    };
    assert!(typed, "untyped error: {e:?}");
}

fn land(batch: DeviceRecordBatch) {
    if let Err(e) = batch.to_host() {
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    }
}

fn decode(ctx: &Context, messages: &[FlightData]) {
    let mut decoder = DeviceFlightDecoder::new(ctx)
        .expect("a decoder")
        .with_max_message_size(MESSAGE_LIMIT)
        .with_decompression_limit(DECOMPRESSION_LIMIT);
    for message in messages {
        match decoder.push(message) {
            Ok(batch) => batch.into_iter().for_each(land),
            Err(e) => return check(&e),
        }
    }
    match decoder.finish() {
        Ok(batch) => batch.into_iter().for_each(land),
        Err(e) => check(&e),
    }
}

fuzz_target!(|data: &[u8]| {
    let ctx = ctx();
    let before = ctx.bytes_allocated();
    decode(ctx, &messages(data));
    assert_eq!(ctx.bytes_allocated(), before, "device memory given back");
});
