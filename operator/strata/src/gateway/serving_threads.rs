//! The API served by several threads, each running a single-threaded runtime of its own: a
//! connection is served on the thread it was handed to, so one request never wakes another serving
//! thread.
//!
//! On one runtime with several workers, every request woke an idle worker: hyper's server wakes its
//! own connection task while the handler reads the body, and tokio hands a task woken while it runs
//! to another worker. The request then often finished on the other core, its caches cold
//! (BENCHMARKS.md, "Where the 1k wake-ups come from" and "Serving threads"). Here the thread that
//! started the gateway accepts every connection and hands the connections to the serving threads in
//! turn, itself included, so that many concurrent streams are spread evenly: with every thread
//! accepting from the shared socket, one thread took most of them.

use std::cell::Cell;
use std::net::SocketAddr;

use super::routes::Switch;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

thread_local! {
    /// This thread's place among the serving threads (0 on any thread not started by [`start`]).
    static SERVING_THREAD: Cell<usize> = const { Cell::new(0) };
}

/// Which serving thread runs the caller: 0 for the thread that started the gateway (and any thread
/// [`start`] did not start), 1 and up for the others. Kept upstream connections are looked up by it
/// (`plain_http.rs`), so a request sends on a connection whose task runs on its own thread.
pub fn current() -> usize {
    SERVING_THREAD.with(Cell::get)
}

/// An accepted connection on its way to a serving thread, and its peer.
type Handed = (std::net::TcpStream, SocketAddr);

/// The connections handed to one serving thread, as the server loop (`http_serve`) takes them.
struct HandedConnections {
    connections: mpsc::UnboundedReceiver<Handed>,
    local: SocketAddr,
}

