//! The gateway's HTTP/1 server loop: hyper serves each connection with half-closed reads allowed,
//! and a chat request watches for the client's hang-up itself.
//!
//! By default hyper's server reads from a connection while a request's handler runs, to notice a
//! client that leaves. That read needs room in the connection's read buffer. After a large body,
//! the body's last part is still in the handler's hands at that moment, so the buffer is shared and
//! hyper allocates a new one of the size it grew to (about 400 KB after a 1.4 MB body). The next
//! request is then read into freshly faulted pages: about 100 page faults a request for a client
//! that resends a 200k-token history (BENCHMARKS.md, "A resent history read into a buffer already
//! there"). With half-closed reads allowed hyper does not read then. A chat handler instead races
//! its work against [`ClientConnection::hung_up`], a second handle to the same socket that only
//! waits, so a client that leaves still cancels its upstream call, as before.

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_util::task::TaskTracker;

use super::routes::Switch;

/// A second handle to a client's connection, to see the client leave while its request is served.
///
/// It is a duplicate of the connection's descriptor, registered with the serving thread's runtime
/// on its own; it only peeks, so it never takes bytes from hyper.
#[derive(Clone, Debug)]
pub struct ClientConnection(Arc<TcpStream>);

impl ClientConnection {
    /// A watch on `stream`; `None` (with the reason logged) when the descriptor cannot be duplicated.
    fn of(stream: &TcpStream, peer: SocketAddr) -> Option<Self> {
        let duplicated =
            stream.as_fd().try_clone_to_owned().map(std::net::TcpStream::from).and_then(|duplicate| {
                duplicate.set_nonblocking(true)?;
                TcpStream::from_std(duplicate)
            });
        match duplicated {
            Ok(duplicate) => Some(Self(Arc::new(duplicate))),
            Err(error) => {
                tracing::debug!(%error, %peer, "a client's hang-up cannot be watched on this connection");
                None
            }
        }
    }

    /// Returns once the client has closed its side of the connection or reset it. Never returns
    /// when the client sends more first (a pipelined request): hyper reads that in its turn.
    pub async fn hung_up(&self) {
        let mut byte = [0u8; 1];
        match self.0.peek(&mut byte).await {
            Ok(0) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                ) => {}
            Ok(_) | Err(_) => std::future::pending().await,
        }
    }
}

/// Serves `routes` on `listener` on the caller's runtime until `stop`, then until the connections
/// it accepted are closed (each finishes the request it is serving).
pub async fn serve_until<L>(mut listener: L, routes: Switch, mut stop: watch::Receiver<bool>)
where
    L: axum::serve::Listener<Io = TcpStream, Addr = SocketAddr>,
{
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        let client = ClientConnection::of(&stream, peer);
        let routes = routes.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            routes.serve(request.map(axum::body::Body::new), client.as_ref())
        });
        let mut stop = stop.clone();
        connections.spawn(async move {
            let connection =
                http1::Builder::new().half_close(true).serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let ended_first = tokio::select! {
                ended = connection.as_mut() => Some(ended),
                _ = stop.wait_for(|stopped| *stopped) => None,
            };
            // On the stop, the request under way is finished and the connection then closed.
            let ended = match ended_first {
                Some(ended) => ended,
                None => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                tracing::trace!(%error, %peer, "connection ended with an error");
            }
        });
    }
    connections.close();
    connections.wait().await;
}
