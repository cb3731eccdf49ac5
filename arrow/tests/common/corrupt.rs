//! Truncated, bit-flipped and crafted messages: typed errors, never a panic.

use arrow::datatypes::SchemaRef;
use arrow::ipc;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{
    read_message, read_record_batch, serialize_record_batch, serialize_stream, DeviceStreamReader,
};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{BufferReader, DeviceBuffer, ErrorKind};

use super::context;
use super::data::{self, arrow_rs_message, arrow_rs_stream, batch};

fn small() -> RecordBatch {
    batch(vec![
        ("ints", data::ints().slice(0, 4)),
        ("strings", data::strings().slice(0, 4)),
        ("list", data::list().slice(0, 4)),
        ("struct", data::structs()),
    ])
}

/// Where the body starts in an encapsulated message.
fn body_start(message: &[u8]) -> usize {
    8 + u32::from_le_bytes(message[4..8].try_into().unwrap()) as usize
}

/// Read `bytes` (copied into `device`, which has their size) as a record batch of
/// `schema`: `Err` must be of one of `kinds`; an `Ok` batch must copy to the host or fail
/// with `InvalidData`.
fn read_corrupt(
    device: &DeviceBuffer,
    bytes: &[u8],
    schema: &SchemaRef,
    kinds: &[ErrorKind],
) -> bool {
    device.copy_from_host(bytes, 0, None).unwrap();
    match read_record_batch(device, schema) {
        Err(e) => {
            assert!(kinds.contains(&e.kind()), "{e}");
            false
        }
        Ok(batch) => {
            if let Err(e) = batch.to_host() {
                assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
            }
            true
        }
    }
}

pub(crate) fn every_truncation_of_a_message_is_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = small();
    let bytes = arrow_rs_message(&b);
    let full = ctx.buffer_from_data(&bytes).unwrap();
    assert_eq!(
        read_record_batch(&full, &b.schema())
            .unwrap()
            .to_host()
            .unwrap(),
        b
    );
    for n in 0..bytes.len() {
        let truncated = full.slice(0, n).unwrap();
        let err = read_record_batch(&truncated, &b.schema()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{n} bytes: {err}");
        let mut reader = BufferReader::new(truncated);
        assert_eq!(
            read_message(&mut reader).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        assert_eq!(
            reader.position(),
            0,
            "a failed read does not move the reader"
        );
    }
    Ok(())
}

pub(crate) fn every_truncation_of_a_stream_is_an_error_never_a_panic(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let bytes = arrow_rs_stream(&schema, &batches, false);
    let full = ctx.buffer_from_data(&bytes).unwrap();
    for n in 0..bytes.len() {
        let truncated = full.slice(0, n).unwrap();
        let reader = match DeviceStreamReader::from_buffer(&truncated) {
            Ok(reader) => reader,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidData, "{n} bytes: {e}");
                continue;
            }
        };
        let mut read = 0;
        for result in reader {
            match result {
                Ok(batch) => {
                    assert_eq!(batch.to_host().unwrap(), batches[read], "{n} bytes");
                    read += 1;
                }
                Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidData, "{n} bytes: {e}"),
            }
        }
        assert!(read < batches.len() || n >= bytes.len() - 8);
    }
    Ok(())
}

pub(crate) fn bit_flips_in_metadata_length_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = small();
    let bytes = arrow_rs_message(&b);
    let device = ctx.new_buffer(bytes.len()).unwrap();
    // The continuation marker and the metadata length.
    for bit in 0..64 {
        let mut corrupt = bytes.clone();
        corrupt[bit / 8] ^= 1 << (bit % 8);
        let ok = read_corrupt(&device, &corrupt, &b.schema(), &[ErrorKind::InvalidData]);
        assert!(!ok, "flipping bit {bit} of the prefix was not detected");
    }
    Ok(())
}

