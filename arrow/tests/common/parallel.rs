//! Files decoded by several host threads: compressed IPC bodies decompressed, and Parquet
//! row groups decoded, with 1, 2 and 8 threads (the context's `FileOptions::threads`),
//! against arrow-rs's own readers; corrupt data in the middle, files that shrink, empty
//! files and batches of zero rows.

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int32Array, Int64Array};
use arrow::datatypes::SchemaRef;
use arrow::ipc::CompressionType;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{DeviceFileReader, DeviceRecordBatch, DeviceStreamReader};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind, FileOptions};

use super::context;
use super::data;
use super::files::{arrow_rs_file, arrow_rs_read_file, options, TempFile};
use super::files_corrupt::first_compressed_buffer;

const THREADS: [usize; 3] = [1, 2, 8];

/// The context's file options with `threads` threads and chunks of `chunk` bytes.
fn with_threads(ctx: &Context, threads: usize, chunk: usize) {
    ctx.set_file_options(
        FileOptions::default()
            .with_threads(threads)
            .unwrap()
            .with_chunk_size(chunk)
            .unwrap(),
    );
}

/// A batch of many buffers, some of several 64 KiB chunks: the three columns of
/// `data::large` and eight more numeric ones.
fn wide(rows: usize) -> RecordBatch {
    let mut columns: Vec<(String, ArrayRef)> = Vec::new();
    let base = data::large(rows);
    for (field, column) in base.schema().fields().iter().zip(base.columns()) {
        columns.push((field.name().clone(), column.clone()));
    }
    for k in 0..8i64 {
        let column: ArrayRef = match k % 3 {
            0 => Arc::new(Int64Array::from_iter_values(
                (0..rows as i64).map(|i| i * k - 7),
            )),
            1 => Arc::new(Float64Array::from_iter(
                (0..rows).map(|i| (i % 11 != 0).then_some(i as f64 / (k + 1) as f64)),
            )),
            _ => Arc::new(Int32Array::from_iter_values(
                (0..rows as i32).map(|i| i % 97),
            )),
        };
        columns.push((format!("c{k}"), column));
    }
    RecordBatch::try_from_iter(columns).unwrap()
}

/// Files of many batches and buffers: a wide table in 24 batches (one of zero rows, one
/// of 40,000 rows), and `data::mixed_without_views` (every kind of column).
fn sets() -> Vec<(&'static str, SchemaRef, Vec<RecordBatch>)> {
    let big = wide(40_000);
    let mut wide_batches: Vec<RecordBatch> = (0..22)
        .map(|i| big.slice(i * 1_000, 300 + i * 37))
        .collect();
    wide_batches.insert(5, big.slice(0, 0));
    wide_batches.push(big.clone());
    let mixed = data::mixed_without_views();
    vec![
        ("wide", big.schema(), wide_batches),
        (
            "mixed",
            mixed.schema(),
            vec![mixed.clone(), mixed.slice(1, 2), mixed.slice(0, 0)],
        ),
    ]
}

fn on_host(batches: &[DeviceRecordBatch]) -> Vec<RecordBatch> {
    batches.iter().map(|b| b.to_host().unwrap()).collect()
}

pub(crate) fn compressed_ipc_files_read_alike_with_1_2_and_8_threads(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let saved = ctx.file_options();
    for (name, schema, batches) in sets() {
        for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
            let file = TempFile::with_bytes(name, &arrow_rs_file(&schema, &batches, Some(codec)));
            let expected = arrow_rs_read_file(file.path());
            assert_eq!(
                expected, batches,
                "{name} {codec:?}: arrow-rs reads it back"
            );
            let mut stream_bytes = Vec::new();
            {
                let mut writer = arrow::ipc::writer::StreamWriter::try_new_with_options(
                    &mut stream_bytes,
                    &schema,
                    options(Some(codec)),
                )
                .unwrap();
                for b in &batches {
                    writer.write(b).unwrap();
                }
                writer.finish().unwrap();
            }
            let stream_file = TempFile::with_bytes("stream", &stream_bytes);
            for threads in THREADS {
                for chunk in [64 << 10, 8 << 20] {
                    let label = format!("{name} {codec:?}, {threads} threads, chunk {chunk}");
                    with_threads(&ctx, threads, chunk);
                    let before = ctx.bytes_allocated();
                    let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
                    let all = reader.read_all().unwrap();
                    assert_eq!(on_host(&all), expected, "{label}: read_all");
                    let middle = 1..expected.len() - 1;
                    let some = reader.read_batches(middle.clone()).unwrap();
                    assert_eq!(on_host(&some), expected[middle], "{label}: read_batches");
                    assert!(reader.read_batches(2..2).unwrap().is_empty());
                    let one: Vec<_> = reader.map(|b| b.unwrap().to_host().unwrap()).collect();
                    assert_eq!(one, expected, "{label}: one batch at a time");
                    // Projected: only some columns' buffers are decompressed.
                    let last = schema.fields().len() - 1;
                    let projected = DeviceFileReader::open(file.path(), &ctx)
                        .unwrap()
                        .with_projection(&[last, 0])
                        .unwrap()
                        .read_all()
                        .unwrap();
                    let want: Vec<_> = expected
                        .iter()
                        .map(|b| b.project(&[last, 0]).unwrap())
                        .collect();
                    assert_eq!(on_host(&projected), want, "{label}: projected");
                    let streamed: Vec<_> = DeviceStreamReader::from_path(stream_file.path(), &ctx)
                        .unwrap()
                        .collect::<Result<_, _>>()
                        .unwrap();
                    assert_eq!(on_host(&streamed), expected, "{label}: stream file");
                    drop((all, some, projected, streamed));
                    assert_eq!(ctx.bytes_allocated(), before, "{label}: all given back");
                }
            }
        }
    }
    ctx.set_file_options(saved);
    Ok(())
}

