//! Parquet files into device memory (feature `parquet`): DeviceParquetReader and
//! read_parquet against arrow-rs's ArrowWriter and ParquetRecordBatchReader, and corrupt
//! files.

use std::fs::File;

use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::record_batch::{RecordBatch, RecordBatchReader};
use cudabuf_arrow::{read_parquet, DeviceParquetReader};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;

use super::context;
use super::data::{self, batch};
use super::files::TempFile;

fn compressions() -> [Compression; 4] {
    [
        Compression::UNCOMPRESSED,
        Compression::SNAPPY,
        Compression::LZ4_RAW,
        Compression::ZSTD(ZstdLevel::try_new(3).unwrap()),
    ]
}

/// arrow-rs's Parquet file of `batches`, row groups of at most `rows` rows.
fn parquet_bytes(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    compression: Compression,
    rows: usize,
) -> Vec<u8> {
    let props = WriterProperties::builder()
        .set_compression(compression)
        .set_max_row_group_row_count(Some(rows))
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema.clone(), Some(props)).unwrap();
    for b in batches {
        writer.write(b).unwrap();
    }
    writer.close().unwrap();
    out
}

/// What arrow-rs reads from the file on the host, as one batch.
fn arrow_rs_read(path: &std::path::Path) -> RecordBatch {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let schema = reader.schema();
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
    concat_batches(&schema, &batches).unwrap()
}

fn parquet_sets() -> Vec<(&'static str, SchemaRef, Vec<RecordBatch>)> {
    let basic = batch(vec![
        ("ints", data::ints()),
        ("floats", data::floats()),
        ("bools", data::bools().slice(0, 6)),
        ("strings", data::strings()),
    ]);
    let nested = batch(vec![
        ("list", data::list().slice(0, 4)),
        ("struct", data::structs()),
    ]);
    let dictionary = batch(vec![
        (
            "city",
            data::dictionary(&[Some("paris"), None, Some("oslo"), Some("paris")]),
        ),
        ("n", data::ints().slice(0, 4)),
    ]);
    let many: Vec<RecordBatch> = (0..12).map(|i| data::large(100).slice(i, 50)).collect();
    vec![
        (
            "basic",
            basic.schema(),
            vec![basic.clone(), basic.slice(1, 3)],
        ),
        ("nested", nested.schema(), vec![nested]),
        ("dictionary", dictionary.schema(), vec![dictionary]),
        ("empty", basic.schema(), vec![basic.slice(0, 0)]),
        ("many", many[0].schema(), many),
    ]
}

fn device_concat(
    ctx: &Context,
    path: &std::path::Path,
    columns: Option<&[&str]>,
) -> (SchemaRef, RecordBatch, usize) {
    let batches = read_parquet(path, ctx, columns).unwrap();
    let reader = DeviceParquetReader::open(path, ctx, columns).unwrap();
    let schema = reader.schema().clone();
    let host: Vec<RecordBatch> = batches.iter().map(|b| b.to_host().unwrap()).collect();
    (
        schema.clone(),
        concat_batches(&schema, &host).unwrap(),
        batches.len(),
    )
}

pub(crate) fn parquet_round_trips_every_schema_and_codec_like_arrow_rs(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (name, schema, batches) in parquet_sets() {
        for compression in compressions() {
            let file =
                TempFile::with_bytes(name, &parquet_bytes(&schema, &batches, compression, 64));
            let expected = arrow_rs_read(file.path());
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            assert_eq!(expected.num_rows(), rows);
            let (read_schema, read, count) = device_concat(&ctx, file.path(), None);
            assert_eq!(read_schema, expected.schema(), "{name} {compression:?}");
            assert_eq!(read, expected, "{name} {compression:?}");
            let reader = DeviceParquetReader::open(file.path(), &ctx, None).unwrap();
            assert_eq!(reader.num_rows(), rows, "{name}");
            // One batch per row group (of at most 64 rows; none for an empty file).
            assert_eq!(count, reader.num_row_groups().min(rows), "{name}");
            assert_eq!(reader.num_row_groups(), rows.div_ceil(64), "{name}");
        }
    }
    Ok(())
}

pub(crate) fn parquet_projection_reads_the_named_columns_in_order(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (_, schema, batches) = parquet_sets().remove(0);
    let file = TempFile::with_bytes(
        "projection",
        &parquet_bytes(&schema, &batches, Compression::SNAPPY, 5),
    );
    let expected = arrow_rs_read(file.path());
    let (read_schema, read, _) = device_concat(&ctx, file.path(), Some(&["strings", "ints"]));
    assert_eq!(read_schema.fields().len(), 2);
    assert_eq!(read, expected.project(&[3, 0]).unwrap());
    let err = DeviceParquetReader::open(file.path(), &ctx, Some(&["ints", "nope"])).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // A reader dropped before its end stops its worker.
    let mut reader = DeviceParquetReader::open(file.path(), &ctx, None).unwrap();
    assert!(reader.next().unwrap().is_ok());
    drop(reader);
    Ok(())
}

