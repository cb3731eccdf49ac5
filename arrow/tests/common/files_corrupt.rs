//! Truncated, corrupt and lying Arrow IPC files (and missing ones): typed errors, never a
//! panic, and every byte of device memory given back.

use arrow::datatypes::SchemaRef;
use arrow::ipc::{self, CompressionType};
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{DeviceFileReader, DeviceStreamReader};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, Error, ErrorKind};

use super::context;
use super::data::{self, batch};
use super::files::{arrow_rs_file, TempFile, CODECS};

fn small() -> (SchemaRef, Vec<RecordBatch>) {
    let b = batch(vec![
        ("ints", data::ints().slice(0, 4)),
        ("strings", data::strings().slice(0, 4)),
        ("list", data::list().slice(0, 4)),
    ]);
    (b.schema(), vec![b.clone(), b.slice(1, 2)])
}

fn dictionary_file(codec: Option<CompressionType>) -> (Vec<u8>, Vec<RecordBatch>) {
    let (schema, batches) = data::dictionary_stream();
    (
        arrow_rs_file(&schema, &batches[..2], codec),
        batches[..2].to_vec(),
    )
}

/// Open `bytes` as a file and read every batch, checking each outcome: an error of one
/// of `kinds`, or a batch that copies to the host equal to `expected` or fails with
/// `InvalidData`. Device memory is back at its level before when all is dropped. Gives
/// the number of batches read equal to `expected`.
fn read_all(
    ctx: &Context,
    bytes: &[u8],
    expected: &[RecordBatch],
    kinds: &[ErrorKind],
    label: &str,
) -> usize {
    let before = ctx.bytes_allocated();
    let file = TempFile::with_bytes("corrupt", bytes);
    let mut good = 0;
    match DeviceFileReader::open(file.path(), ctx) {
        Err(e) => assert!(kinds.contains(&e.kind()), "{label}: {e}"),
        Ok(reader) => {
            for (i, result) in reader.enumerate() {
                match result {
                    Err(e) => assert!(kinds.contains(&e.kind()), "{label} batch {i}: {e}"),
                    Ok(device) => match device.to_host() {
                        Ok(host) if expected.get(i) == Some(&host) => good += 1,
                        Ok(_) => {}
                        Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{label}: {e}"),
                    },
                }
            }
        }
    }
    assert_eq!(
        ctx.bytes_allocated(),
        before,
        "{label}: device memory given back"
    );
    good
}

fn open_err(ctx: &Context, bytes: &[u8]) -> Error {
    let file = TempFile::with_bytes("bad", bytes);
    DeviceFileReader::open(file.path(), ctx).unwrap_err()
}

pub(crate) fn every_truncation_of_an_ipc_file_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = small();
    let bytes = arrow_rs_file(&schema, &batches, None);
    let before = ctx.bytes_allocated();
    for cut in 0..bytes.len() {
        let err = open_err(&ctx, &bytes[..cut]);
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{cut} bytes: {err}");
        assert!(
            err.to_string().contains("cudabuf-arrow-test"),
            "the error names the file: {err}"
        );
    }
    assert_eq!(ctx.bytes_allocated(), before);
    assert_eq!(read_all(&ctx, &bytes, &batches, &[], "whole"), 2);
    Ok(())
}

pub(crate) fn bad_magic_and_footer_lengths_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = small();
    let bytes = arrow_rs_file(&schema, &batches, None);
    let n = bytes.len();
    let footer_len_at = n - 10;
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut head = bytes.clone();
    head[0] = b'X';
    cases.push(("leading magic", head));
    let mut tail = bytes.clone();
    tail[n - 1] = b'2';
    cases.push(("trailing magic", tail));
    for (what, len) in [
        ("negative footer length", -1i32),
        ("most negative footer length", i32::MIN),
        ("footer length larger than the file", n as i32),
        ("footer length just too large", (n - 17) as i32),
        ("footer length 0", 0),
        ("footer length i32::MAX", i32::MAX),
    ] {
        let mut b = bytes.clone();
        b[footer_len_at..footer_len_at + 4].copy_from_slice(&len.to_le_bytes());
        cases.push((what, b));
    }
    cases.push(("magics only", b"ARROW1\0\0\0\0\0\0ARROW1".to_vec()));
    cases.push(("empty", Vec::new()));
    for (what, b) in cases {
        let err = open_err(&ctx, &b);
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{what}: {err}");
    }
    Ok(())
}