/// An LZ4 file of 20 batches whose batch 10 has a corrupt frame: reading all of them is
/// `InvalidData` naming the file and the buffer's byte in it, with every thread count,
/// and nothing stays on the device; the other batches read alone are intact.
pub(crate) fn a_corrupt_body_in_the_middle_is_invalid_data_naming_the_file_and_byte(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let saved = ctx.file_options();
    let big = wide(4_000);
    let batches: Vec<RecordBatch> = (0..20).map(|i| big.slice(i * 100, 2_000)).collect();
    for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
        let mut bytes = arrow_rs_file(&big.schema(), &batches, Some(codec));
        let (at, len, _) = first_compressed_buffer(&bytes, 10);
        // The frame after the length prefix, from its magic on.
        bytes[at + 8..at + len].fill(0xAB);
        let file = TempFile::with_bytes("corrupt-middle", &bytes);
        for threads in THREADS {
            with_threads(&ctx, threads, 64 << 10);
            let before = ctx.bytes_allocated();
            let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
            let err = reader.read_all().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{threads}: {err}");
            let message = err.to_string();
            assert!(
                message.contains("cudabuf-arrow-test")
                    && message.contains(&format!("at byte {at} of the file")),
                "{codec:?}, {threads} threads: names the file and the byte: {message}"
            );
            assert_eq!(ctx.bytes_allocated(), before, "{threads}: nothing kept");
            // One at a time: every batch but 10 is intact.
            for (i, result) in reader.enumerate() {
                match result {
                    Ok(b) if i != 10 => assert_eq!(b.to_host().unwrap(), batches[i]),
                    Err(e) if i == 10 => assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}"),
                    other => panic!("batch {i}: {:?}", other.map(|b| b.num_rows())),
                }
            }
            assert_eq!(ctx.bytes_allocated(), before);
        }
    }
    ctx.set_file_options(saved);
    Ok(())
}

/// A file cut after it was opened (inside a compressed body): a file error naming the
/// file, nothing kept.
pub(crate) fn a_compressed_file_that_shrinks_while_read_is_a_file_error(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let saved = ctx.file_options();
    let big = wide(4_000);
    let batches: Vec<RecordBatch> = (0..8).map(|i| big.slice(i * 250, 2_000)).collect();
    let bytes = arrow_rs_file(&big.schema(), &batches, Some(CompressionType::LZ4_FRAME));
    let (at, len, _) = first_compressed_buffer(&bytes, 4);
    for threads in THREADS {
        with_threads(&ctx, threads, 64 << 10);
        let file = TempFile::with_bytes("shrinks", &bytes);
        let before = ctx.bytes_allocated();
        let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap()
            .set_len((at + len / 2) as u64)
            .unwrap();
        let err = reader.read_all().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{threads}: {err}");
        assert!(err.to_string().contains("cudabuf-arrow-test"), "{err}");
        let err = reader.read_batch(4).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{threads}: {err}");
        assert!(err.to_string().contains("cudabuf-arrow-test"), "{err}");
        assert_eq!(reader.read_batch(1).unwrap().to_host().unwrap(), batches[1]);
        drop(reader);
        assert_eq!(ctx.bytes_allocated(), before);
    }
    ctx.set_file_options(saved);
    Ok(())
}