/// Read `bytes` as a Parquet file: every outcome is a typed error or batches; device
/// memory comes back.
fn read_corrupt(ctx: &Context, bytes: &[u8], label: &str) -> bool {
    let before = ctx.bytes_allocated();
    let file = TempFile::with_bytes("corrupt.parquet", bytes);
    let mut ok = true;
    match DeviceParquetReader::open(file.path(), ctx, None) {
        Err(e) => {
            assert!(
                matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::Unsupported),
                "{label}: {e}"
            );
            ok = false;
        }
        Ok(reader) => {
            for r in reader {
                match r {
                    Ok(b) => {
                        if let Err(e) = b.to_host() {
                            assert_eq!(e.kind(), ErrorKind::InvalidData, "{label}: {e}");
                        }
                    }
                    Err(e) => {
                        assert!(
                            matches!(e.kind(), ErrorKind::InvalidData | ErrorKind::Unsupported),
                            "{label}: {e}"
                        );
                        assert!(
                            e.to_string().contains("cudabuf-arrow-test"),
                            "names the file: {e}"
                        );
                        ok = false;
                    }
                }
            }
        }
    }
    assert_eq!(ctx.bytes_allocated(), before, "{label}");
    ok
}

pub(crate) fn corrupt_parquet_files_are_invalid_data_never_a_panic(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (_, schema, batches) = parquet_sets().remove(0);
    let bytes = parquet_bytes(&schema, &batches, Compression::SNAPPY, 4);
    assert!(read_corrupt(&ctx, &bytes, "intact"));
    // Truncated anywhere (every cut in the footer, every 3rd byte before it).
    let n = bytes.len();
    let footer_len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    let footer_start = n - 8 - footer_len;
    for cut in (0..footer_start).step_by(3).chain(footer_start..n) {
        assert!(
            !read_corrupt(&ctx, &bytes[..cut], &format!("cut at {cut}")),
            "cut at {cut}"
        );
    }
    // Bit flips in the footer's metadata, its length and the magic.
    let mut failed = 0;
    for at in footer_start..n {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[at] ^= flip;
            failed += usize::from(!read_corrupt(&ctx, &b, &format!("byte {at} ^ {flip:#x}")));
        }
    }
    assert!(failed > 0);
    // A footer length larger than the file.
    let mut b = bytes.clone();
    b[n - 8..n - 4].copy_from_slice(&(n as u32 * 2).to_le_bytes());
    assert!(!read_corrupt(&ctx, &b, "footer length"));
    // Pages of garbage.
    let mut b = bytes.clone();
    b[4..footer_start]
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = (i * 37) as u8);
    assert!(!read_corrupt(&ctx, &b, "garbage pages"));
    Ok(())
}

pub(crate) fn parquet_missing_files_and_directories_are_file_errors(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let missing = std::env::temp_dir().join("cudabuf-arrow-test-no-such-file.parquet");
    for path in [missing, std::env::temp_dir()] {
        let err = DeviceParquetReader::open(&path, &ctx, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{err}");
        let err = read_parquet(&path, &ctx, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{err}");
    }
    Ok(())
}

/// A file (found by the `parquet_file` fuzz target) whose corrupt page made the
/// `parquet` crate's definition-level decoder panic: `InvalidData` naming the file (its
/// corrupt page header is now refused before the crate decodes it); and one that passes
/// those checks and panics inside the crate: the reader's guard turns the panic into
/// the same error. The caller's thread never sees a panic.
pub(crate) fn parquet_file_the_decoder_panicked_on_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/parquet_decoder_panics.parquet");
    let before = ctx.bytes_allocated();
    let results: Vec<_> = DeviceParquetReader::open(&path, &ctx, None)
        .unwrap()
        .collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("the corrupt page is an error");
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(
        err.to_string().contains("parquet_decoder_panics.parquet"),
        "{err}"
    );
    assert!(
        err.to_string().contains("corrupt page header") || err.to_string().contains("panicked"),
        "{err}"
    );
    assert!(
        results.last().unwrap().is_err(),
        "the iteration ends at the error"
    );
    drop(results);
    // A file whose page headers pass the pre-scan but whose corrupt values make arrow-rs
    // panic inside the crate's decoding (`offset + len out of bounds`, an `assert!`, in
    // release builds too; a page of arrow-rs's writing with bytes flipped, found by a
    // mutation search): the guard's `InvalidData`, naming the panic.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/parquet_panics_past_the_prescan.parquet");
    let results: Vec<_> = DeviceParquetReader::open(&path, &ctx, None)
        .unwrap()
        .collect();
    let err = results
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("the corrupt page is an error");
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("parquet_panics_past_the_prescan.parquet"),
        "{message}"
    );
    assert!(message.contains("the decoder panicked"), "{message}");
    assert!(
        results.last().unwrap().is_err(),
        "the iteration ends at the error"
    );
    drop(results);
    assert_eq!(ctx.bytes_allocated(), before);
    Ok(())
}
