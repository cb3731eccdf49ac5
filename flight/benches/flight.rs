//! Arrow Flight over loopback into and out of device memory, beside arrow-flight's own
//! host-memory client in the same run, on the backend `CUDABUF_BACKEND` names (`sim`, the
//! default, or `cuda`).
//!
//! The data: `--total` bytes (1 GiB by default) of batches of 8 int64 columns, `--rows`
//! rows each (1 Mi by default: 16 batches of 64 MiB). With `S` concurrent streams (each
//! of `--streams`, 1,4,16 by default) the batches are dealt round-robin into `S` parts and
//! each part is fetched (or sent) by its own stream on its own connection. Rows:
//!
//! - `arrow-flight DoGet -> host`: arrow-flight's `FlightClient` and
//!   `FlightRecordBatchStream` from a plain arrow-flight server of host batches (the
//!   bench's own, encoded by arrow-rs's `FlightDataEncoderBuilder`): the bound for the
//!   client side.
//! - `cudabuf DoGet host server -> device`: `FlightDeviceClient::do_get` from that same
//!   host server, landing in device memory.
//! - `cudabuf DoGet device server -> device`: a `DeviceFlightServer` of device batches to
//!   `FlightDeviceClient::do_get` (device to device through the wire).
//! - `arrow-flight DoPut host ->` and `cudabuf DoPut device ->`: arrow-flight's
//!   `FlightClient::do_put` of host batches and `FlightDeviceClient::do_put` of device
//!   batches into the host server, which reads every message and discards it.
//! - `cudabuf DoPut device -> DeviceFlightServer`: the same device batches into a
//!   `DeviceFlightServer`, which keeps them in device memory.
//!
//! Each `cudabuf` row carries its ratio to the arrow-flight row of its direction. Figures
//! are medians of `--reps` runs; GB/s with 1 GB = 1e9 bytes of column data (what the
//! batches hold, not the bytes on the wire).
//!
//! Knobs (the same on the client's `Endpoint` and the server's `Server::builder`):
//! `--message-sizes` (the most bytes of body in one message every sender makes: the
//! arrow-rs encoder's `max_flight_data_size` of the host server and the host client's
//! DoPut, `with_max_flight_data_size` of the `DeviceFlightServer` and of
//! `FlightDeviceClient`; one pass per size, 2M by default),
//! `--stream-window BYTES` and `--conn-window BYTES` (HTTP/2 `initial_stream_window_size`
//! and `initial_connection_window_size`; cudabuf-flight's defaults when absent,
//! `DEFAULT_STREAM_WINDOW` and `DEFAULT_CONNECTION_WINDOW`), `--tonic-windows` (neither
//! set: tonic's and hyper's defaults) and `--adaptive` (`http2_adaptive_window`).
//! `--pool-limit BYTES` sets the context's staging pool limit (`256M` by default on CUDA):
//! the bench's clients and servers share one process and one context, so their pinned
//! blocks and staging buffers come from one pool, where two processes would have one
//! each.
//!
//! ```text
//! cargo bench -p cudabuf-flight --bench flight -- --total 64M --rows 128K --streams 1,4
//! CUDABUF_BACKEND=cuda cargo bench -p cudabuf-flight --features cudabuf/cuda --bench flight -- \
//!     --streams 1,4,16 --message-sizes 2M,16M,64M --json flight.json
//! flight [--total 1G] [--rows 1M] [--streams 1,4,16] [--reps N] [--message-sizes 2M,16M]
//!        [--stream-window B] [--conn-window B] [--tonic-windows] [--adaptive]
//!        [--pool-limit B] [--json PATH]
//! flight --serve-only PORT [--total ..] [--rows ..] [--message-sizes M]
//! ```
//!
//! `--serve-only PORT` (0 picks a free port) serves the host server alone on 127.0.0.1,
//! prints `PORT <n>` and stops when its standard input closes (for
//! `scripts/bench_flight.py`). Its tickets are `host/S/I`, the `I`-th of `S` parts;
//! `DoPut`s are read and discarded.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudabuf_arrow::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use cudabuf_arrow::arrow::datatypes::SchemaRef;
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::Context;
use cudabuf_flight::arrow_flight::encode::FlightDataEncoderBuilder;
use cudabuf_flight::arrow_flight::flight_service_client::FlightServiceClient;
use cudabuf_flight::arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use cudabuf_flight::arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightClient, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use cudabuf_flight::{DeviceFlightServer, FlightDeviceClient};
use futures::stream::{self, BoxStream};
use futures::{StreamExt, TryStreamExt};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tonic::transport::server::Router;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const MIB: usize = 1 << 20;
const COLUMNS: usize = 8;

