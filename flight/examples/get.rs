//! `DoGet` from any Flight server into device memory (the simulator, or a GPU with
//! `CUDABUF_BACKEND=cuda` and `--features cudabuf/cuda`), then back to the host into an
//! Arrow IPC file, for checking:
//! `cargo run -p cudabuf-flight --example get -- URL TICKET OUT.arrow [--token T]`.
//!
//! Prints `BATCHES <n> ROWS <n>` and the device bytes the batches held.

use cudabuf_arrow::arrow::ipc::writer::FileWriter;
use cudabuf_flight::BlockingFlightClient;

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
    let [url, ticket, out] = <[String; 3]>::try_from(positional)
        .map_err(|_| "usage: get URL TICKET OUT.arrow [--token T]")?;

    // The simulator unless CUDABUF_BACKEND=cuda (built with `--features cudabuf/cuda`).
    let ctx = cudabuf::backend_from_env()?.context(0)?;
    let mut client = BlockingFlightClient::connect(&url, token.as_deref())?;
    let (schema, batches) = client.do_get(ticket.into_bytes(), &ctx)?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    println!(
        "BATCHES {} ROWS {rows} DEVICE_BYTES {}",
        batches.len(),
        ctx.bytes_allocated()
    );
    let mut writer = FileWriter::try_new(std::fs::File::create(out)?, &schema)?;
    for batch in &batches {
        writer.write(&batch.to_host()?)?;
    }
    writer.finish()?;
    Ok(())
}
