//! IPC streams on the device: DeviceStreamWriter / serialize_stream and DeviceStreamReader.

use std::sync::Arc;

use arrow::datatypes::Schema;
use cudabuf_arrow::{serialize_stream, DeviceRecordBatch, DeviceStreamReader, DeviceStreamWriter};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{BufferReader, ErrorKind};

use super::data::{self, arrow_rs_stream, batch};
use super::{all_buffers, context, within};

fn read_all(reader: DeviceStreamReader) -> Vec<DeviceRecordBatch> {
    reader
        .collect::<Result<_, _>>()
        .expect("reading the stream")
}

pub(crate) fn stream_bytes_match_arrow_rs_stream_writer(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let expected = arrow_rs_stream(&schema, &batches, false);
    let stream = serialize_stream(&schema, &batches, &ctx).unwrap();
    assert_eq!(stream.size(), expected.len());
    assert!(
        stream.to_vec().unwrap() == expected,
        "stream bytes differ from arrow-rs's"
    );

    let mut writer = DeviceStreamWriter::new(&ctx, &schema).unwrap();
    assert!(writer.is_empty());
    for b in &batches {
        writer.write(b).unwrap();
        // The first message of a size that the pool has no staging buffer for pins one in
        // the background (on CUDA behind the pinning the cases beside this one ask for):
        // wait for it, so that the next message is gathered in it.
        ctx.wait_background_pinning();
    }
    assert_eq!(
        writer.len(),
        expected.len() - 8,
        "all but the end-of-stream marker"
    );
    let (written, serializer) = writer.finish_with_serializer().unwrap();
    assert_eq!(written.to_vec().unwrap(), expected);
    assert!(serializer.staging_size() > 0);

    let mixed = data::mixed();
    let expected = arrow_rs_stream(&mixed.schema(), &[mixed.clone(), mixed.slice(1, 2)], false);
    let stream = serialize_stream(&mixed.schema(), [&mixed, &mixed.slice(1, 2)], &ctx).unwrap();
    assert_eq!(stream.to_vec().unwrap(), expected);
    Ok(())
}

pub(crate) fn stream_with_dictionaries_reads_back_through_buffer_reader(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let stream = serialize_stream(&schema, &batches, &ctx).unwrap();
    let reader = DeviceStreamReader::new(BufferReader::new(stream.clone())).unwrap();
    assert_eq!(reader.schema().fields(), schema.fields());
    let read = read_all(reader);
    assert_eq!(read.len(), batches.len());
    for (device, host) in read.iter().zip(&batches) {
        assert_eq!(device.to_host().unwrap(), *host);
        for buffer in all_buffers(device) {
            assert!(within(buffer, &stream), "{buffer:?} outside the stream");
        }
        for buffer in device.columns()[1].device_buffers() {
            assert!(within(buffer, device.body().unwrap()));
        }
    }
    Ok(())
}

pub(crate) fn stream_dictionaries_stay_on_device_and_are_shared(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let stream = serialize_stream(&schema, &batches, &ctx).unwrap();
    let read = read_all(DeviceStreamReader::from_buffer(&stream).unwrap());
    let dictionary = |b: &DeviceRecordBatch| b.columns()[0].dictionary().unwrap().clone();
    let (first, second) = (dictionary(&read[0]), dictionary(&read[1]));
    // The dictionary batch precedes the record batch and is not part of its body.
    let values = &first.buffers()[1];
    assert!(within(values, &stream));
    assert!(!within(values, read[0].body().unwrap()));
    assert!(values.address() < read[0].body().unwrap().address());
    assert_eq!(
        first.buffers()[1].address(),
        second.buffers()[1].address(),
        "batches 1 and 2 share one dictionary on the device"
    );
    assert_eq!(first.len(), 3);
    let values_host = first.to_host().unwrap();
    assert_eq!(
        values_host
            .as_any()
            .downcast_ref::<arrow::array::StringArray>()
            .unwrap()
            .value(2),
        "lima"
    );
    // The nested dictionary (struct child) resolves too.
    let nested = &read[0].columns()[2].children()[0];
    assert_eq!(nested.dictionary().unwrap().len(), 3);
    Ok(())
}