struct Options {
    total: usize,
    rows: usize,
    streams: Vec<usize>,
    reps: usize,
    message_sizes: Vec<usize>,
    stream_window: Option<u32>,
    conn_window: Option<u32>,
    adaptive: bool,
    /// The context's staging pool limit (`Context::set_staging_pool_limit`), if given.
    pool_limit: Option<usize>,
    json: Option<PathBuf>,
    serve_only: Option<u16>,
}

fn parse_size(s: &str) -> AnyResult<usize> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: usize = digits.parse()?;
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KIB" => 1 << 10,
        "M" | "MIB" => 1 << 20,
        "G" | "GIB" => 1 << 30,
        other => return Err(format!("unknown size unit {other:?} in {s:?}").into()),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("{s:?} is too large").into())
}

fn parse_list<T>(s: &str, one: impl Fn(&str) -> AnyResult<T>) -> AnyResult<Vec<T>> {
    s.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(one)
        .collect()
}

fn parse_window(s: &str) -> AnyResult<u32> {
    Ok(u32::try_from(parse_size(s)?)?)
}

fn parse_options() -> AnyResult<Options> {
    let mut o = Options {
        total: 1 << 30,
        rows: MIB,
        streams: vec![1, 4, 16],
        reps: 5,
        message_sizes: vec![2 * MIB],
        stream_window: Some(cudabuf_flight::DEFAULT_STREAM_WINDOW),
        conn_window: Some(cudabuf_flight::DEFAULT_CONNECTION_WINDOW),
        adaptive: false,
        pool_limit: None,
        json: None,
        serve_only: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--total" => o.total = parse_size(&value()?)?,
            "--rows" => o.rows = parse_size(&value()?)?,
            "--streams" => o.streams = parse_list(&value()?, |s| Ok(s.trim().parse()?))?,
            "--reps" => o.reps = value()?.parse()?,
            "--message-sizes" => o.message_sizes = parse_list(&value()?, parse_size)?,
            "--stream-window" => o.stream_window = Some(parse_window(&value()?)?),
            "--conn-window" => o.conn_window = Some(parse_window(&value()?)?),
            "--tonic-windows" => (o.stream_window, o.conn_window) = (None, None),
            "--adaptive" => o.adaptive = true,
            "--pool-limit" => o.pool_limit = Some(parse_size(&value()?)?),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--serve-only" => o.serve_only = Some(value()?.parse()?),
            // `cargo bench` passes `--bench`.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?} (see the file's docs)").into()),
        }
    }
    let batch = o.rows * COLUMNS * 8;
    if o.rows == 0 || o.total < batch {
        return Err(format!(
            "--total {} holds no batch of --rows {} ({} bytes)",
            o.total, o.rows, batch
        )
        .into());
    }
    let batches = o.total / batch;
    if o.reps == 0 || o.streams.is_empty() || o.message_sizes.is_empty() {
        return Err("--reps, --streams and --message-sizes need at least one".into());
    }
    // (`--serve-only` serves any split its clients ask for.)
    if let Some(&s) = o
        .streams
        .iter()
        .find(|&&s| o.serve_only.is_none() && (s == 0 || s > batches))
    {
        return Err(format!("{s} streams for {batches} batches: each stream needs one").into());
    }
    Ok(o)
}