/// A file whose schema (in its footer and its stream header alike) holds a
/// `FixedSizeBinary` of width -1: arrow-rs converts such a schema but panics building
/// even an empty array of it, so the reader refuses it when it opens the file.
pub(crate) fn a_schema_arrow_rs_cannot_build_arrays_of_is_invalid_data(f: &Fixture) -> CaseResult {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field, Schema};
    const MARK: i32 = 0x0123_4567;
    let ctx = context(f);
    let schema = Arc::new(Schema::new(vec![
        Field::new("ok", DataType::Int64, false),
        Field::new("f", DataType::FixedSizeBinary(MARK), true),
    ]));
    let mut bytes = arrow_rs_file(&schema, &[], None);
    let mut patched = 0;
    for at in 0..bytes.len() - 3 {
        if bytes[at..at + 4] == MARK.to_le_bytes() {
            bytes[at..at + 4].copy_from_slice(&(-1i32).to_le_bytes());
            patched += 1;
        }
    }
    assert!(patched >= 1, "the width's bytes are in the file");
    let err = open_err(&ctx, &bytes);
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("negative fixed size"), "{err}");
    Ok(())
}

/// The footer of `bytes` and where it starts.
fn footer_start(bytes: &[u8]) -> usize {
    let n = bytes.len();
    let len = i32::from_le_bytes(bytes[n - 10..n - 6].try_into().unwrap()) as usize;
    n - 10 - len
}

/// Where in `bytes` the `Block` struct of record batch `index` is (a 24-byte struct:
/// offset i64, metadata length i32, padding, body length i64).
fn record_block_at(bytes: &[u8], index: usize) -> (usize, ipc::Block) {
    let start = footer_start(bytes);
    let footer = ipc::root_as_footer(&bytes[start..bytes.len() - 10]).unwrap();
    let block = *footer.recordBatches().unwrap().get(index);
    let mut pattern = Vec::new();
    pattern.extend_from_slice(&block.offset().to_le_bytes());
    pattern.extend_from_slice(&block.metaDataLength().to_le_bytes());
    let at = bytes[start..]
        .windows(pattern.len())
        .position(|w| w == pattern)
        .expect("the block in the footer")
        + start;
    (at, block)
}

pub(crate) fn blocks_outside_the_file_or_overlapping_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = small();
    let bytes = arrow_rs_file(&schema, &batches, None);
    let (at, block) = record_block_at(&bytes, 1);
    let (_, first) = record_block_at(&bytes, 0);
    let n = bytes.len() as i64;
    type Edit = Box<dyn Fn(&mut [u8])>;
    let set_offset = |v: i64| -> Edit {
        Box::new(move |b: &mut [u8]| b[at..at + 8].copy_from_slice(&v.to_le_bytes()))
    };
    let set_meta = |v: i32| -> Edit {
        Box::new(move |b: &mut [u8]| b[at + 8..at + 12].copy_from_slice(&v.to_le_bytes()))
    };
    let set_body = |v: i64| -> Edit {
        Box::new(move |b: &mut [u8]| b[at + 16..at + 24].copy_from_slice(&v.to_le_bytes()))
    };
    let cases: Vec<(&str, Edit)> = vec![
        ("offset past EOF", set_offset(n + 100)),
        (
            "offset at the footer",
            set_offset(footer_start(&bytes) as i64),
        ),
        ("negative offset", set_offset(-8)),
        ("offset in the magic", set_offset(0)),
        ("offset i64::MAX", set_offset(i64::MAX)),
        ("negative metadata length", set_meta(-1)),
        ("metadata length past EOF", set_meta(i32::MAX)),
        ("negative body length", set_body(-1)),
        ("body length past EOF", set_body(n)),
        ("body length i64::MAX", set_body(i64::MAX)),
        (
            "overlapping the first block",
            set_offset(first.offset() + 8),
        ),
    ];
    for (what, edit) in cases {
        let mut b = bytes.clone();
        edit(&mut b);
        let err = open_err(&ctx, &b);
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{what}: {err}");
    }
    // A block that points at the other batch's message reads that batch, or fails typed.
    let mut b = bytes.clone();
    b[at..at + 8].copy_from_slice(&first.offset().to_le_bytes());
    let _ = block;
    read_all(&ctx, &b, &batches, &[ErrorKind::InvalidData], "block moved");
    Ok(())
}