/// Files pyarrow 26.0.1 wrote (`tests/data/pyarrow_*`): 6,000 rows of an int64 `i`
/// (0, 1, ...), a float64 `x` (`i / 4`), a string `s` and an int32 `n` with nulls, as
/// Feather (IPC) files with LZ4 and ZSTD bodies in batches of 750 rows and as Parquet
/// (SNAPPY) in row groups of 500 rows:
///
/// ```text
/// n = 6000; i = np.arange(n, dtype=np.int64)
/// table = pa.table({"i": pa.array(i), "x": pa.array(i * 0.25),
///     "s": pa.array([f"k{v % 37}" if v % 11 else None for v in range(n)]),
///     "n": pa.array([v % 1000 if v % 7 else None for v in range(n)], type=pa.int32())})
/// feather.write_feather(table, "pyarrow_lz4.arrow", compression="lz4", chunksize=750)
/// feather.write_feather(table, "pyarrow_zstd.arrow", compression="zstd", chunksize=750)
/// pq.write_table(table, "pyarrow.parquet", row_group_size=500)
/// ```
pub(crate) fn files_pyarrow_wrote_read_alike_with_every_thread_count(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let saved = ctx.file_options();
    let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for name in ["pyarrow_lz4.arrow", "pyarrow_zstd.arrow"] {
        let path = data.join(name);
        let expected = arrow_rs_read_file(&path);
        assert_eq!(expected.len(), 8, "{name}");
        let ids = expected[3]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(
            ids.value(0),
            3 * 750,
            "{name}: arrow-rs reads pyarrow's values"
        );
        for threads in THREADS {
            with_threads(&ctx, threads, 64 << 10);
            let reader = DeviceFileReader::open(&path, &ctx).unwrap();
            assert_eq!(
                on_host(&reader.read_all().unwrap()),
                expected,
                "{name} {threads}"
            );
            let one: Vec<_> = reader.map(|b| b.unwrap().to_host().unwrap()).collect();
            assert_eq!(one, expected, "{name} {threads}: one at a time");
        }
    }
    #[cfg(feature = "parquet")]
    {
        let path = data.join("pyarrow.parquet");
        let expected: Vec<RecordBatch> =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                std::fs::File::open(&path).unwrap(),
            )
            .unwrap()
            .with_batch_size(500)
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(expected.len(), 12);
        for threads in THREADS {
            with_threads(&ctx, threads, 8 << 20);
            let read = cudabuf_arrow::read_parquet(&path, &ctx, None).unwrap();
            assert_eq!(on_host(&read), expected, "parquet, {threads} threads");
        }
    }
    ctx.set_file_options(saved);
    Ok(())
}

/// A file without batches and batches of zero rows, with every thread count.
pub(crate) fn empty_files_and_zero_row_batches_read_with_every_thread_count(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let saved = ctx.file_options();
    let b = wide(10);
    for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
        let none = TempFile::with_bytes("none", &arrow_rs_file(&b.schema(), &[], Some(codec)));
        let zero = vec![b.slice(0, 0), b.slice(3, 0)];
        let zeros = TempFile::with_bytes("zeros", &arrow_rs_file(&b.schema(), &zero, Some(codec)));
        for threads in THREADS {
            with_threads(&ctx, threads, 8 << 20);
            let reader = DeviceFileReader::open(none.path(), &ctx).unwrap();
            assert!(reader.read_all().unwrap().is_empty());
            let (past, reversed) = (usize::MAX, std::ops::Range { start: 1, end: 0 });
            for err in [
                reader.read_batches(0..1).unwrap_err(),
                reader.read_batches(reversed).unwrap_err(),
                reader.read_batches(0..past).unwrap_err(),
                reader.read_batch(past).unwrap_err(),
            ] {
                assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
            }
            let read = DeviceFileReader::open(zeros.path(), &ctx)
                .unwrap()
                .read_all()
                .unwrap();
            assert_eq!(on_host(&read), zero, "{codec:?} {threads}");
            assert!(read.iter().all(|r| r.num_rows() == 0));
        }
    }
    ctx.set_file_options(saved);
    Ok(())
}

#[cfg(feature = "parquet")]
pub(crate) use parquet_cases::*;