/// The bench's data: `count` batches of 8 int64 columns of `rows` rows.
fn make_batches(count: usize, rows: usize) -> AnyResult<Vec<RecordBatch>> {
    (0..count)
        .map(|b| {
            let columns = (0..COLUMNS).map(|c| {
                let base = ((b * COLUMNS + c) * rows) as i64;
                let values: Int64Array = (0..rows as i64).map(|r| base + r).collect();
                (format!("c{c}"), Arc::new(values) as ArrayRef)
            });
            Ok(RecordBatch::try_from_iter(columns)?)
        })
        .collect()
}

/// The batches of part `part` of `parts` (round-robin).
fn part<T: Clone>(all: &[T], parts: usize, part: usize) -> Vec<T> {
    all.iter().skip(part).step_by(parts).cloned().collect()
}

fn ticket(parts: usize, part: usize) -> String {
    format!("host/{parts}/{part}")
}

/// A plain arrow-flight server of host batches: `DoGet` of ticket `host/S/I` encodes the
/// `I`-th of `S` parts with arrow-rs; `DoPut` reads every message and discards it.
#[derive(Clone)]
struct HostServer {
    schema: SchemaRef,
    batches: Arc<Vec<RecordBatch>>,
    max_flight_data_size: usize,
}

impl HostServer {
    fn parts_of(&self, ticket: &[u8]) -> Result<Vec<RecordBatch>, Status> {
        let text = std::str::from_utf8(ticket).map_err(|_| Status::not_found("a ticket"))?;
        let mut it = text.split('/');
        let (Some("host"), Some(parts), Some(i), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(Status::not_found(format!("no flight {text:?}")));
        };
        let parts: usize = parts.parse().map_err(|_| Status::not_found(text))?;
        let i: usize = i.parse().map_err(|_| Status::not_found(text))?;
        if parts == 0 || i >= parts {
            return Err(Status::not_found(format!("no part {text:?}")));
        }
        Ok(part(&self.batches, parts, i))
    }
}

#[tonic::async_trait]
impl FlightService for HostServer {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoActionStream = BoxStream<'static, Result<cudabuf_flight::arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented("handshake"))
    }
    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        Err(Status::unimplemented("ListFlights"))
    }
    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Err(Status::unimplemented("GetFlightInfo"))
    }
    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("PollFlightInfo"))
    }
    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        Err(Status::unimplemented("GetSchema"))
    }
    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        let batches = self.parts_of(&request.get_ref().ticket)?;
        let encoded = FlightDataEncoderBuilder::new()
            .with_schema(self.schema.clone())
            .with_max_flight_data_size(self.max_flight_data_size)
            .build(stream::iter(batches.into_iter().map(Ok)))
            .map_err(Status::from);
        Ok(Response::new(encoded.boxed()))
    }
    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let mut incoming = request.into_inner();
        let mut bytes = 0usize;
        while let Some(message) = incoming.message().await? {
            bytes += message.data_body.len();
        }
        log::debug!("DoPut: {bytes} body bytes discarded");
        Ok(Response::new(
            stream::iter([Ok(PutResult::default())]).boxed(),
        ))
    }
    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("DoExchange"))
    }
    async fn do_action(
        &self,
        _: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        Err(Status::unimplemented("DoAction"))
    }
    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Ok(Response::new(stream::empty().boxed()))
    }
}

/// The HTTP/2 knobs, applied to both ends.
#[derive(Clone, Copy)]
struct Http2 {
    stream_window: Option<u32>,
    conn_window: Option<u32>,
    adaptive: bool,
}

impl Http2 {
    fn server(&self) -> Server {
        Server::builder()
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.conn_window)
            .http2_adaptive_window(Some(self.adaptive))
    }

    async fn channel(&self, port: u16) -> AnyResult<Channel> {
        Ok(Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
            .initial_stream_window_size(self.stream_window)
            .initial_connection_window_size(self.conn_window)
            .http2_adaptive_window(self.adaptive)
            .connect()
            .await?)
    }
}

