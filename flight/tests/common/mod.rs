//! What cudabuf-flight's tests share: simulators and their reports, a
//! server on loopback, batches, and a TCP proxy that cuts or stalls a connection.

// Each test file uses a part of this module.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightData, FlightDescriptor};
use cudabuf_arrow::arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use cudabuf_arrow::DeviceRecordBatch;
use cudabuf_core::{Backend, Context};
use cudabuf_flight::DeviceFlightServer;
use cudabuf_sim::SimBackend;
use futures::{stream, TryStreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

/// The longest any one step of a test may take before the test fails.
pub const LIMIT: Duration = Duration::from_secs(60);

/// `future`, failing the test if it takes longer than [`LIMIT`].
pub async fn bounded<T>(future: impl Future<Output = T>) -> T {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("the call did not finish in time")
}

/// Poll `done` every few milliseconds until it holds; panics with `what` after `within`.
pub async fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn new_sim() -> (SimBackend, Context) {
    let sim = SimBackend::new();
    let ctx = Backend::new(sim.clone()).context(0).expect("a context");
    (sim, ctx)
}

/// A simulator's leak and race reports are empty once `ctx` and the backend are dropped.
pub fn assert_clean(sim: SimBackend, ctx: Context) {
    let probe = sim.leak_probe();
    let races = sim.race_report();
    assert!(races.is_empty(), "{races}");
    drop((ctx, sim));
    let leaks = probe.leak_report();
    assert!(leaks.is_empty(), "{leaks}");
}

/// A batch of `rows` rows whose values follow from `seed`: an int64, a float64 with
/// nulls, a string with nulls.
pub fn numbers(seed: i64, rows: i64) -> RecordBatch {
    let ids: Vec<i64> = (0..rows)
        .map(|i| seed.wrapping_mul(1_000_003) ^ i)
        .collect();
    RecordBatch::try_from_iter_with_nullable([
        (
            "id",
            Arc::new(Int64Array::from(ids.clone())) as ArrayRef,
            false,
        ),
        (
            "half",
            Arc::new(Float64Array::from_iter(
                ids.iter().map(|&i| (i % 3 != 0).then_some(i as f64 / 2.0)),
            )) as _,
            true,
        ),
        (
            "name",
            Arc::new(StringArray::from_iter(
                ids.iter().map(|&i| (i % 5 != 0).then(|| format!("n{i}"))),
            )) as _,
            true,
        ),
    ])
    .expect("a valid batch")
}

pub fn upload(batches: &[RecordBatch], ctx: &Context) -> Vec<DeviceRecordBatch> {
    batches
        .iter()
        .map(|b| DeviceRecordBatch::from_host(b, ctx).expect("uploads"))
        .collect()
}

/// Device batches back on the host.
pub fn to_host(batches: &[DeviceRecordBatch]) -> Vec<RecordBatch> {
    batches
        .iter()
        .map(|b| b.to_host().expect("downloads"))
        .collect()
}

/// The `FlightData` of a `DoPut` of `batches` under the path `key`.
pub async fn put_messages(key: &str, batches: &[RecordBatch]) -> Vec<FlightData> {
    // The encoder's stream is 'static: it takes the batches by value.
    let owned = batches.to_vec();
    FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_path(vec![key.into()])))
        .build(stream::iter(owned.into_iter().map(Ok)))
        .try_collect()
        .await
        .expect("encodes")
}

/// A server task on 127.0.0.1, stopped by [`stop`](Self::stop).
pub struct Serving {
    pub url: String,
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<cudabuf_flight::Result<()>>>,
}

impl Serving {
    pub async fn start(server: DeviceFlightServer, token: Option<&'static str>) -> Self {
        Self::start_with(move |listener, stopped| async move {
            server
                .serve(listener, token, async {
                    stopped.await.ok();
                })
                .await
        })
        .await
    }

    /// Serve with `serve(listener, stopped)`, a future that ends once `stopped` resolves.
    pub async fn start_with<F, Fut>(serve: F) -> Self
    where
        F: FnOnce(TcpListener, oneshot::Receiver<()>) -> Fut,
        Fut: Future<Output = cudabuf_flight::Result<()>> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, stopped));
        Serving {
            url: format!("http://{addr}"),
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        self.stop.take().unwrap().send(()).ok();
        bounded(self.task.take().unwrap())
            .await
            .unwrap()
            .expect("the server stopped cleanly");
    }
}

// ---- A server that says when it has settled ------------------------------------------

/// Counts of a server's open connections and of the calls its service is running.
#[derive(Debug, Clone, Default)]
pub struct Activity {
    connections: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl Activity {
    /// No connection open and no call running: nothing the server received can still
    /// change its state (a call starts while its connection is open).
    pub fn settled(&self) -> bool {
        self.connections.load(Ordering::SeqCst) == 0 && self.calls.load(Ordering::SeqCst) == 0
    }
}

/// One more of `count` while alive.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Live(count.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A service counted in [`Activity::calls`] from its call to the end (or drop) of its
/// response future: for a `DoPut`, the whole handler.
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    calls: Arc<AtomicUsize>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Counted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Counted<S>
where
    S: tonic::codegen::Service<tonic::codegen::http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: tonic::codegen::http::Request<B>) -> Self::Future {
        let live = Live::new(&self.calls);
        let response = self.inner.call(request);
        Box::pin(async move {
            let _live = live;
            response.await
        })
    }
}

