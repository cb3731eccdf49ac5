//! Fuzz target: bytes as an Arrow IPC file (`DeviceFileReader`: the footer parser, the
//! `Block` checks, metadata, projection, compressed bodies) and as an IPC stream file
//! (`DeviceStreamReader::from_path`), on a simulator context.
//!
//! For every input: opening and reading every batch (all columns, then the first column
//! alone) gives batches or typed errors (`InvalidData`, `Unsupported`, `OutOfRange`,
//! `InvalidArgument`); a batch read copies to the host or fails with `InvalidData`; and
//! `bytes_allocated` is back where it was once everything is dropped. Any panic
//! (including an arithmetic overflow: cargo-fuzz builds with debug assertions) or an
//! address-sanitizer report is a crash.
//!
//! The readers take a path, so the input is written to one scratch file per process in
//! the temporary directory. The decompression limit is lowered to 64 MiB so that a
//! lying length is refused rather than allocated. Seeds: `fuzz/seeds/arrow_file/`
//! (`cargo +nightly fuzz run arrow_file fuzz/seeds/arrow_file`; see its README).

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use cudabuf_arrow::{DeviceFileReader, DeviceRecordBatch, DeviceStreamReader};
use cudabuf_core::{Backend, Context, Error, ErrorKind, Result};
use cudabuf_sim::SimBackend;
use libfuzzer_sys::fuzz_target;

const LIMIT: usize = 64 << 20;

fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| Backend::new(SimBackend::new()).context(0).expect("context(0)"))
}

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("cudabuf-fuzz-arrow-file-{}", std::process::id()))
    })
}

fn check(e: &Error) {
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidData
                | ErrorKind::Unsupported
                | ErrorKind::OutOfRange
                | ErrorKind::InvalidArgument
        ),
        "untyped error: {e}"
    );
}

fn land(batch: Result<DeviceRecordBatch>) {
    match batch {
        Ok(batch) => {
            if let Err(e) = batch.to_host() {
                assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
            }
        }
        Err(e) => check(&e),
    }
}

fn read_file(ctx: &Context) {
    let mut reader = match DeviceFileReader::open(scratch(), ctx) {
        Ok(reader) => reader,
        Err(e) => return check(&e),
    };
    reader.set_decompression_limit(LIMIT);
    let first = !reader.file_schema().fields().is_empty();
    for i in 0..reader.num_batches() {
        land(reader.read_batch(i));
    }
    if first {
        match reader.with_projection(&[0]) {
            Ok(mut projected) => {
                projected.set_decompression_limit(LIMIT);
                projected.for_each(land);
            }
            Err(e) => check(&e),
        }
    }
}

fn read_stream(ctx: &Context) {
    match DeviceStreamReader::from_path(scratch(), ctx) {
        Ok(mut reader) => {
            reader.set_decompression_limit(LIMIT);
            reader.for_each(land);
        }
        Err(e) => check(&e),
    }
}

fuzz_target!(|data: &[u8]| {
    let ctx = ctx();
    let before = ctx.bytes_allocated();
    std::fs::write(scratch(), data).expect("writing the scratch file");
    read_file(ctx);
    read_stream(ctx);
    assert_eq!(ctx.bytes_allocated(), before, "device memory given back");
});