pub(crate) fn bit_flips_in_body_length_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = small();
    let bytes = arrow_rs_message(&b);
    let start = body_start(&bytes);
    let body_len = (bytes.len() - start) as i64;
    let at = bytes[8..start]
        .windows(8)
        .position(|w| w == body_len.to_le_bytes())
        .expect("the body length in the metadata")
        + 8;
    let device = ctx.new_buffer(bytes.len()).unwrap();
    for bit in 0..64 {
        let mut corrupt = bytes.clone();
        corrupt[at + bit / 8] ^= 1 << (bit % 8);
        let ok = read_corrupt(&device, &corrupt, &b.schema(), &[ErrorKind::InvalidData]);
        assert!(
            !ok,
            "flipping bit {bit} of the body length was not detected"
        );
    }
    Ok(())
}

pub(crate) fn bit_flips_in_flatbuffer_metadata_never_panic(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = small();
    let bytes = arrow_rs_message(&b);
    let device = ctx.new_buffer(bytes.len()).unwrap();
    let mut accepted = 0;
    for bit in 64..body_start(&bytes) * 8 {
        let mut corrupt = bytes.clone();
        corrupt[bit / 8] ^= 1 << (bit % 8);
        if read_corrupt(
            &device,
            &corrupt,
            &b.schema(),
            &[ErrorKind::InvalidData, ErrorKind::Unsupported],
        ) {
            accepted += 1;
        }
    }
    // Flips in padding and in values (a null count, a buffer offset) may still frame a
    // message; most flips must be caught.
    assert!(
        accepted < body_start(&bytes) * 8 / 2,
        "{accepted} flips accepted"
    );
    Ok(())
}

/// `bytes` (a record batch message) with its metadata rebuilt by `edit`, and the body kept.
fn rebuild(bytes: &[u8], edit: impl FnOnce(&mut Edit)) -> Vec<u8> {
    let start = body_start(bytes);
    let message = ipc::root_as_message(&bytes[8..start]).unwrap();
    let batch = message.header_as_record_batch().unwrap();
    let mut e = Edit {
        length: batch.length(),
        nodes: batch
            .nodes()
            .unwrap()
            .iter()
            .map(|n| (n.length(), n.null_count()))
            .collect(),
        buffers: batch
            .buffers()
            .unwrap()
            .iter()
            .map(|b| (b.offset(), b.length()))
            .collect(),
        compressed: false,
        body: bytes[start..].to_vec(),
    };
    edit(&mut e);
    let mut fbb = flatbuffers::FlatBufferBuilder::new();
    let nodes: Vec<_> = e
        .nodes
        .iter()
        .map(|&(l, n)| ipc::FieldNode::new(l, n))
        .collect();
    let buffers: Vec<_> = e
        .buffers
        .iter()
        .map(|&(o, l)| ipc::Buffer::new(o, l))
        .collect();
    let nodes = fbb.create_vector(&nodes);
    let buffers = fbb.create_vector(&buffers);
    let compression = e
        .compressed
        .then(|| ipc::BodyCompression::create(&mut fbb, &ipc::BodyCompressionArgs::default()));
    let record_batch = ipc::RecordBatch::create(
        &mut fbb,
        &ipc::RecordBatchArgs {
            length: e.length,
            nodes: Some(nodes),
            buffers: Some(buffers),
            compression,
            variadicBufferCounts: None,
        },
    );
    let root = ipc::Message::create(
        &mut fbb,
        &ipc::MessageArgs {
            version: ipc::MetadataVersion::V5,
            header_type: ipc::MessageHeader::RecordBatch,
            header: Some(record_batch.as_union_value()),
            bodyLength: e.body.len() as i64,
            custom_metadata: None,
        },
    );
    fbb.finish(root, None);
    let mut metadata = fbb.finished_data().to_vec();
    metadata.resize(metadata.len().next_multiple_of(8), 0);
    let mut out = vec![0xff; 4];
    out.extend_from_slice(&(metadata.len() as u32).to_le_bytes());
    out.extend_from_slice(&metadata);
    out.extend_from_slice(&e.body);
    out
}

type EditFn = Box<dyn FnOnce(&mut Edit)>;

struct Edit {
    length: i64,
    nodes: Vec<(i64, i64)>,
    buffers: Vec<(i64, i64)>,
    compressed: bool,
    body: Vec<u8>,
}

fn crafted(f: &Fixture, b: &RecordBatch, edit: impl FnOnce(&mut Edit)) -> cudabuf_core::Result<()> {
    let ctx = context(f);
    let bytes = rebuild(&arrow_rs_message(b), edit);
    let device = ctx.buffer_from_data(&bytes).unwrap();
    read_record_batch(&device, &b.schema()).map(|_| ())
}

