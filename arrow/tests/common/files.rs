//! Arrow IPC files and stream files on disk: DeviceFileReader, DeviceFileWriter,
//! write_ipc_file and DeviceStreamReader::from_path against arrow-rs's own writers and
//! readers, uncompressed and with LZ4_FRAME and ZSTD bodies.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray};
use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::{FileReader, StreamReader};
use arrow::ipc::writer::{FileWriter, IpcWriteOptions, StreamWriter};
use arrow::ipc::CompressionType;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{
    write_ipc_file, DeviceFileReader, DeviceFileWriter, DeviceRecordBatch, DeviceStreamReader,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::ErrorKind;

use super::data::{self, batch};
use super::{context, within};

/// A file in the temporary directory, removed when dropped.
pub(crate) struct TempFile(PathBuf);

impl TempFile {
    pub(crate) fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!(
            "cudabuf-arrow-test-{}-{n}-{tag}",
            std::process::id()
        )))
    }

    /// A temporary file holding `bytes`.
    pub(crate) fn with_bytes(tag: &str, bytes: &[u8]) -> Self {
        let file = Self::new(tag);
        std::fs::write(file.path(), bytes).expect("writing a test file");
        file
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The codecs the cases write with.
pub(crate) const CODECS: [Option<CompressionType>; 3] = [
    None,
    Some(CompressionType::LZ4_FRAME),
    Some(CompressionType::ZSTD),
];

pub(crate) fn options(codec: Option<CompressionType>) -> IpcWriteOptions {
    IpcWriteOptions::default()
        .try_with_compression(codec)
        .expect("arrow-rs compression options")
}

/// arrow-rs's IPC file of `batches` (FileWriter), in memory.
pub(crate) fn arrow_rs_file(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    codec: Option<CompressionType>,
) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut writer = FileWriter::try_new_with_options(&mut out, schema, options(codec))
            .expect("arrow-rs file writer");
        for b in batches {
            writer.write(b).expect("arrow-rs file write");
        }
        writer.finish().expect("arrow-rs file finish");
    }
    out
}

/// What arrow-rs's FileReader reads from `path`.
pub(crate) fn arrow_rs_read_file(path: &Path) -> Vec<RecordBatch> {
    FileReader::try_new(File::open(path).expect("open"), None)
        .expect("arrow-rs file reader")
        .collect::<Result<_, _>>()
        .expect("arrow-rs reads the file")
}

/// Schemas and batches the file cases write: every kind of column, an empty batch,
/// dictionaries (nested too), and many batches.
pub(crate) fn file_sets() -> Vec<(&'static str, SchemaRef, Vec<RecordBatch>)> {
    let basic = batch(vec![
        ("ints", data::ints()),
        ("floats", data::floats()),
        ("strings", data::strings()),
    ]);
    let nested = batch(vec![
        ("list", data::list().slice(0, 4)),
        ("struct", data::structs()),
    ]);
    let mixed = data::mixed();
    let (dict_schema, dict_batches) = data::dictionary_stream();
    let many: Vec<RecordBatch> = (0..40)
        .map(|i| data::large(10 + i * 7).slice(i, 10 + i * 6))
        .collect();
    vec![
        (
            "basic",
            basic.schema(),
            vec![basic.clone(), basic.slice(2, 3), basic.slice(0, 0)],
        ),
        ("nested", nested.schema(), vec![nested.clone()]),
        (
            "mixed",
            mixed.schema(),
            vec![mixed.clone(), mixed.slice(1, 3)],
        ),
        // A file has one dictionary per field: the batches that share them.
        ("dictionary", dict_schema, dict_batches[..2].to_vec()),
        ("empty", basic.schema(), vec![]),
        ("many", many[0].schema(), many),
    ]
}

