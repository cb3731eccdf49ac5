//! The Arrow part of the files bench (with the `arrow` feature): an LZ4 Arrow IPC file and
//! a Parquet file of the same table landed on the device by cudabuf-arrow's readers with
//! each thread count asked for, beside the bound measured in the same run: the same files
//! decoded by arrow-rs into host memory with as many threads (no device).
//!
//! The table is the one `scripts/bench_files.py` writes with pyarrow: an int64 column
//! (0, 1, 2, ...) and a float64 column (evenly spaced from 0 to 1), `size` bytes of
//! columns in all, in batches and row groups of 1 Mi rows; the IPC file has LZ4_FRAME
//! bodies (pyarrow's Feather default), the Parquet file SNAPPY pages (pyarrow's default),
//! both written here by arrow-rs. GB/s are of the table's `size` bytes.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cudabuf::arrow::array::{Float64Array, Int64Array, RecordBatch};
use cudabuf::arrow::ipc::reader::FileReader;
use cudabuf::arrow::ipc::writer::{FileWriter, IpcWriteOptions};
use cudabuf::arrow::ipc::CompressionType;
use cudabuf::device_arrow::{read_parquet, DeviceFileReader};
use cudabuf::{Context, FileOptions};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use super::{median, AnyResult, Options};

/// Rows per batch and per row group, as in `scripts/bench_files.py`.
const ROWS_PER_BATCH: usize = 1 << 20;

/// The table's batches: `size` bytes of an int64 and a float64 column.
fn table(size: usize) -> AnyResult<Vec<RecordBatch>> {
    let rows = size / 16;
    let mut batches = Vec::new();
    let mut start = 0;
    while start < rows {
        let n = ROWS_PER_BATCH.min(rows - start);
        let step = 1.0 / (rows.max(2) - 1) as f64;
        batches.push(RecordBatch::try_from_iter([
            (
                "i",
                Arc::new(Int64Array::from_iter_values(
                    start as i64..(start + n) as i64,
                )) as _,
            ),
            (
                "x",
                Arc::new(Float64Array::from_iter_values(
                    (start..start + n).map(|r| r as f64 * step),
                )) as _,
            ),
        ])?);
        start += n;
    }
    Ok(batches)
}

/// The bench's LZ4 IPC file and Parquet file of `size` bytes of table.
fn files(dir: &Path, size: usize) -> AnyResult<(PathBuf, PathBuf)> {
    let batches = table(size)?;
    let schema = batches[0].schema();
    let ipc = dir.join(format!("cudabuf-bench-{size}.lz4.arrow"));
    let options =
        IpcWriteOptions::default().try_with_compression(Some(CompressionType::LZ4_FRAME))?;
    let mut writer = FileWriter::try_new_with_options(File::create(&ipc)?, &schema, options)?;
    for b in &batches {
        writer.write(b)?;
    }
    writer.finish()?;
    let parquet = dir.join(format!("cudabuf-bench-{size}.parquet"));
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(ROWS_PER_BATCH))
        .build();
    let mut writer = ArrowWriter::try_new(File::create(&parquet)?, schema, Some(props))?;
    for b in &batches {
        writer.write(b)?;
    }
    writer.close()?;
    Ok((ipc, parquet))
}

/// The median rate in GB/s of `reps` runs of `f` over `bytes` bytes; what `f` returns is
/// dropped after the clock stops.
fn rate_keeping<T>(
    reps: usize,
    bytes: usize,
    mut f: impl FnMut() -> AnyResult<T>,
) -> AnyResult<f64> {
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        let t = std::time::Instant::now();
        let kept = f()?;
        rates.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        drop(kept);
    }
    Ok(median(rates))
}

/// `threads` threads read the IPC file into host memory with arrow-rs's `FileReader`,
/// each its own reader and every `threads`-th batch: the host's decode of the file.
fn host_ipc(path: &Path, threads: usize) -> AnyResult<Vec<RecordBatch>> {
    in_threads(threads, |t| {
        let file = File::open(path).map_err(|e| e.to_string())?;
        let mut reader = FileReader::try_new(file, None).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for i in (t..reader.num_batches()).step_by(threads) {
            reader.set_index(i).map_err(|e| e.to_string())?;
            let batch = reader
                .next()
                .ok_or("a batch short")?
                .map_err(|e| e.to_string())?;
            out.push((i, batch));
        }
        Ok(out)
    })
}