pub(crate) fn buffer_descriptor_outside_body_is_invalid_data(f: &Fixture) -> CaseResult {
    let b = small();
    // The rebuilt message itself is fine.
    crafted(f, &b, |_| {}).unwrap();
    let edits: Vec<(&str, EditFn)> = vec![
        (
            "offset past the body",
            Box::new(|e| e.buffers[1].0 = e.body.len() as i64),
        ),
        (
            "length past the body",
            Box::new(|e| e.buffers[1].1 = e.body.len() as i64 + 1),
        ),
        ("negative offset", Box::new(|e| e.buffers[1].0 = -8)),
        ("negative length", Box::new(|e| e.buffers[1].1 = -1)),
        ("huge offset", Box::new(|e| e.buffers[1].0 = i64::MAX)),
        ("values too short", Box::new(|e| e.buffers[1].1 = 4)),
        ("validity too short", Box::new(|e| e.buffers[0].1 = 0)),
        (
            "missing buffer",
            Box::new(|e| {
                e.buffers.pop();
            }),
        ),
        ("extra buffer", Box::new(|e| e.buffers.push((0, 0)))),
        (
            "missing node",
            Box::new(|e| {
                e.nodes.pop();
            }),
        ),
        ("extra node", Box::new(|e| e.nodes.push((0, 0)))),
        (
            "null count over length",
            Box::new(|e| e.nodes[0].1 = e.nodes[0].0 + 1),
        ),
        ("negative node length", Box::new(|e| e.nodes[0].0 = -1)),
        ("column longer than batch", Box::new(|e| e.nodes[0].0 += 1)),
        ("negative row count", Box::new(|e| e.length = -1)),
        (
            "struct child too short",
            Box::new(|e| {
                let child = e.nodes.len() - 2;
                e.nodes[child].0 = 1;
                e.nodes[child].1 = 0;
            }),
        ),
    ];
    for (what, edit) in edits {
        let err = crafted(f, &b, edit).expect_err(what);
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{what}: {err}");
    }
    Ok(())
}

pub(crate) fn trailing_bytes_after_the_message_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = small();
    let mut bytes = arrow_rs_message(&b);
    bytes.extend_from_slice(&[0u8; 8]);
    let device = ctx.buffer_from_data(&bytes).unwrap();
    let err = read_record_batch(&device, &b.schema()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    // read_message reads the message and leaves the rest.
    let message = read_message(&device).unwrap();
    assert_eq!(message.len(), bytes.len() - 8);
    let read = cudabuf_arrow::DeviceRecordBatch::from_message(&message, &b.schema()).unwrap();
    assert_eq!(read.to_host().unwrap(), b);
    Ok(())
}

pub(crate) fn compressed_body_is_unsupported(f: &Fixture) -> CaseResult {
    let b = small();
    let err = crafted(f, &b, |e| e.compressed = true).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("compress"), "{err}");
    Ok(())
}

pub(crate) fn corrupt_offsets_on_device_are_invalid_data_on_to_host(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let b = batch(vec![("strings", data::strings())]);
    let device =
        read_record_batch(&serialize_record_batch(&b, &ctx).unwrap(), &b.schema()).unwrap();
    let offsets = &device.columns()[0].buffers()[0];
    offsets
        .copy_from_host(&i32::MAX.to_le_bytes(), 8, None)
        .unwrap();
    assert_eq!(device.to_host().unwrap_err().kind(), ErrorKind::InvalidData);
    assert_eq!(
        device.columns()[0].to_host().unwrap_err().kind(),
        ErrorKind::InvalidData
    );
    // A dictionary key out of range.
    let d = batch(vec![("d", data::dictionary(&[Some("a"), Some("b")]))]);
    let stream = serialize_stream(&d.schema(), [&d], &ctx).unwrap();
    let device = DeviceStreamReader::from_buffer(&stream)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let keys = &device.columns()[0].buffers()[0];
    keys.copy_from_host(&99i32.to_le_bytes(), 4, None).unwrap();
    assert_eq!(device.to_host().unwrap_err().kind(), ErrorKind::InvalidData);
    Ok(())
}