pub(crate) fn bit_flips_anywhere_in_an_ipc_file_never_panic(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    for codec in CODECS {
        let (bytes, expected) = dictionary_file(codec);
        let start = footer_start(&bytes);
        let mut intact = 0;
        // Every byte of the footer, its length and the magic; every 7th of the messages.
        let positions: Vec<usize> = (0..start).step_by(7).chain(start..bytes.len()).collect();
        for &at in &positions {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                let good = read_all(
                    &ctx,
                    &b,
                    &expected,
                    &[
                        ErrorKind::InvalidData,
                        ErrorKind::Unsupported,
                        ErrorKind::OutOfRange,
                        ErrorKind::InvalidArgument,
                    ],
                    &format!("{codec:?}: byte {at} ^ {flip:#x}"),
                );
                intact += usize::from(good == expected.len());
            }
        }
        assert!(
            intact > 0 && intact < positions.len() * 3,
            "{codec:?}: {intact} intact"
        );
    }
    Ok(())
}

/// The file offset of the length prefix of the first compressed (not stored) buffer of
/// record batch `index`, that buffer's compressed length, and the message's bytes.
pub(crate) fn first_compressed_buffer(bytes: &[u8], index: usize) -> (usize, usize, &[u8]) {
    let (_, block) = record_block_at(bytes, index);
    let start = block.offset() as usize;
    let body = start + block.metaDataLength() as usize;
    let len = i32::from_le_bytes(bytes[start + 4..start + 8].try_into().unwrap()) as usize;
    let message = ipc::root_as_message(&bytes[start + 8..start + 8 + len]).unwrap();
    let rb = message.header_as_record_batch().unwrap();
    let buffer = rb
        .buffers()
        .unwrap()
        .iter()
        .find(|b| {
            let at = body + b.offset() as usize;
            b.length() > 8 && i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) > 0
        })
        .expect("a compressed buffer");
    (
        body + buffer.offset() as usize,
        buffer.length() as usize,
        &bytes[start..body + block.bodyLength() as usize],
    )
}

pub(crate) fn compressed_buffers_whose_lengths_lie_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let big = data::large(2000);
    let (schema, batches) = (
        big.schema(),
        vec![big.slice(0, 1000), big.slice(1000, 1000)],
    );
    for codec in [CompressionType::LZ4_FRAME, CompressionType::ZSTD] {
        let bytes = arrow_rs_file(&schema, &batches, Some(codec));
        let (at, len, message) = first_compressed_buffer(&bytes, 0);
        let declared = i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let set = |v: i64| {
            let mut b = bytes.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            b
        };
        let mut garbage = bytes.clone();
        garbage[at + 8..at + len].fill(0xab);
        let cases = vec![
            ("declared 1 TiB", set(1 << 40)),
            ("declared i64::MAX", set(i64::MAX)),
            ("declared -2", set(-2)),
            ("declared i64::MIN", set(i64::MIN)),
            ("declared one byte more", set(declared + 1)),
            ("declared one byte less", set(declared - 1)),
            ("declared 0", set(0)),
            ("garbage data", garbage),
        ];
        for (what, b) in cases {
            let before = ctx.bytes_allocated();
            let file = TempFile::with_bytes("lying", &b);
            let reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
            let err = reader.read_batch(0).unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidData,
                "{codec:?} {what}: {err}"
            );
            assert_eq!(
                reader.read_batch(1).unwrap().to_host().unwrap(),
                batches[1],
                "{what}: the other batch is intact"
            );
            drop(reader);
            assert_eq!(ctx.bytes_allocated(), before, "{codec:?} {what}");
        }
        // The reader's limit.
        let file = TempFile::with_bytes("limit", &bytes);
        let mut reader = DeviceFileReader::open(file.path(), &ctx).unwrap();
        assert_eq!(reader.read_batch(0).unwrap().to_host().unwrap(), batches[0]);
        reader.set_decompression_limit(1024);
        let err = reader.read_batch(0).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("limit"), "{err}");
        // The same lie in a stream file: the same message, in a stream.
        let mut stream = Vec::new();
        {
            let options = super::files::options(Some(codec));
            let mut writer = arrow::ipc::writer::StreamWriter::try_new_with_options(
                &mut stream,
                &schema,
                options,
            )
            .unwrap();
            writer.write(&batches[0]).unwrap();
            writer.finish().unwrap();
        }
        let file = TempFile::with_bytes("stream-ok", &stream);
        let mut reader = DeviceStreamReader::from_path(file.path(), &ctx).unwrap();
        assert_eq!(
            reader.next().unwrap().unwrap().to_host().unwrap(),
            batches[0]
        );
        let found = stream
            .windows(message.len())
            .position(|w| w == message)
            .expect("the file's message in the stream");
        let prefix = found + (at - message_offset(&bytes, message));
        stream[prefix..prefix + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
        let file = TempFile::with_bytes("stream-lie", &stream);
        let err = DeviceStreamReader::from_path(file.path(), &ctx)
            .unwrap()
            .next()
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    }
    Ok(())
}