/// `threads` threads decode the Parquet file into host memory with arrow-rs's reader,
/// each its own reader and every `threads`-th row group.
fn host_parquet(path: &Path, threads: usize) -> AnyResult<Vec<RecordBatch>> {
    let groups = ParquetRecordBatchReaderBuilder::try_new(File::open(path)?)?
        .metadata()
        .num_row_groups();
    in_threads(threads, |t| {
        let mut out = Vec::new();
        for g in (t..groups).step_by(threads) {
            let file = File::open(path).map_err(|e| e.to_string())?;
            let reader = ParquetRecordBatchReaderBuilder::try_new(file)
                .map_err(|e| e.to_string())?
                .with_row_groups(vec![g])
                .with_batch_size(ROWS_PER_BATCH)
                .build()
                .map_err(|e| e.to_string())?;
            for b in reader {
                out.push((g, b.map_err(|e| e.to_string())?));
            }
        }
        Ok(out)
    })
}

/// Run `work(t)` for `t` in `0..threads` on scoped threads and put what they decoded
/// (`(index, batch)`: a batch, or a row group's batches, in their order) back in index
/// order.
fn in_threads(
    threads: usize,
    work: impl Fn(usize) -> Result<Vec<(usize, RecordBatch)>, String> + Sync,
) -> AnyResult<Vec<RecordBatch>> {
    let work = &work;
    let parts = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads).map(|t| s.spawn(move || work(t))).collect();
        workers
            .into_iter()
            .map(|w| w.join().map_err(|_| "a host thread panicked".to_string())?)
            .collect::<Result<Vec<_>, String>>()
    })?;
    let mut all: Vec<(usize, RecordBatch)> = parts.into_iter().flatten().collect();
    // Stable: a row group's batches keep their order.
    all.sort_by_key(|(i, _)| *i);
    Ok(all.into_iter().map(|(_, b)| b).collect())
}

/// Read the whole of a file once (into the page cache).
fn warm(path: &Path) -> AnyResult<()> {
    std::io::copy(&mut File::open(path)?, &mut std::io::sink())?;
    Ok(())
}

/// What records a row: path, size, GB/s, and the bound beside it.
pub(super) type Record<'r> = dyn FnMut(&str, usize, f64, Option<(&str, f64)>) + 'r;

/// Measure every size of `--arrow-sizes` with every thread count of `--arrow-threads`.
pub(super) fn run(
    ctx: &Context,
    base: FileOptions,
    o: &Options,
    record: &mut Record<'_>,
) -> AnyResult<()> {
    let reps = o.reps;
    for &size in &o.arrow_sizes {
        let (ipc, parquet) = files(&o.dir, size)?;
        warm(&ipc)?;
        warm(&parquet)?;
        let expected = table(size)?;
        for &threads in &o.arrow_threads {
            ctx.set_file_options(base.with_threads(threads)?);
            let bound = rate_keeping(reps, size, || host_ipc(&ipc, threads))?;
            let bound_name =
                format!("IPC file, LZ4: host decode (arrow-rs), {threads} threads (warm)");
            record(&bound_name, size, bound, None);
            let ours = rate_keeping(reps, size, || {
                Ok(DeviceFileReader::open(&ipc, ctx)?.read_all()?)
            })?;
            record(
                &format!("IPC file, LZ4: cudabuf read_all, {threads} threads (warm)"),
                size,
                ours,
                Some(("host decode", bound)),
            );
            let bound = rate_keeping(reps, size, || host_parquet(&parquet, threads))?;
            let bound_name = format!("Parquet: host decode (arrow-rs), {threads} threads (warm)");
            record(&bound_name, size, bound, None);
            let ours = rate_keeping(reps, size, || Ok(read_parquet(&parquet, ctx, None)?))?;
            record(
                &format!("Parquet: cudabuf read_parquet, {threads} threads (warm)"),
                size,
                ours,
                Some(("host decode", bound)),
            );
            // What was measured is right: the device holds the table.
            check(
                &DeviceFileReader::open(&ipc, ctx)?.read_all()?,
                &expected,
                &ipc,
            )?;
            check(&read_parquet(&parquet, ctx, None)?, &expected, &parquet)?;
            if host_ipc(&ipc, threads)? != expected || host_parquet(&parquet, threads)? != expected
            {
                return Err(
                    format!("the host decode of {size} bytes differs from the table").into(),
                );
            }
        }
        ctx.set_file_options(base);
        if !o.keep {
            std::fs::remove_file(&ipc)?;
            std::fs::remove_file(&parquet)?;
        }
    }
    Ok(())
}

fn check(
    read: &[cudabuf::device_arrow::DeviceRecordBatch],
    expected: &[RecordBatch],
    path: &Path,
) -> AnyResult<()> {
    let host = read
        .iter()
        .map(|b| b.to_host())
        .collect::<Result<Vec<_>, _>>()?;
    if host != expected {
        return Err(format!("what landed from {} differs from the table", path.display()).into());
    }
    Ok(())
}