pub(crate) fn ipc_file_round_trips_every_schema_and_codec_like_arrow_rs(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (name, schema, batches) in file_sets() {
        for codec in CODECS {
            let file = TempFile::with_bytes(name, &arrow_rs_file(&schema, &batches, codec));
            let expected = arrow_rs_read_file(file.path());
            assert_eq!(
                expected, batches,
                "{name} {codec:?}: arrow-rs reads what it wrote"
            );
            let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
            assert_eq!(reader.schema(), &schema, "{name} {codec:?}");
            assert_eq!(reader.num_batches(), expected.len());
            let read: Vec<DeviceRecordBatch> = reader.collect::<Result<_, _>>().unwrap();
            assert_eq!(read.len(), expected.len(), "{name} {codec:?}");
            for (i, (device, host)) in read.iter().zip(&expected).enumerate() {
                assert_eq!(device.num_rows(), host.num_rows(), "{name} {codec:?} {i}");
                assert_eq!(
                    &device.to_host().unwrap(),
                    host,
                    "{name} {codec:?} batch {i}"
                );
                // (Dictionary values, nested ones too, lie in their dictionary's body.)
                let columns = device.columns().iter().filter(|_| name != "dictionary");
                for buffer in columns.flat_map(|c| c.device_buffers()) {
                    assert!(
                        within(buffer, device.body().unwrap()),
                        "{name}: columns are slices of the landed body"
                    );
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn ipc_file_batches_are_read_in_any_order(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (_, schema, batches) = file_sets().pop().unwrap();
    for codec in CODECS {
        let file = TempFile::with_bytes("random", &arrow_rs_file(&schema, &batches, codec));
        let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
        for i in [39, 0, 17, 17, 38, 1] {
            assert_eq!(
                reader.read_batch(i).unwrap().to_host().unwrap(),
                batches[i],
                "{i}"
            );
        }
        let err = reader.read_batch(40).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfRange, "{err}");
        // Reading a batch reads its block only: the body on the device is that batch's.
        let one = reader.read_batch(5).unwrap();
        assert_eq!(one.num_rows(), batches[5].num_rows());
        if codec.is_none() {
            let body = one.body().unwrap().size();
            assert!(body < std::fs::metadata(file.path()).unwrap().len() as usize / 10);
        }
    }
    Ok(())
}

pub(crate) fn ipc_file_projection_lands_only_the_projected_columns(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![
        (
            "big",
            Arc::new(Int64Array::from_iter_values(0..10_000)) as ArrayRef,
        ),
        (
            "small",
            Arc::new(StringArray::from_iter_values(
                (0..10_000).map(|i| ["x", "yz"][i % 2]),
            )),
        ),
        (
            "ints",
            Arc::new(Int64Array::from_iter_values((0..10_000).rev())),
        ),
    ]);
    for codec in CODECS {
        let file = TempFile::with_bytes(
            "projection",
            &arrow_rs_file(&b.schema(), &[b.clone(), b.slice(10, 20)], codec),
        );
        let full = DeviceFileReader::open(file.path(), &ctx).unwrap();
        let full_body = full.read_batch(0).unwrap().body().unwrap().size();

        let before = ctx.bytes_allocated();
        let by_name = DeviceFileReader::open(file.path(), &ctx)
            .unwrap()
            .with_columns(&["small"])
            .unwrap();
        assert_eq!(by_name.schema().fields().len(), 1);
        let read = by_name.read_batch(0).unwrap();
        assert_eq!(
            read.to_host().unwrap(),
            b.project(&[1]).unwrap(),
            "{codec:?}"
        );
        let body = read.body().unwrap().size();
        assert!(
            body * 3 < full_body,
            "{codec:?}: only the projected column lands ({body} of {full_body} bytes)"
        );
        assert!(ctx.bytes_allocated() - before < full_body);
        assert_eq!(
            by_name.read_batch(1).unwrap().to_host().unwrap(),
            b.slice(10, 20).project(&[1]).unwrap()
        );

        // By index, reordered and repeated.
        let by_index = DeviceFileReader::open(file.path(), &ctx)
            .unwrap()
            .with_projection(&[2, 0, 2])
            .unwrap();
        assert_eq!(by_index.file_schema(), &b.schema());
        let read: Vec<_> = by_index.map(|r| r.unwrap().to_host().unwrap()).collect();
        assert_eq!(
            read,
            vec![
                b.project(&[2, 0, 2]).unwrap(),
                b.slice(10, 20).project(&[2, 0, 2]).unwrap()
            ]
        );
    }
    // Dictionaries: only those of the projected columns are read.
    let (schema, batches) = data::dictionary_stream();
    let batches = &batches[..2];
    let file = TempFile::with_bytes("projection-dict", &arrow_rs_file(&schema, batches, None));
    for (columns, indices) in [(&["x"][..], &[1usize][..]), (&["nested", "city"], &[2, 0])] {
        let reader = DeviceFileReader::open(file.path(), &ctx)
            .unwrap()
            .with_columns(columns)
            .unwrap();
        for (i, b) in batches.iter().enumerate() {
            assert_eq!(
                reader.read_batch(i).unwrap().to_host().unwrap(),
                b.project(indices).unwrap()
            );
        }
    }
    let errs = [
        DeviceFileReader::open(file.path(), &ctx)
            .unwrap()
            .with_columns(&["nope"])
            .unwrap_err(),
        DeviceFileReader::open(file.path(), &ctx)
            .unwrap()
            .with_projection(&[3])
            .unwrap_err(),
    ];
    assert_eq!(errs[0].kind(), ErrorKind::InvalidArgument, "{}", errs[0]);
    assert!(errs[0].to_string().contains("nope"));
    assert_eq!(errs[1].kind(), ErrorKind::OutOfRange, "{}", errs[1]);
    Ok(())
}

pub(crate) fn ipc_file_open_allocates_nothing_and_drops_give_everything_back(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let file = TempFile::with_bytes(
        "alloc",
        &arrow_rs_file(&schema, &batches[..2], Some(CompressionType::ZSTD)),
    );
    let start = ctx.bytes_allocated();
    let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
    assert_eq!(
        ctx.bytes_allocated(),
        start,
        "opening reads the footer only"
    );
    assert_eq!(reader.num_dictionaries(), 2);
    let read: Vec<_> = reader.collect::<Result<Vec<_>, _>>().unwrap();
    assert!(ctx.bytes_allocated() > start);
    drop(read);
    assert_eq!(ctx.bytes_allocated(), start);
    Ok(())
}

pub(crate) fn ipc_file_from_an_open_file_reads_the_same(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = data::mixed_without_views();
    let file = TempFile::with_bytes(
        "from-file",
        &arrow_rs_file(
            &b.schema(),
            std::slice::from_ref(&b),
            Some(CompressionType::LZ4_FRAME),
        ),
    );
    let mut reader = DeviceFileReader::from_file(File::open(file.path()).unwrap(), &ctx).unwrap();
    assert_eq!(reader.len(), 1);
    assert_eq!(reader.next().unwrap().unwrap().to_host().unwrap(), b);
    assert!(reader.next().is_none());
    Ok(())
}

pub(crate) fn ipc_file_writer_output_reads_back_with_arrow_rs(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    // Batches uploaded from the host, and read from a stream with dictionaries.
    let b = data::mixed();
    let uploaded = [
        DeviceRecordBatch::from_host(&b, &ctx).unwrap(),
        DeviceRecordBatch::from_host(&b.slice(2, 3), &ctx).unwrap(),
    ];
    let file = TempFile::new("writer.arrow");
    write_ipc_file(file.path(), &b.schema(), &uploaded).unwrap();
    assert_eq!(
        arrow_rs_read_file(file.path()),
        vec![b.clone(), b.slice(2, 3)]
    );
    let back: Vec<_> = DeviceFileReader::open(file.path(), &ctx)
        .unwrap()
        .map(|r| r.unwrap().to_host().unwrap())
        .collect();
    assert_eq!(back, vec![b.clone(), b.slice(2, 3)]);

    let (schema, batches) = data::dictionary_stream();
    let stream = cudabuf_arrow::serialize_stream(&schema, &batches[..2], &ctx).unwrap();
    let device: Vec<_> = DeviceStreamReader::from_buffer(&stream)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let file = TempFile::new("writer-dict.arrow");
    let mut writer = DeviceFileWriter::create(file.path(), &schema).unwrap();
    for d in &device {
        writer.write(d).unwrap();
    }
    // A batch of another schema is refused, and the file stays writable.
    let err = writer.write(&uploaded[0]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    writer.finish().unwrap();
    assert_eq!(arrow_rs_read_file(file.path()), batches[..2].to_vec());

    // A directory cannot be written.
    let err = DeviceFileWriter::create(std::env::temp_dir(), &schema).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::File, "{err}");
    Ok(())
}

pub(crate) fn ipc_stream_file_reads_back_like_arrow_rs(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for (name, schema, batches) in file_sets() {
        for codec in CODECS {
            let mut bytes = Vec::new();
            {
                let mut writer =
                    StreamWriter::try_new_with_options(&mut bytes, &schema, options(codec))
                        .unwrap();
                for b in &batches {
                    writer.write(b).unwrap();
                }
                writer.finish().unwrap();
            }
            let file = TempFile::with_bytes(name, &bytes);
            let expected: Vec<RecordBatch> =
                StreamReader::try_new(File::open(file.path()).unwrap(), None)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
            let reader = DeviceStreamReader::from_path(file.path(), &ctx).unwrap();
            assert_eq!(reader.schema(), &schema);
            let read: Vec<DeviceRecordBatch> = reader.collect::<Result<_, _>>().unwrap();
            assert_eq!(read.len(), expected.len(), "{name} {codec:?}");
            for (device, host) in read.iter().zip(&expected) {
                assert_eq!(&device.to_host().unwrap(), host, "{name} {codec:?}");
            }
        }
    }
    Ok(())
}
