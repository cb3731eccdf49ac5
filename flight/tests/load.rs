//! A bounded load test on the simulator over loopback: eight clients, for three seconds,
//! mix `DoGet`s and `DoPut`s of batches (a few large enough to be split into several
//! messages) against one server, each checking what it reads against checksums of what
//! was written. Nothing is lost or corrupted, every allocation is given back, and the
//! server still answers afterwards.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::FlightDescriptor;
use cudabuf_arrow::arrow::array::{Array, Float64Array, Int64Array, RecordBatch, StringArray};
use cudabuf_core::Context;
use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
use futures::TryStreamExt;

use common::{assert_clean, bounded, new_sim, numbers, put_messages, upload, Serving};

const CLIENTS: usize = 8;
const RUN: Duration = Duration::from_secs(3);

/// What was written under a key: its rows and their checksum.
type Written = Arc<Mutex<HashMap<String, (usize, u64)>>>;

/// The rows of `batches` and an FNV-1a hash of their values, in order (so a batch split
/// into several messages sums to the same).
fn checksum(batches: &[RecordBatch]) -> (usize, u64) {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    let mut rows = 0;
    for batch in batches {
        let id = batch
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        let half = batch
            .column(1)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        let name = batch
            .column(2)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        for row in 0..batch.num_rows() {
            eat(&id.value(row).to_le_bytes());
            match half.is_valid(row) {
                true => eat(&half.value(row).to_bits().to_le_bytes()),
                false => eat(b"null"),
            }
            match name.is_valid(row) {
                true => eat(name.value(row).as_bytes()),
                false => eat(b"null"),
            }
            eat(b"|");
        }
        rows += batch.num_rows();
    }
    (rows, hash)
}

/// A small xorshift generator: each client's choices follow from its number.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Debug, Default)]
struct Tally {
    gets: usize,
    puts: usize,
    rows: usize,
}

/// One client's loop until `until`: a `DoGet` of a key already written (and checked
/// against its checksum), or a `DoPut` of a new batch (recorded once the server has
/// answered).
async fn client(id: usize, url: String, ctx: Context, written: Written, until: Instant) -> Tally {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (id as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut tally = Tally::default();
    let mut flight = FlightDeviceClient::connect(&url, None).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut raw = FlightServiceClient::new(channel);
    while Instant::now() < until {
        if rng.below(2) == 0 {
            let keys: Vec<(String, (usize, u64))> = {
                let written = written.lock().unwrap();
                written.iter().map(|(k, v)| (k.clone(), *v)).collect()
            };
            let (key, want) = &keys[rng.below(keys.len() as u64) as usize];
            let on_device: Vec<_> = flight
                .do_get(key.clone(), &ctx)
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap();
            assert!(on_device.iter().all(|b| b.context().same_as(&ctx)));
            let host: Vec<_> = on_device.iter().map(|b| b.to_host().unwrap()).collect();
            assert_eq!(checksum(&host), *want, "client {id}: DoGet {key}");
            tally.gets += 1;
            tally.rows += want.0;
        } else {
            // Mostly small batches; one in twenty of 120 000 rows (about 3 MB), which
            // arrow-rs's encoder splits into messages of 2 MiB.
            let rows = match rng.below(20) {
                0 => 120_000,
                _ => 1 + rng.below(3000) as i64,
            };
            let batch = numbers((id * 1_000_000 + tally.puts) as i64, rows);
            let key = format!("c{id}/{}", tally.puts);
            let messages = put_messages(&key, std::slice::from_ref(&batch)).await;
            raw.do_put(futures::stream::iter(messages))
                .await
                .unwrap()
                .into_inner()
                .try_collect::<Vec<_>>()
                .await
                .unwrap();
            written.lock().unwrap().insert(key, checksum(&[batch]));
            tally.puts += 1;
            tally.rows += rows as usize;
        }
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_mix_do_gets_and_do_puts_and_nothing_is_lost() {
    let (server_sim, server_ctx) = new_sim();
    let (sim, ctx) = new_sim();
    let server = DeviceFlightServer::new(&server_ctx);
    let written: Written = Arc::default();
    for (i, rows) in [10, 1000, 50_000].into_iter().enumerate() {
        let batches = [
            numbers(-(i as i64) - 1, rows),
            numbers(-(i as i64) - 100, 7),
        ];
        let key = format!("base/{i}");
        server
            .insert(
                key.clone(),
                batches[0].schema(),
                upload(&batches, &server_ctx),
            )
            .unwrap();
        written.lock().unwrap().insert(key, checksum(&batches));
    }
    let serving = Serving::start(server.clone(), None).await;

    let start = Instant::now();
    let until = start + RUN;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|id| {
            tokio::spawn(client(
                id,
                serving.url.clone(),
                ctx.clone(),
                written.clone(),
                until,
            ))
        })
        .collect();
    let mut total = Tally::default();
    for client in clients {
        let tally = bounded(client).await.unwrap();
        assert!(tally.gets + tally.puts > 0, "{tally:?}");
        total.gets += tally.gets;
        total.puts += tally.puts;
        total.rows += tally.rows;
    }
    let elapsed = start.elapsed();
    eprintln!(
        "{CLIENTS} clients, {elapsed:?}: {} DoGets, {} DoPuts, {} rows checked",
        total.gets, total.puts, total.rows
    );
    assert!(total.gets >= CLIENTS && total.puts >= CLIENTS, "{total:?}");
    // Every client stopped soon after the deadline (no call hung).
    assert!(elapsed < RUN + Duration::from_secs(20), "{elapsed:?}");
    assert_eq!(
        ctx.bytes_allocated(),
        0,
        "the clients' batches were given back"
    );

    // Nothing lost: every write is on the server, whole.
    let written = written.lock().unwrap().clone();
    assert_eq!(server.keys().len(), written.len());
    for (key, want) in &written {
        let flight = server.get(key.as_bytes()).expect("stored");
        let host: Vec<_> = flight
            .batches
            .iter()
            .map(|b| b.to_host().unwrap())
            .collect();
        assert_eq!(checksum(&host), *want, "{key} on the server");
    }

    // The server still answers.
    let mut client = bounded(FlightDeviceClient::connect(&serving.url, None))
        .await
        .unwrap();
    let info = bounded(
        client.get_flight_info(FlightDescriptor::new_path(vec!["base".into(), "1".into()])),
    )
    .await
    .unwrap();
    assert_eq!(info.total_records, 1007);
    let got: Vec<_> = bounded(async {
        client
            .do_get("base/2", &ctx)
            .await
            .unwrap()
            .try_collect::<Vec<_>>()
            .await
    })
    .await
    .unwrap();
    let host: Vec<_> = got.iter().map(|b| b.to_host().unwrap()).collect();
    assert_eq!(checksum(&host), written["base/2"]);
    drop((got, client));

    serving.stop().await;
    for key in server.keys() {
        server.remove(&key);
    }
    assert_eq!(server_ctx.bytes_allocated(), 0);
    drop(server);
    assert_clean(server_sim, server_ctx);
    assert_clean(sim, ctx);
}