/// Where `message` (a slice of `bytes`) starts in `bytes`.
fn message_offset(bytes: &[u8], message: &[u8]) -> usize {
    message.as_ptr() as usize - bytes.as_ptr() as usize
}

pub(crate) fn missing_files_and_directories_are_file_errors(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let missing = std::env::temp_dir().join("cudabuf-arrow-test-no-such-file.arrow");
    let dir = std::env::temp_dir();
    for path in [&missing, &dir] {
        let err = DeviceFileReader::open(path, &ctx).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{err}");
        assert!(
            err.to_string().contains(&*path.to_string_lossy()),
            "names the path: {err}"
        );
        let err = DeviceStreamReader::from_path(path, &ctx).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{err}");
        let err =
            DeviceFileReader::from_file(std::fs::File::open(&dir).unwrap(), &ctx).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::File, "{err}");
    }
    // A truncated stream file.
    let (schema, batches) = small();
    let stream = data::arrow_rs_stream(&schema, &batches, false);
    for cut in (0..stream.len()).step_by(5) {
        let file = TempFile::with_bytes("stream-cut", &stream[..cut]);
        match DeviceStreamReader::from_path(file.path(), &ctx) {
            Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{cut}: {e}"),
            Ok(reader) => {
                for r in reader {
                    if let Err(e) = r {
                        assert_eq!(e.kind(), ErrorKind::InvalidData, "{cut}: {e}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Two dictionary fields of different value types (a: Utf8, b: Int64) made to share a
/// dictionary id (b's id edited to a's, in an IPC file's footer and in a stream's schema
/// message): one dictionary cannot be both, so the schema is refused when it is read,
/// before any batch (a column of b's type holding a's Utf8 values was returned before).
pub(crate) fn fields_of_different_types_sharing_a_dictionary_id_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    use std::sync::Arc;

    use arrow::array::{DictionaryArray, Int64Array, Int8Array};
    use arrow::datatypes::Int8Type;
    let ctx = context(f);
    let a: DictionaryArray<Int8Type> = vec!["x", "y", "x"].into_iter().collect();
    let b = DictionaryArray::<Int8Type>::try_new(
        Int8Array::from(vec![0, 1, 0]),
        Arc::new(Int64Array::from(vec![1_000_000_007, 42])),
    )
    .unwrap();
    let batch = batch(vec![("a", Arc::new(a) as _), ("b", Arc::new(b) as _)]);
    // Point field b of `schema` (a flatbuffer at `start` in `bytes`) at a's dictionary.
    let share = |bytes: &mut Vec<u8>, start: usize, schema: ipc::Schema<'_>| {
        let fields = schema.fields().unwrap();
        let first = fields.get(0).dictionary().unwrap().id();
        let encoding = fields.get(1).dictionary().unwrap();
        let slot = encoding._tab.vtable().get(ipc::DictionaryEncoding::VT_ID) as usize;
        assert_ne!(slot, 0, "b's dictionary id is written");
        let at = start + encoding._tab.loc() + slot;
        bytes[at..at + 8].copy_from_slice(&first.to_le_bytes());
    };

    // The file: its footer.
    let mut file = arrow_rs_file(&batch.schema(), std::slice::from_ref(&batch), None);
    let start = footer_start(&file);
    let end = file.len() - 10;
    let copy = file.clone();
    let footer = ipc::root_as_footer(&copy[start..end]).unwrap();
    share(&mut file, start, footer.schema().unwrap());
    let err = open_err(&ctx, &file);
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("dictionary id"), "{err}");
    assert!(err.to_string().contains("'a' and 'b'"), "{err}");

    // The stream: its schema message (after the continuation marker and length).
    let mut stream = Vec::new();
    {
        let mut writer = ipc::writer::StreamWriter::try_new(&mut stream, &batch.schema()).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
    }
    let copy = stream.clone();
    let len = i32::from_le_bytes(copy[4..8].try_into().unwrap()) as usize;
    let message = ipc::root_as_message(&copy[8..8 + len]).unwrap();
    share(&mut stream, 8, message.header_as_schema().unwrap());
    let path = TempFile::with_bytes("shared-id.arrows", &stream);
    let err = DeviceStreamReader::from_path(path.path(), &ctx).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("dictionary id"), "{err}");

    // Unedited, both read back.
    let file = arrow_rs_file(&batch.schema(), std::slice::from_ref(&batch), None);
    assert_eq!(
        read_all(&ctx, &file, std::slice::from_ref(&batch), &[], "unedited"),
        1
    );
    Ok(())
}
