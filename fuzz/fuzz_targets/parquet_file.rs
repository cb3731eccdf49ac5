//! Fuzz target: bytes as a Parquet file through `DeviceParquetReader` (footer, column
//! chunk checks, decoding on the worker thread, upload), on a simulator context.
//!
//! For every input: opening and reading every batch gives batches or typed errors
//! (`InvalidData`, `Unsupported`); a batch read copies to the host or fails with
//! `InvalidData`; and `bytes_allocated` is back where it was once the reader is dropped.
//!
//! libfuzzer-sys's panic hook aborts at the panic, before the reader's `catch_unwind`
//! could turn a panic inside the `parquet` crate into `InvalidData`. The `parquet` crate
//! does panic on some corrupt pages (an out-of-bounds bit range in its definition-level
//! decoder, found here), so this target puts a hook in front of libfuzzer-sys's that
//! lets panics raised inside the reader's calls into the `parquet` crate (those under its
//! `catch_unwind`, as `cudabuf_arrow::in_parquet_panic_guard()` tells on the panicking
//! thread) unwind to that guard, and hands every other panic to libfuzzer-sys's hook: a
//! panic in cudabuf-arrow's own code outside those calls, on the caller's thread or a
//! decoding thread, is still a crash. cudabuf-arrow's code that the `parquet` crate calls
//! back inside them (the `ChunkReader` that reads the file for it) runs under the guard:
//! a panic there is let through as well, and becomes `InvalidData`.
//! `CUDABUF_FUZZ_PARQUET_PANICS=1` makes every panic a crash, to find the `parquet`
//! crate's (and those callbacks').
//!
//! Seeds: `fuzz/seeds/parquet_file/` (`cargo +nightly fuzz run parquet_file
//! fuzz/seeds/parquet_file`; see its README).

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use cudabuf_arrow::DeviceParquetReader;
use cudabuf_core::{Backend, Context, ErrorKind};
use cudabuf_sim::SimBackend;
use libfuzzer_sys::fuzz_target;

fn ctx() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| {
        if std::env::var_os("CUDABUF_FUZZ_PARQUET_PANICS").is_none() {
            let abort = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                if !cudabuf_arrow::in_parquet_panic_guard() {
                    abort(info);
                }
            }));
        }
        Backend::new(SimBackend::new()).context(0).expect("context(0)")
    })
}

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("cudabuf-fuzz-parquet-{}", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let ctx = ctx();
    let before = ctx.bytes_allocated();
    std::fs::write(scratch(), data).expect("writing the scratch file");
    match DeviceParquetReader::open(scratch(), ctx, None) {
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::Unsupported),
            "{e}"
        ),
        Ok(reader) => {
            for batch in reader {
                match batch {
                    Ok(batch) => {
                        if let Err(e) = batch.to_host() {
                            assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
                        }
                    }
                    Err(e) => assert!(
                        matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::Unsupported),
                        "{e}"
                    ),
                }
            }
        }
    }
    assert_eq!(ctx.bytes_allocated(), before, "device memory given back");
});