#[cfg(feature = "parquet")]
mod parquet_cases {
    use super::*;
    use arrow::compute::concat_batches;
    use cudabuf_arrow::{read_parquet, DeviceParquetReader};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;
    use parquet::basic::Compression;
    use parquet::file::properties::WriterProperties;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    /// arrow-rs's Parquet file of `batches` in row groups of `rows` rows.
    fn parquet_file(batches: &[RecordBatch], rows: usize) -> TempFile {
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(rows))
            .build();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, batches[0].schema(), Some(props)).unwrap();
        for b in batches {
            writer.write(b).unwrap();
        }
        writer.close().unwrap();
        TempFile::with_bytes("parallel.parquet", &out)
    }

    fn arrow_rs_row_groups(path: &std::path::Path) -> Vec<RecordBatch> {
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
            .unwrap()
            .with_batch_size(130)
            .build()
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// 37 row groups of at most 130 rows, decoded by 1, 2 and 8 threads: the batches
    /// come in file order, one per row group, equal to arrow-rs's; projection too; a
    /// reader dropped early stops its threads.
    pub(crate) fn parquet_row_groups_decoded_in_parallel_arrive_in_file_order(
        f: &Fixture,
    ) -> CaseResult {
        let ctx = context(f);
        let saved = ctx.file_options();
        let big = wide(4_800);
        let file = parquet_file(std::slice::from_ref(&big), 130);
        let expected = arrow_rs_row_groups(file.path());
        assert_eq!(expected.len(), 37);
        let schema = big.schema();
        for threads in THREADS {
            with_threads(&ctx, threads, 8 << 20);
            let before = ctx.bytes_allocated();
            let read = read_parquet(file.path(), &ctx, None).unwrap();
            assert_eq!(on_host(&read), expected, "{threads} threads");
            let projected = read_parquet(file.path(), &ctx, Some(&["c3", "id", "c3"])).unwrap();
            let want: Vec<_> = expected
                .iter()
                .map(|b| {
                    let i = schema.index_of("c3").unwrap();
                    b.project(&[i, 0, i]).unwrap()
                })
                .collect();
            assert_eq!(on_host(&projected), want, "{threads} threads, projected");
            let whole = concat_batches(&schema, &on_host(&read)).unwrap();
            assert_eq!(whole, big);
            drop((read, projected));
            // Dropped after 3 batches, with row groups decoding ahead.
            let mut reader = DeviceParquetReader::open(file.path(), &ctx, None).unwrap();
            for want in &expected[..3] {
                assert_eq!(&reader.next().unwrap().unwrap().to_host().unwrap(), want);
            }
            drop(reader);
            assert_eq!(ctx.bytes_allocated(), before, "{threads} threads");
        }
        ctx.set_file_options(saved);
        Ok(())
    }

    /// Row group 20 of 37 overwritten with garbage: the batches before it come intact,
    /// then `InvalidData` naming the file, then the end; with every thread count.
    pub(crate) fn a_corrupt_row_group_in_the_middle_ends_the_file_there(f: &Fixture) -> CaseResult {
        let ctx = context(f);
        let saved = ctx.file_options();
        let big = wide(4_800);
        let file = parquet_file(std::slice::from_ref(&big), 130);
        let expected = arrow_rs_row_groups(file.path());
        let mut bytes = std::fs::read(file.path()).unwrap();
        let metadata = SerializedFileReader::new(std::fs::File::open(file.path()).unwrap())
            .unwrap()
            .metadata()
            .clone();
        let group = metadata.row_group(20);
        for column in group.columns() {
            let start = column
                .dictionary_page_offset()
                .unwrap_or_else(|| column.data_page_offset()) as usize;
            let len = column.compressed_size() as usize;
            bytes[start..start + len].fill(0xFF);
        }
        let corrupt = TempFile::with_bytes("corrupt-group.parquet", &bytes);
        for threads in THREADS {
            with_threads(&ctx, threads, 8 << 20);
            let before = ctx.bytes_allocated();
            let results: Vec<_> = DeviceParquetReader::open(corrupt.path(), &ctx, None)
                .unwrap()
                .collect();
            assert_eq!(
                results.len(),
                21,
                "{threads} threads: 20 batches and the error"
            );
            for (i, want) in expected[..20].iter().enumerate() {
                let got = results[i].as_ref().unwrap().to_host().unwrap();
                assert_eq!(&got, want, "{threads} threads, row group {i}");
            }
            let err = results[20].as_ref().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
            assert!(err.to_string().contains("row group 20"), "{err}");
            assert!(err.to_string().contains("cudabuf-arrow-test"), "{err}");
            drop(results);
            assert_eq!(ctx.bytes_allocated(), before, "{threads} threads");
            let err = read_parquet(corrupt.path(), &ctx, None).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
            assert_eq!(ctx.bytes_allocated(), before);
        }
        ctx.set_file_options(saved);
        Ok(())
    }

    /// A Parquet file of zero rows, and one of a single row group, with 8 threads.
    pub(crate) fn parquet_files_of_zero_rows_or_one_row_group_read_with_every_thread_count(
        f: &Fixture,
    ) -> CaseResult {
        let ctx = context(f);
        let saved = ctx.file_options();
        let b = wide(50);
        let empty = parquet_file(&[b.slice(0, 0)], 130);
        let one = parquet_file(std::slice::from_ref(&b), 130);
        for threads in THREADS {
            with_threads(&ctx, threads, 8 << 20);
            let reader = DeviceParquetReader::open(empty.path(), &ctx, None).unwrap();
            assert_eq!(reader.num_rows(), 0);
            assert_eq!(reader.count(), 0);
            let read = read_parquet(one.path(), &ctx, None).unwrap();
            assert_eq!(on_host(&read), vec![b.clone()], "{threads} threads");
        }
        ctx.set_file_options(saved);
        Ok(())
    }
}
