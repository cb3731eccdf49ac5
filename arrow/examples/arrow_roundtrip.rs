//! Arrow record batches on the device: serialize, read back zero-copy, stream with
//! dictionaries, and hand a batch over through the Arrow C Device Data Interface.
//!
//! Runs on the simulator:
//! `cargo run -p cudabuf-arrow --example arrow_roundtrip`; on a GPU:
//! `CUDABUF_BACKEND=cuda cargo run -p cudabuf-arrow --features cuda --example arrow_roundtrip`.

use std::error::Error;
use std::sync::Arc;

use arrow::array::{ArrayRef, DictionaryArray, Float64Array, Int64Array, StringArray};
use arrow::datatypes::Int32Type;
use arrow::record_batch::RecordBatch;
use cudabuf_arrow::{
    export_device_record_batch, export_schema, import_device_record_batch, read_record_batch,
    serialize_stream, DeviceStreamReader, Serializer,
};
use cudabuf_core::{Backend, BufferReader};

fn backend() -> Result<Backend, Box<dyn Error>> {
    match std::env::var("CUDABUF_BACKEND").as_deref() {
        Ok("cuda") => {
            #[cfg(feature = "cuda")]
            return Ok(Backend::new(cudabuf_cuda::CudaBackend::new()?));
            #[cfg(not(feature = "cuda"))]
            return Err("CUDABUF_BACKEND=cuda needs `--features cuda`".into());
        }
        _ => Ok(Backend::new(cudabuf_sim::SimBackend::new())),
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let backend = backend()?;
    let ctx = backend.context(0)?;
    println!(
        "backend: {}, device {}",
        backend.kind(),
        ctx.device_number()
    );

    let batch = RecordBatch::try_from_iter([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef,
        ),
        (
            "score",
            Arc::new(Float64Array::from_iter(
                (0..1000).map(|i| (i % 7 != 0).then_some(i as f64 / 3.0)),
            )),
        ),
        (
            "name",
            Arc::new(StringArray::from_iter_values(
                (0..1000).map(|i| format!("row-{i}")),
            )),
        ),
    ])?;

    // One IPC message in one device buffer; a Serializer reuses its pinned staging buffer.
    let mut serializer = Serializer::new(&ctx);
    let message = serializer.serialize_record_batch(&batch)?;
    println!(
        "serialized {} rows into a {}-byte device buffer at {:#x} (staging buffer: {} bytes)",
        batch.num_rows(),
        message.size(),
        message.address(),
        serializer.staging_size()
    );

    // Read it back: metadata to the host, every column buffer a slice of the device body.
    let on_device = read_record_batch(&message, &batch.schema())?;
    let body = on_device.body().expect("read from a message");
    for (field, column) in batch.schema().fields().iter().zip(on_device.columns()) {
        let buffers: Vec<String> = column
            .device_buffers()
            .iter()
            .map(|b| {
                format!(
                    "+{}..{}",
                    b.address() - body.address(),
                    b.address() - body.address() + b.size() as u64
                )
            })
            .collect();
        println!(
            "  column {:>5}: {} rows, {} nulls, body slices {}",
            field.name(),
            column.len(),
            column.null_count(),
            buffers.join(" ")
        );
    }
    assert_eq!(on_device.to_host()?, batch);
    println!("to_host() equals the original batch");

    // A stream with a dictionary-encoded column, read through a BufferReader.
    let cities: DictionaryArray<Int32Type> =
        ["oslo", "lima", "oslo", "accra"].into_iter().collect();
    let with_dictionary = RecordBatch::try_from_iter([("city", Arc::new(cities) as ArrayRef)])?;
    let stream = serialize_stream(
        &with_dictionary.schema(),
        [&with_dictionary, &with_dictionary],
        &ctx,
    )?;
    let reader = DeviceStreamReader::new(BufferReader::new(stream.clone()))?;
    for (i, device_batch) in reader.enumerate() {
        let device_batch = device_batch?;
        let dictionary = device_batch.columns()[0]
            .dictionary()
            .expect("a dictionary");
        println!(
            "stream batch {i}: {} rows, dictionary of {} values at {:#x} (stream starts at {:#x})",
            device_batch.num_rows(),
            dictionary.len(),
            dictionary.buffers()[1].address(),
            stream.address()
        );
        assert_eq!(device_batch.to_host()?, with_dictionary);
    }

    // The Arrow C Device Data Interface: what cuDF or pyarrow's _import_from_c_device take.
    let mut exported = export_device_record_batch(&on_device)?;
    let schema = export_schema(&batch.schema())?;
    println!(
        "exported: device_type {}, device_id {}, {} children; schema format {:?}",
        exported.device_type(),
        exported.device_id(),
        exported.array().n_children(),
        schema.format()
    );
    // SAFETY: `exported` is a valid array cudabuf made just above; the import moves it out
    // (leaving `exported` released, so dropping it does nothing).
    let imported = unsafe { import_device_record_batch(&mut exported, batch.schema(), &ctx)? };
    assert!(exported.is_released());
    assert_eq!(imported.to_host()?, batch);
    println!("imported back without a copy; to_host() equals the original");

    drop((message, on_device, imported, stream));
    println!("bytes allocated at the end: {}", ctx.bytes_allocated());
    Ok(())
}