impl axum::serve::Listener for HandedConnections {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            // The acceptor is gone only once the gateway stops, and the server stops accepting then.
            let Some((connection, peer)) = self.connections.recv().await else {
                return std::future::pending().await;
            };
            match TcpStream::from_std(connection) {
                Ok(connection) => return (connection, peer),
                Err(error) => {
                    tracing::warn!(%error, %peer, "a serving thread cannot watch a handed connection")
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The serving threads beyond the caller's.
#[derive(Debug)]
pub struct ServingThreads {
    /// Each thread says when it has stopped serving (the connections it was handed are closed).
    served: Vec<oneshot::Receiver<()>>,
    /// Lets the threads end their runtimes, once the work their requests started beside
    /// themselves is done.
    release: watch::Sender<bool>,
    /// Each thread's end (the sender is dropped when the thread returns).
    ended: Vec<oneshot::Receiver<()>>,
}

impl ServingThreads {
    /// Waits until every thread has stopped serving: the stop signal came and the connections it
    /// was handed are finished. Their runtimes keep running the work started beside requests until
    /// [`ServingThreads::end`].
    pub async fn stopped_serving(&mut self) {
        for served in &mut self.served {
            let _ = served.await;
        }
    }

    /// Ends the threads' runtimes and waits for the threads.
    pub async fn end(self) {
        let _ = self.release.send(true);
        for ended in self.ended {
            let _ = ended.await;
        }
    }
}

/// Why a serving thread could not start.
#[derive(Debug, thiserror::Error)]
#[error("serving thread {index}: {cause}")]
pub struct SpawnError {
    /// Its place among the serving threads.
    pub index: usize,
    /// The runtime's or the thread's error.
    pub cause: std::io::Error,
}

/// Serves `routes` on `listener` with `count` serving threads until `stop`: the caller's runtime
/// accepts and serves its share (the returned tasks), and `count - 1` threads, each with a
/// single-threaded runtime of at most `max_blocking` blocking threads, serve theirs.
pub fn start(
    listener: TcpListener,
    routes: &Switch,
    stop: &watch::Receiver<bool>,
    count: usize,
    max_blocking: usize,
) -> Result<(Vec<JoinHandle<()>>, ServingThreads), SpawnError> {
    let (release, released) = watch::channel(false);
    let mut threads = ServingThreads { served: Vec::new(), release, ended: Vec::new() };
    let local = listener.local_addr().map_err(|cause| SpawnError { index: 0, cause })?;
    let (first, first_share) = mpsc::unbounded_channel();
    let mut shares = vec![first];
    for index in 1..count.max(1) {
        let failed = |cause| SpawnError { index, cause };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(max_blocking)
            .build()
            .map_err(failed)?;
        let (share, connections) = mpsc::unbounded_channel();
        let (served_sender, served) = oneshot::channel();
        let (ended_sender, ended) = oneshot::channel::<()>();
        let (routes, stop, mut released) = (routes.clone(), stop.clone(), released.clone());
        std::thread::Builder::new()
            .name(format!("strata-serve-{index}"))
            .spawn(move || {
                let _ended = ended_sender;
                SERVING_THREAD.with(|place| place.set(index));
                runtime.block_on(async move {
                    super::http_serve::serve_until(HandedConnections { connections, local }, routes, stop)
                        .await;
                    let _ = served_sender.send(());
                    let _ = released.wait_for(|released| *released).await;
                });
            })
            .map_err(failed)?;
        shares.push(share);
        threads.served.push(served);
        threads.ended.push(ended);
    }
    let own = HandedConnections { connections: first_share, local };
    let tasks = vec![
        tokio::spawn(hand_out(listener, shares, stop.clone())),
        tokio::spawn(super::http_serve::serve_until(own, routes.clone(), stop.clone())),
    ];
    Ok((tasks, threads))
}

/// Accepts connections on `listener` until `stop` and hands them to `shares` in turn.
async fn hand_out(
    mut listener: TcpListener,
    shares: Vec<mpsc::UnboundedSender<Handed>>,
    mut stop: watch::Receiver<bool>,
) {
    let stopped = stop.wait_for(|stopped| *stopped);
    tokio::pin!(stopped);
    let mut next = 0;
    loop {
        let (connection, peer) = tokio::select! {
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
            _ = &mut stopped => return,
        };
        super::send_without_delay(&connection);
        let mut handed = match connection.into_std() {
            Ok(connection) => (connection, peer),
            Err(error) => {
                tracing::warn!(%error, %peer, "cannot hand an accepted connection to a serving thread");
                continue;
            }
        };
        // A thread takes connections until the gateway stops; should one have ended early, its
        // share goes to the others.
        for attempt in 0..shares.len() {
            let thread = (next + attempt) % shares.len();
            match shares[thread].send(handed) {
                Ok(()) => break,
                Err(returned) => {
                    tracing::error!(thread, "a serving thread has ended; the others take its connections");
                    handed = returned.0;
                }
            }
        }
        next = (next + 1) % shares.len();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use axum::Router;
    use axum::routing::get;

    use crate::gateway::routes::Routes;

    use super::*;

    /// A `GET /` on a connection of its own, from a plain thread; the answer's body.
    fn get_root(address: SocketAddr) -> String {
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream.write_all(b"GET / HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer.rsplit("\r\n\r\n").next().unwrap().to_owned()
    }

    /// The gateway's first serving thread: a single-threaded runtime.
    fn first_thread() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn connections_are_served_by_the_threads_in_turn_each_on_its_own_thread() {
        first_thread().block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let router = Router::new()
                .route("/", get(|| async { format!("{} {:?}", current(), std::thread::current().name()) }));
            let (stop_sender, stop) = watch::channel(false);
            let (tasks, mut threads) =
                start(listener, &Switch::new(Routes::only(router)), &stop, 3, 2).unwrap();
            let mut answers = Vec::new();
            for _ in 0..6 {
                answers.push(tokio::task::spawn_blocking(move || get_root(address)).await.unwrap());
            }
            let first = format!("0 {:?}", std::thread::current().name());
            let (second, third) = ("1 Some(\"strata-serve-1\")", "2 Some(\"strata-serve-2\")");
            assert_eq!(answers, [first.as_str(), second, third, first.as_str(), second, third]);
            stop_sender.send(true).unwrap();
            for task in tasks {
                task.await.unwrap();
            }
            threads.stopped_serving().await;
            threads.end().await;
        });
    }

    #[test]
    fn a_serving_thread_runs_the_work_its_requests_started_until_it_is_ended() {
        first_thread().block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let (go_sender, go) = oneshot::channel::<()>();
            let go = Arc::new(Mutex::new(Some(go)));
            let finished = Arc::new(AtomicBool::new(false));
            let finishing = Arc::clone(&finished);
            // On the second thread, work started beside the request that outlives it.
            let router = Router::new().route(
                "/",
                get(move || {
                    if current() == 1
                        && let Some(go) = go.lock().unwrap().take()
                    {
                        let finishing = Arc::clone(&finishing);
                        tokio::spawn(async move {
                            let _ = go.await;
                            finishing.store(true, Ordering::SeqCst);
                        });
                    }
                    async { current().to_string() }
                }),
            );
            let (stop_sender, stop) = watch::channel(false);
            let (tasks, mut threads) =
                start(listener, &Switch::new(Routes::only(router)), &stop, 2, 2).unwrap();
            assert_eq!(tokio::task::spawn_blocking(move || get_root(address)).await.unwrap(), "0");
            assert_eq!(tokio::task::spawn_blocking(move || get_root(address)).await.unwrap(), "1");
            stop_sender.send(true).unwrap();
            for task in tasks {
                task.await.unwrap();
            }
            threads.stopped_serving().await;
            assert!(!finished.load(Ordering::SeqCst));
            go_sender.send(()).unwrap();
            for _ in 0..500 {
                if finished.load(Ordering::SeqCst) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(finished.load(Ordering::SeqCst), "the work went on after the thread stopped serving");
            threads.end().await;
        });
    }
}