/// A running server: its port, and the sender that stops it.
struct Serving {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl Serving {
    async fn start(router: Router) -> AnyResult<Serving> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // TCP_NODELAY, as `DeviceFlightServer::serve` sets it.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            stopped.await.ok();
        }));
        Ok(Serving {
            port,
            stop: Some(stop),
            task: Some(task),
        })
    }

    async fn stop(mut self) -> AnyResult<()> {
        if let Some(stop) = self.stop.take() {
            stop.send(()).ok();
        }
        if let Some(task) = self.task.take() {
            task.await??;
        }
        Ok(())
    }
}

/// The tonic decoding limit for messages of `message_size` bytes of body.
fn decoding_limit(message_size: usize) -> usize {
    message_size.saturating_mul(2).max(64 * MIB)
}

fn host_service(server: HostServer) -> FlightServiceServer<HostServer> {
    let limit = decoding_limit(server.max_flight_data_size);
    FlightServiceServer::new(server)
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    HostGet,
    DeviceGetFromHost,
    DeviceGetFromDevice,
    HostPut,
    DevicePut,
    DevicePutKeep,
}

impl Mode {
    const ALL: [Mode; 6] = [
        Mode::HostGet,
        Mode::DeviceGetFromHost,
        Mode::DeviceGetFromDevice,
        Mode::HostPut,
        Mode::DevicePut,
        Mode::DevicePutKeep,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::HostGet => "arrow-flight DoGet host server -> host",
            Mode::DeviceGetFromHost => "cudabuf DoGet host server -> device",
            Mode::DeviceGetFromDevice => "cudabuf DoGet DeviceFlightServer -> device",
            Mode::HostPut => "arrow-flight DoPut host -> discarding server",
            Mode::DevicePut => "cudabuf DoPut device -> discarding server",
            Mode::DevicePutKeep => "cudabuf DoPut device -> DeviceFlightServer (kept)",
        }
    }

    /// The arrow-flight row this one is compared with.
    fn bound(self) -> Option<Mode> {
        match self {
            Mode::DeviceGetFromHost | Mode::DeviceGetFromDevice => Some(Mode::HostGet),
            Mode::DevicePut | Mode::DevicePutKeep => Some(Mode::HostPut),
            Mode::HostGet | Mode::HostPut => None,
        }
    }
}

/// Everything one pass (one message size) needs.
struct Setup {
    ctx: Context,
    schema: SchemaRef,
    host: Vec<RecordBatch>,
    device: Vec<DeviceRecordBatch>,
    host_port: u16,
    device_server: DeviceFlightServer,
    device_port: u16,
    message_size: usize,
    http2: Http2,
}