pub(crate) fn stream_dictionary_replacement_applies_to_later_batches(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let stream = serialize_stream(&schema, &batches, &ctx).unwrap();
    let read = read_all(DeviceStreamReader::from_buffer(&stream).unwrap());
    let dictionary = |b: &DeviceRecordBatch| b.columns()[0].dictionary().unwrap().clone();
    assert_eq!(dictionary(&read[2]).len(), 2, "the replacement");
    assert_ne!(
        dictionary(&read[2]).buffers()[1].address(),
        dictionary(&read[0]).buffers()[1].address()
    );
    // Earlier batches keep theirs.
    assert_eq!(read[0].to_host().unwrap(), batches[0]);
    assert_eq!(read[2].to_host().unwrap(), batches[2]);
    Ok(())
}

pub(crate) fn stream_delta_dictionary_is_unsupported(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::delta_stream();
    let bytes = arrow_rs_stream(&schema, &batches, true);
    let buffer = ctx.buffer_from_data(&bytes).unwrap();
    let mut reader = DeviceStreamReader::from_buffer(&buffer).unwrap();
    assert_eq!(
        reader.next().unwrap().unwrap().to_host().unwrap(),
        batches[0]
    );
    let err = reader.next().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("delta"), "{err}");
    assert!(reader.next().is_none());
    Ok(())
}

pub(crate) fn stream_of_arrow_rs_bytes_copied_to_device_reads_back(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let mixed = data::mixed();
    let batches = vec![mixed.clone(), mixed.slice(2, 3), mixed.slice(0, 0)];
    let bytes = arrow_rs_stream(&mixed.schema(), &batches, false);
    let buffer = ctx.buffer_from_data(&bytes).unwrap();
    let mut reader = BufferReader::new(buffer);
    let stream = DeviceStreamReader::new(reader.clone()).unwrap();
    let read = read_all(stream);
    let host: Vec<_> = read.iter().map(|b| b.to_host().unwrap()).collect();
    assert_eq!(host, batches);
    // A stream in the middle of a buffer, read from the reader's position.
    let mut padded = vec![7u8; 24];
    padded.extend_from_slice(&bytes);
    reader = BufferReader::new(ctx.buffer_from_data(&padded).unwrap());
    reader.seek_to(24).unwrap();
    let mut stream = DeviceStreamReader::new(reader).unwrap();
    assert_eq!(
        stream.next().unwrap().unwrap().to_host().unwrap(),
        batches[0]
    );
    assert_eq!(stream.by_ref().count(), 2);
    assert_eq!(stream.position(), padded.len());
    Ok(())
}

pub(crate) fn stream_writer_rejects_batch_of_other_schema(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let ints = batch(vec![("ints", data::ints())]);
    let strings = batch(vec![("strings", data::strings())]);
    let mut writer = DeviceStreamWriter::new(&ctx, &ints.schema()).unwrap();
    writer.write(&ints).unwrap();
    let err = writer.write(&strings).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let stream = writer.finish().unwrap();
    let read = read_all(DeviceStreamReader::from_buffer(&stream).unwrap());
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].to_host().unwrap(), ints);
    Ok(())
}

pub(crate) fn empty_stream_has_schema_and_no_batches(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let schema = Arc::new(Schema::clone(&data::dictionary_stream().0));
    let stream = serialize_stream(&schema, std::iter::empty(), &ctx).unwrap();
    assert_eq!(
        stream.to_vec().unwrap(),
        arrow_rs_stream(&schema, &[], false)
    );
    let reader = DeviceStreamReader::from_buffer(&stream).unwrap();
    assert_eq!(reader.schema().fields(), schema.fields());
    assert_eq!(read_all(reader).len(), 0);
    // No bytes at all is not a stream.
    let empty = ctx.new_buffer(0).unwrap();
    let err = DeviceStreamReader::from_buffer(&empty).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData);
    Ok(())
}

pub(crate) fn stream_reader_stops_after_an_error(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let (schema, batches) = data::dictionary_stream();
    let mut bytes = arrow_rs_stream(&schema, &batches, false);
    // Cut the stream inside its last record batch.
    bytes.truncate(bytes.len() - 20);
    let buffer = ctx.buffer_from_data(&bytes).unwrap();
    let results: Vec<_> = DeviceStreamReader::from_buffer(&buffer).unwrap().collect();
    assert_eq!(results.len(), 3);
    assert!(results[0].is_ok() && results[1].is_ok());
    assert_eq!(
        results[2].as_ref().unwrap_err().kind(),
        ErrorKind::InvalidData
    );
    Ok(())
}
