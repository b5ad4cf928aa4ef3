//! A pass-through proxy in its own process, the gateway bench's measure of the two-hop limit: it
//! takes a client's request and sends the upstream a body staged beforehand (the one the gateway
//! sent), so it moves the bytes a Stateful gateway moves, with the gateway's HTTP stack (axum server
//! with `TCP_NODELAY`, reqwest client, two runtime workers) and none of its work, and streams the
//! answer back.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

/// The bench binary runs as the proxy when its first argument is this, followed by the upstream.
pub const ARG: &str = "--pass-through-proxy";

/// The running proxy process; killed on drop (and it exits by itself when the bench's end of its
/// stdin closes, so it never outlives the bench).
pub struct PassThrough {
    child: Child,
    /// Where it listens.
    pub address: SocketAddr,
}

impl PassThrough {
    /// Starts this binary as a proxy in front of `upstream` and waits for its address.
    pub fn spawn(upstream: SocketAddr) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([ARG, &upstream.to_string()])
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

struct Forward {
    client: reqwest::Client,
    url: String,
    staged: std::sync::Mutex<Bytes>,
}

/// Serves as the proxy in front of `upstream` until the parent goes away; prints its address first.
pub fn serve(upstream: &str) {
    std::thread::spawn(|| {
        // The parent holds our stdin: its end of file means the bench is gone.
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(strata::gateway::LISTEN_BACKLOG).unwrap();
        let forward = std::sync::Arc::new(Forward {
            client: reqwest::Client::new(),
            url: format!("http://{upstream}/v1/chat/completions"),
            staged: std::sync::Mutex::new(Bytes::new()),
        });
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{}", listener.local_addr().unwrap()).unwrap();
        stdout.flush().unwrap();
        let router = Router::new()
            .route("/v1/chat/completions", post(forward_staged))
            .route("/stage", post(stage))
            .with_state(forward);
        let listener = axum::serve::ListenerExt::tap_io(listener, |stream| {
            let _ = stream.set_nodelay(true);
        });
        axum::serve(listener, router).await.unwrap();
    });
}

/// Keeps `body` as what the next requests send upstream.
async fn stage(State(forward): State<std::sync::Arc<Forward>>, body: Bytes) -> StatusCode {
    *forward.staged.lock().unwrap() = body;
    StatusCode::NO_CONTENT
}

/// Reads the client's request and sends the staged body upstream; streams the answer back.
async fn forward_staged(State(forward): State<std::sync::Arc<Forward>>, _request: Bytes) -> Response {
    let body = forward.staged.lock().unwrap().clone();
    let sent = forward
        .client
        .post(&forward.url)
        .header(header::CONTENT_TYPE, "application/json")
        .header("x-bench-direct", "1")
        .body(body)
        .send()
        .await;
    match sent {
        Ok(answer) => {
            let mut response = Response::builder().status(answer.status().as_u16());
            if let Some(kind) = answer.headers().get(header::CONTENT_TYPE) {
                response = response.header(header::CONTENT_TYPE, kind);
            }
            response.body(Body::from_stream(answer.bytes_stream())).unwrap()
        }
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    }
}