/// One stream's share of a run; returns the rows it moved.
async fn one_stream(setup: Arc<Setup>, mode: Mode, parts: usize, i: usize) -> AnyResult<usize> {
    let limit = decoding_limit(setup.message_size);
    let port = match mode {
        Mode::DeviceGetFromDevice | Mode::DevicePutKeep => setup.device_port,
        _ => setup.host_port,
    };
    let channel = setup.http2.channel(port).await?;
    let ticket = ticket(parts, i);
    match mode {
        Mode::HostGet => {
            let inner = FlightServiceClient::new(channel).max_decoding_message_size(limit);
            let mut client = FlightClient::new_from_inner(inner);
            let batches: Vec<RecordBatch> = client
                .do_get(Ticket::new(ticket))
                .await?
                .try_collect()
                .await?;
            Ok(batches.iter().map(|b| b.num_rows()).sum())
        }
        Mode::DeviceGetFromHost | Mode::DeviceGetFromDevice => {
            let mut client = FlightDeviceClient::new(channel, None).with_max_message_size(limit);
            let batches: Vec<DeviceRecordBatch> = client
                .do_get(ticket.into_bytes(), &setup.ctx)
                .await?
                .try_collect()
                .await?;
            Ok(batches.iter().map(|b| b.num_rows()).sum())
        }
        Mode::HostPut => {
            let mut client = FlightClient::new(channel);
            let batches = part(&setup.host, parts, i);
            let rows = batches.iter().map(|b| b.num_rows()).sum();
            let encoded = FlightDataEncoderBuilder::new()
                .with_schema(setup.schema.clone())
                .with_max_flight_data_size(setup.message_size)
                .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![ticket])))
                .build(stream::iter(batches.into_iter().map(Ok)));
            let _: Vec<PutResult> = client.do_put(encoded).await?.try_collect().await?;
            Ok(rows)
        }
        Mode::DevicePut | Mode::DevicePutKeep => {
            let mut client = FlightDeviceClient::new(channel, None)
                .with_max_flight_data_size(setup.message_size);
            let batches = part(&setup.device, parts, i);
            let rows = batches.iter().map(|b| b.num_rows()).sum();
            let descriptor = FlightDescriptor::new_path(vec![format!("put/{parts}/{i}")]);
            client
                .do_put(descriptor, setup.schema.clone(), batches)
                .await?;
            Ok(rows)
        }
    }
}

/// One run of `mode` with `parts` concurrent streams; its seconds.
async fn one_run(setup: &Arc<Setup>, mode: Mode, parts: usize, rows: usize) -> AnyResult<f64> {
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..parts)
        .map(|i| tokio::spawn(one_stream(setup.clone(), mode, parts, i)))
        .collect();
    let mut moved = 0;
    for task in tasks {
        moved += task.await??;
    }
    let secs = t0.elapsed().as_secs_f64();
    if moved != rows {
        return Err(format!("{}: {moved} rows moved, {rows} expected", mode.label()).into());
    }
    if mode == Mode::DevicePutKeep {
        // What was kept is freed before the next run.
        for i in 0..parts {
            setup
                .device_server
                .remove(format!("put/{parts}/{i}").as_bytes());
        }
    }
    Ok(secs)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn serve_only(o: &Options, port: u16) -> AnyResult<()> {
    let batches = make_batches(o.total / (o.rows * COLUMNS * 8), o.rows)?;
    let server = HostServer {
        schema: batches[0].schema(),
        batches: Arc::new(batches),
        max_flight_data_size: o.message_sizes[0],
    };
    let http2 = Http2 {
        stream_window: o.stream_window,
        conn_window: o.conn_window,
        adaptive: o.adaptive,
    };
    Runtime::new()?.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        println!("PORT {}", listener.local_addr()?.port());
        std::io::stdout().flush()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
            }
            stop.send(()).ok();
        });
        http2
            .server()
            .add_service(host_service(server))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    stopped.await.ok();
                },
            )
            .await?;
        Ok(())
    })
}