/// A connection counted in [`Activity::connections`] until the server drops it.
struct Tracked {
    io: TcpStream,
    _live: Live,
}

impl tonic::transport::server::Connected for Tracked {
    type ConnectInfo = ();
    fn connect_info(&self) {}
}

impl tokio::io::AsyncRead for Tracked {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Tracked {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Serving {
    /// [`start`](Self::start) with the server's [`Activity`] counted, and its limits.
    pub async fn start_counted(server: DeviceFlightServer) -> (Self, Activity) {
        let activity = Activity::default();
        let counts = activity.clone();
        let serving = Self::start_with(move |listener, stopped| async move {
            let connections = counts.connections.clone();
            let incoming = stream::unfold(listener, move |listener| {
                let connections = connections.clone();
                async move {
                    let accepted = listener.accept().await.map(|(io, _)| Tracked {
                        io,
                        _live: Live::new(&connections),
                    });
                    Some((accepted, listener))
                }
            });
            let service = Counted {
                inner: server.service(None),
                calls: counts.calls.clone(),
            };
            server
                .limits()
                .apply(tonic::transport::Server::builder())
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async {
                    stopped.await.ok();
                })
                .await?;
            Ok(())
        })
        .await;
        (serving, activity)
    }
}

// ---- A TCP proxy that misbehaves ------------------------------------------------------

/// A direction through the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

/// What the proxy does to each connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything.
    Pass,
    /// Forward `n` bytes in `dir`, then close both sockets.
    Cut(Dir, usize),
    /// Forward `n` bytes in `dir`, then forward nothing more either way and read nothing
    /// more, keeping both sockets open (a peer, or a network, gone silent).
    Stall(Dir, usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Cut,
    Stalled,
}

/// A TCP proxy on 127.0.0.1 in front of `target`, applying one [`Fault`] to every
/// connection; dropping it closes every connection.
pub struct Proxy {
    pub url: String,
    up: Arc<AtomicUsize>,
    down: Arc<AtomicUsize>,
    faults: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr, fault: Fault) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let up = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(AtomicUsize::new(0));
        let faults = Arc::new(AtomicUsize::new(0));
        let counters = (up.clone(), down.clone(), faults.clone());
        let task = tokio::spawn(async move {
            // Aborting this task drops the set, which aborts every connection's task.
            let mut connections = JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                connections.spawn(relay(client, target, fault, counters.clone()));
            }
        });
        Proxy {
            url,
            up,
            down,
            faults,
            task,
        }
    }

    /// Bytes forwarded so far, client to server and server to client, over every
    /// connection (each counted as it is read, before it is written on).
    pub fn forwarded(&self) -> (usize, usize) {
        (
            self.up.load(Ordering::SeqCst),
            self.down.load(Ordering::SeqCst),
        )
    }

    /// How many connections the fault struck (cut or stalled).
    pub fn struck(&self) -> usize {
        self.faults.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Counters = (Arc<AtomicUsize>, Arc<AtomicUsize>, Arc<AtomicUsize>);

async fn relay(client: TcpStream, target: SocketAddr, fault: Fault, counters: Counters) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    client.set_nodelay(true).ok();
    server.set_nodelay(true).ok();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (state, _) = watch::channel(State::Running);
    let (up, down, faults) = counters;
    tokio::join!(
        pump(
            client_read,
            server_write,
            Dir::Up,
            fault,
            &up,
            &faults,
            &state
        ),
        pump(
            server_read,
            client_write,
            Dir::Down,
            fault,
            &down,
            &faults,
            &state
        ),
    );
}

/// Copy `from` to `to` until end of file, or until the fault strikes (in this direction,
/// or in the other one through `state`).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    dir: Dir,
    fault: Fault,
    count: &AtomicUsize,
    faults: &AtomicUsize,
    state: &watch::Sender<State>,
) {
    let (limit, strike) = match fault {
        Fault::Cut(d, n) if d == dir => (Some(n), State::Cut),
        Fault::Stall(d, n) if d == dir => (Some(n), State::Stalled),
        _ => (None, State::Running),
    };
    let mut changes = state.subscribe();
    let mut sent = 0usize;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if *changes.borrow_and_update() != State::Running {
            break;
        }
        if limit == Some(sent) {
            faults.fetch_add(1, Ordering::SeqCst);
            state.send_replace(strike);
            break;
        }
        let read = tokio::select! {
            read = from.read(&mut buf) => read,
            _ = changes.changed() => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => {
                to.shutdown().await.ok();
                return;
            }
            Ok(n) => limit.map_or(n, |limit| n.min(limit - sent)),
        };
        // Counted before it is written: a byte the peer has seen is never still uncounted.
        count.fetch_add(n, Ordering::SeqCst);
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        sent += n;
    }
    if *state.borrow() == State::Stalled {
        // Hold both sockets open, reading and writing nothing, until the proxy is dropped.
        let _held = (from, to);
        std::future::pending::<()>().await;
    }
    // Cut: dropping both halves closes the socket.
}
