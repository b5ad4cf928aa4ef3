//! The gateway bench's reference proxies, each in its own process. Both take a client's request and
//! send the upstream a body staged beforehand (the one the gateway sent), so they move the bytes a
//! Stateful gateway moves with none of its work, and pass the answer back as it arrives. Both send
//! as the gateway sends to a plain-`http` upstream (`gateway/plain_http.rs`): hyper's HTTP/1
//! connection, kept open and used again once the answer was read, `TCP_NODELAY`, no task spawned
//! per request. Both run on one single-threaded runtime, as each of the gateway's serving threads
//! does (a connection stays on its serving thread):
//! - the two-hop limit ([`ARG`]): behind the gateway's server, axum with `TCP_NODELAY`;
//! - the floor ([`FLOOR_ARG`]): behind hyper's own HTTP/1 server, the library under axum.
//!
//! Until the gateway's upstream client moved from reqwest to hyper-util, the limit sent with
//! reqwest, as the gateway then did (BENCHMARKS.md, "The floor"); until the gateway kept its own
//! plain-`http` connections, both sent with hyper-util's pooled client. Until the gateway's serving
//! threads, both ran a runtime of two workers, as the gateway then did.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;

/// The bench binary runs as the two-hop limit's proxy when its first argument is this, followed by
/// the upstream.
pub const ARG: &str = "--pass-through-proxy";

/// The bench binary runs as the floor's proxy when its first argument is this, followed by the
/// upstream.
pub const FLOOR_ARG: &str = "--floor-proxy";

/// The running proxy process; killed on drop (and it exits by itself when the bench's end of its
/// stdin closes, so it never outlives the bench).
pub struct PassThrough {
    child: Child,
    /// Where it listens.
    pub address: SocketAddr,
}

impl PassThrough {
    /// Starts this binary as a proxy (`kind`: [`ARG`] or [`FLOOR_ARG`]) in front of `upstream`
    /// and waits for its address.
    pub fn spawn(kind: &str, upstream: SocketAddr) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([kind, &upstream.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let address = line.trim().parse().unwrap_or_else(|_| panic!("the proxy said {line:?}"));
        Self { child, address }
    }
}

impl Drop for PassThrough {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A proxy's state: where it sends, its connection there, and the body to send.
struct Relay {
    upstream: String,
    /// The kept HTTP/1 connection; the reference paths are timed one request at a time.
    connection: tokio::sync::Mutex<Option<SendRequest<Full<Bytes>>>>,
    staged: std::sync::Mutex<Bytes>,
}

impl Relay {
    /// A relay to the fake `upstream`.
    fn to(upstream: &str) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            upstream: upstream.to_owned(),
            connection: tokio::sync::Mutex::default(),
            staged: std::sync::Mutex::new(Bytes::new()),
        })
    }

    /// Sends the staged body upstream; the answer's head, its body still to come. The connection
    /// takes the next request once this answer was read to its end.
    async fn send_staged(&self) -> Result<hyper::Response<Incoming>, String> {
        let staged = self.staged.lock().unwrap().clone();
        let upstream = Request::post(Uri::from_static("/v1/chat/completions"))
            .header(header::HOST, self.upstream.as_str())
            .header(header::CONTENT_TYPE, "application/json")
            .header("x-bench-direct", "1")
            .body(Full::new(staged))
            .unwrap();
        let mut connection = self.connection.lock().await;
        if connection.as_ref().is_none_or(SendRequest::is_closed) {
            let stream =
                tokio::net::TcpStream::connect(&self.upstream).await.map_err(|error| error.to_string())?;
            stream.set_nodelay(true).map_err(|error| error.to_string())?;
            let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|error| error.to_string())?;
            tokio::spawn(driver);
            *connection = Some(sender);
        }
        let sender = connection.as_mut().unwrap();
        sender.ready().await.map_err(|error| error.to_string())?;
        sender.send_request(upstream).await.map_err(|error| error.to_string())
    }
}

/// Exits this process once the parent goes away (the parent holds our stdin: its end of file
/// means the bench is gone).
fn exit_with_parent() {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
}

/// A runtime like the one a gateway's connection is served on: a single-threaded runtime (the
/// gateway's serving threads each run one, and a connection stays on its thread). The reference
/// paths are timed in the sequential phases only, one connection each.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// A loopback listener with the gateway's backlog; its address is printed for the parent.
fn listen() -> tokio::net::TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(strata::gateway::LISTEN_BACKLOG).unwrap();
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{}", listener.local_addr().unwrap()).unwrap();
    stdout.flush().unwrap();
    listener
}

/// Serves as the two-hop limit's proxy in front of `upstream` until the parent goes away.
pub fn serve(upstream: &str) {
    exit_with_parent();
    runtime().block_on(async move {
        let listener = listen();
        let router = Router::new()
            .route("/v1/chat/completions", post(forward_staged))
            .route("/stage", post(stage))
            .with_state(Relay::to(upstream));
        let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
            let _ = stream.set_nodelay(true);
        });
        axum::serve(listener, router).await.unwrap();
    });
}

/// Keeps `body` as what the next requests send upstream.
async fn stage(State(relay): State<std::sync::Arc<Relay>>, body: Bytes) -> StatusCode {
    *relay.staged.lock().unwrap() = body;
    StatusCode::NO_CONTENT
}

/// Reads the client's request and sends the staged body upstream; passes the answer back.
async fn forward_staged(State(relay): State<std::sync::Arc<Relay>>, _request: Bytes) -> Response {
    match relay.send_staged().await {
        Ok(answer) => answer.map(Body::new),
        Err(error) => (StatusCode::BAD_GATEWAY, error).into_response(),
    }
}

/// Serves as the floor's proxy in front of `upstream` until the parent goes away.
pub fn serve_floor(upstream: &str) {
    exit_with_parent();
    runtime().block_on(async move {
        let listener = listen();
        let relay = Relay::to(upstream);
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let relay = std::sync::Arc::clone(&relay);
            tokio::spawn(async move {
                let service = service_fn(move |request| floor_answer(std::sync::Arc::clone(&relay), request));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
}

/// `/stage` keeps the body as what the next requests send; any other request sends the staged body
/// upstream and answers with the upstream's answer, its body passed through as it arrives.
async fn floor_answer(
    relay: std::sync::Arc<Relay>,
    request: Request<Incoming>,
) -> Result<Response<Either<Incoming, Full<Bytes>>>, hyper::Error> {
    let staging = request.uri().path() == "/stage";
    let body = request.into_body().collect().await?.to_bytes();
    if staging {
        *relay.staged.lock().unwrap() = body;
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Either::Right(Full::default()))
            .unwrap());
    }
    Ok(match relay.send_staged().await {
        Ok(answer) => answer.map(Either::Left),
        Err(error) => Response::builder()
            .status(StatusCode::BAD_GATEWAY)
            .body(Either::Right(Full::new(Bytes::from(error))))
            .unwrap(),
    })
}
