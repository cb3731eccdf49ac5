//! `DoPut` or `DoExchange` of device batches with any Flight server, on the simulator: the
//! batches are read from an Arrow IPC stream file into device memory (dictionaries
//! included), sent from there, and a `DoExchange`'s answer lands in device memory before
//! it is written back to an IPC stream file, for checking:
//!
//! ```text
//! cargo run -p cudabuf-flight --example send -- put URL PATH IN.arrows [--token T]
//! cargo run -p cudabuf-flight --example send -- exchange URL COMMAND IN.arrows OUT.arrows [--token T]
//! ```
//!
//! `put` sends under the descriptor path `PATH`, `exchange` under the command `COMMAND`.
//! Prints `BATCHES <n> ROWS <n>` of what was sent, and for `exchange` `ANSWER_BATCHES <n>
//! ANSWER_ROWS <n>`.

use arrow_flight::FlightDescriptor;
use cudabuf_arrow::arrow::ipc::writer::StreamWriter;
use cudabuf_arrow::{DeviceRecordBatch, DeviceStreamReader};
use cudabuf_flight::BlockingFlightClient;

const USAGE: &str = "usage: send put URL PATH IN.arrows [--token T] | send exchange URL COMMAND IN.arrows OUT.arrows [--token T]";

fn rows(batches: &[DeviceRecordBatch]) -> usize {
    batches.iter().map(DeviceRecordBatch::num_rows).sum()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut positional = Vec::new();
    let mut token = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--token" => token = Some(args.next().ok_or("--token needs a value")?),
            _ => positional.push(arg),
        }
    }
    let ctx = cudabuf_core::Backend::new(cudabuf_sim::SimBackend::new()).context(0)?;
    let read = |path: &str| -> Result<_, Box<dyn std::error::Error>> {
        let reader = DeviceStreamReader::from_path(path, &ctx)?;
        let schema = reader.schema().clone();
        let batches = reader.collect::<Result<Vec<_>, _>>()?;
        Ok((schema, batches))
    };
    match positional.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["put", url, path, input] => {
            let (schema, batches) = read(input)?;
            println!("BATCHES {} ROWS {}", batches.len(), rows(&batches));
            let mut client = BlockingFlightClient::connect(url, token.as_deref())?;
            let descriptor =
                FlightDescriptor::new_path(path.split('/').map(str::to_owned).collect());
            client.do_put(descriptor, schema, batches)?;
        }
        ["exchange", url, command, input, output] => {
            let (schema, batches) = read(input)?;
            println!("BATCHES {} ROWS {}", batches.len(), rows(&batches));
            let mut client = BlockingFlightClient::connect(url, token.as_deref())?;
            let descriptor = FlightDescriptor::new_cmd(command.to_owned());
            let (answer_schema, answers) = client.do_exchange(descriptor, schema, batches, &ctx)?;
            println!(
                "ANSWER_BATCHES {} ANSWER_ROWS {}",
                answers.len(),
                rows(&answers)
            );
            let mut writer = StreamWriter::try_new(std::fs::File::create(output)?, &answer_schema)?;
            for answer in &answers {
                writer.write(&answer.to_host()?)?;
            }
            writer.finish()?;
        }
        _ => return Err(USAGE.into()),
    }
    Ok(())
}