fn run() -> AnyResult<()> {
    let o = parse_options()?;
    if let Some(port) = o.serve_only {
        return serve_only(&o, port);
    }
    let backend = cudabuf::backend_from_env()?;
    let ctx = backend.context(0)?;
    if let Some(limit) = o.pool_limit {
        ctx.set_staging_pool_limit(limit);
    }
    let count = o.total / (o.rows * COLUMNS * 8);
    let host = make_batches(count, o.rows)?;
    let schema = host[0].schema();
    let rows = count * o.rows;
    let bytes = (rows * COLUMNS * 8) as f64;
    let device = host
        .iter()
        .map(|b| DeviceRecordBatch::from_host(b, &ctx))
        .collect::<Result<Vec<_>, _>>()?;
    let http2 = Http2 {
        stream_window: o.stream_window,
        conn_window: o.conn_window,
        adaptive: o.adaptive,
    };
    println!(
        "# flight: backend {}, {count} batches of {} rows x {COLUMNS} int64 ({:.1} MiB in all), \
         streams {:?}, {} reps, stream window {:?}, connection window {:?}, adaptive {}, \
         staging pool limit {} MiB",
        backend.kind(),
        o.rows,
        bytes / MIB as f64,
        o.streams,
        o.reps,
        o.stream_window,
        o.conn_window,
        o.adaptive,
        ctx.staging_pool_limit() >> 20
    );
    let runtime = Runtime::new()?;
    let mut results = Vec::new();
    for &message_size in &o.message_sizes {
        let setup = runtime.block_on(async {
            let host_server =
                Serving::start(http2.server().add_service(host_service(HostServer {
                    schema: schema.clone(),
                    batches: Arc::new(host.clone()),
                    max_flight_data_size: message_size,
                })))
                .await?;
            let device_server =
                DeviceFlightServer::with_max_message_size(&ctx, decoding_limit(message_size))
                    .with_max_flight_data_size(message_size);
            for &parts in &o.streams {
                for i in 0..parts {
                    device_server.insert(
                        ticket(parts, i),
                        schema.clone(),
                        part(&device, parts, i),
                    )?;
                }
            }
            let device_serving =
                Serving::start(http2.server().add_service(device_server.service(None))).await?;
            AnyResult::Ok((host_server, device_server, device_serving))
        })?;
        let (host_serving, device_server, device_serving) = setup;
        let setup = Arc::new(Setup {
            ctx: ctx.clone(),
            schema: schema.clone(),
            host: host.clone(),
            device: device.clone(),
            host_port: host_serving.port,
            device_server: device_server.clone(),
            device_port: device_serving.port,
            message_size,
            http2,
        });
        println!();
        println!("## message size {} MiB", message_size as f64 / MIB as f64);
        println!("| streams | path | median s | GB/s | ratio to arrow-flight host |");
        println!("|---|---|---|---|---|");
        for &parts in &o.streams {
            let mut rates = Vec::new();
            for mode in Mode::ALL {
                // One warm-up run, then the timed ones.
                runtime.block_on(one_run(&setup, mode, parts, rows))?;
                let mut times = Vec::with_capacity(o.reps);
                for _ in 0..o.reps {
                    times.push(runtime.block_on(one_run(&setup, mode, parts, rows))?);
                }
                let secs = median(times);
                let gbps = bytes / secs / 1e9;
                let ratio = mode
                    .bound()
                    .and_then(|b| rates.iter().find(|(m, _)| *m == b))
                    .map(|(_, r): &(Mode, f64)| gbps / r);
                rates.push((mode, gbps));
                println!(
                    "| {parts} | {} | {secs:.4} | {gbps:.3} | {} |",
                    mode.label(),
                    ratio.map_or("-".to_owned(), |r| format!("{r:.2}"))
                );
                results.push(json!({
                    "message_size": message_size,
                    "streams": parts,
                    "path": mode.label(),
                    "mode": format!("{mode:?}"),
                    "bytes": bytes,
                    "median_s": secs,
                    "gbps": gbps,
                    "ratio_to_host": ratio,
                }));
            }
        }
        runtime.block_on(async {
            host_serving.stop().await?;
            device_serving.stop().await?;
            AnyResult::Ok(())
        })?;
        for key in device_server.keys() {
            device_server.remove(&key);
        }
    }
    // Let the runtime's blocking threads finish their downloads before the context goes.
    runtime.shutdown_timeout(Duration::from_secs(10));
    if let Some(path) = &o.json {
        let doc = json!({
            "bench": "flight",
            "backend": backend.kind().name(),
            "batches": count,
            "rows_per_batch": o.rows,
            "columns": COLUMNS,
            "bytes": bytes,
            "reps": o.reps,
            "stream_window": o.stream_window,
            "conn_window": o.conn_window,
            "adaptive_window": o.adaptive,
            "staging_pool_limit": ctx.staging_pool_limit(),
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
        println!("\nwrote {}", path.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flight bench: {e}");
            ExitCode::FAILURE
        }
    }
}
