//! The cudabuf client `DoGet`s from a pyarrow.flight server (plain and LZ4_FRAME bodies)
//! into device memory on the simulator. Needs `python3` with pyarrow: without it the test
//! says why and does nothing, unless `CUDABUF_REQUIRE_PYARROW=1` (set in CI), which makes
//! it fail instead.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use cudabuf_arrow::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use cudabuf_arrow::arrow::compute::concat_batches;
use cudabuf_core::Backend;
use cudabuf_flight::FlightDeviceClient;
use futures::TryStreamExt;

const LIMIT: Duration = Duration::from_secs(60);

const SERVER: &str = r#"
import sys
import pyarrow as pa
import pyarrow.flight as fl

n = 4000
table = pa.table({
    "id": pa.array(range(n), pa.int64()),
    "half": pa.array([None if i % 3 == 0 else i / 2 for i in range(n)], pa.float64()),
    "s": pa.array([f"v{i}" for i in range(n)], pa.utf8()),
})
table = pa.Table.from_batches(table.to_batches(max_chunksize=1000))

class Server(fl.FlightServerBase):
    def do_get(self, context, ticket):
        compression = "lz4" if ticket.ticket == b"lz4" else None
        return fl.RecordBatchStream(table, options=pa.ipc.IpcWriteOptions(compression=compression))

server = Server("grpc://127.0.0.1:0")
print("PORT", server.port, flush=True)
sys.stdin.read()  # serve until the test closes our stdin
server.shutdown()
"#;

fn expected() -> RecordBatch {
    let n = 4000i64;
    RecordBatch::try_from_iter_with_nullable([
        (
            "id",
            Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef,
            true,
        ),
        (
            "half",
            Arc::new(Float64Array::from_iter(
                (0..n).map(|i| (i % 3 != 0).then_some(i as f64 / 2.0)),
            )) as _,
            true,
        ),
        (
            "s",
            Arc::new(StringArray::from_iter_values(
                (0..n).map(|i| format!("v{i}")),
            )) as _,
            true,
        ),
    ])
    .unwrap()
}

/// Whether `python3` imports pyarrow.flight; `Err` with the reason when it does not.
fn pyarrow_flight() -> Result<(), String> {
    match Command::new("python3")
        .args(["-c", "import pyarrow.flight"])
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "python3 cannot import pyarrow.flight: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("python3 cannot be run: {e}")),
    }
}

/// The server process, killed if the test fails before closing it.
struct PyServer(Child);

impl Drop for PyServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn do_get_from_a_pyarrow_flight_server_plain_and_lz4() {
    if let Err(reason) = pyarrow_flight() {
        if std::env::var("CUDABUF_REQUIRE_PYARROW").as_deref() == Ok("1") {
            panic!("CUDABUF_REQUIRE_PYARROW=1 and {reason}");
        }
        eprintln!("SKIPPED: {reason} (set CUDABUF_REQUIRE_PYARROW=1 to make this a failure)");
        return;
    }
    let mut child = PyServer(
        Command::new("python3")
            .args(["-c", SERVER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 starts"),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(LIMIT).expect("the server prints its port");
    let port: u16 = line
        .strip_prefix("PORT ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a port line: {line:?}"));

    let sim = cudabuf_sim::SimBackend::new();
    let ctx = Backend::new(sim.clone()).context(0).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let url = format!("http://127.0.0.1:{port}");
        let mut client = tokio::time::timeout(LIMIT, FlightDeviceClient::connect(&url, None))
            .await
            .expect("in time")
            .unwrap();
        for ticket in ["plain", "lz4"] {
            let batches: Vec<_> = tokio::time::timeout(LIMIT, async {
                client
                    .do_get(ticket, &ctx)
                    .await?
                    .try_collect::<Vec<_>>()
                    .await
            })
            .await
            .expect("in time")
            .unwrap();
            assert_eq!(batches.len(), 4, "{ticket}");
            assert!(batches.iter().all(|b| b.context().same_as(&ctx)));
            let host: Vec<_> = batches.iter().map(|b| b.to_host().unwrap()).collect();
            let want = expected();
            assert_eq!(
                concat_batches(&want.schema(), &host).unwrap(),
                want,
                "{ticket}"
            );
        }
    });
    drop(child.0.stdin.take());
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(ctx.bytes_allocated(), 0);
    let probe = sim.leak_probe();
    drop((ctx, sim));
    assert!(probe.leak_report().is_empty());
}
