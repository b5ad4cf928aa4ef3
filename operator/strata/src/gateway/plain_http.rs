//! Reused HTTP/1 connections to a plain-`http` upstream reached directly, with no task spawned per
//! request.
//!
//! hyper-util's pooled client gives an HTTP/1 connection back to its pool from a task it spawns for
//! every request, because the answer's body may still be streaming when the request returns. On the
//! gateway's two-worker runtime of the time, that task woke the idle worker, and the request often
//! finished on the other thread: about 20 µs at p50 and 80 µs at p99 per hop on loopback
//! (BENCHMARKS.md, "The upstream connection given back by the answer"). Here the connection goes
//! back when its caller has read the answer to its end: a [`Lease`] travels with the response. A
//! lease dropped before the end closes its connection, which is what hyper does with an HTTP/1
//! exchange left half read.
//!
//! Idle connections are kept by host and by serving thread (`serving_threads.rs`): a connection's
//! task runs on the thread that opened it, and a request sent on it from another thread would wake
//! that thread twice.
//!
//! `https` endpoints and endpoints behind a proxy stay on hyper-util's client: TLS may negotiate
//! HTTP/2, whose shared connections need no such task, and a proxy changes the request's form.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use axum::http::{HeaderValue, Request, Response, Uri, header};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use tokio::time::Instant;
use tower::Service;

use super::connector::{IDLE_CONNECTIONS_PER_HOST, ProxiedConnector, error_chain};

/// A request body as it goes upstream.
type UpstreamBody = BoxBody<Bytes, Infallible>;

/// The longest pause between two sweeps of idle connections.
const LONGEST_SWEEP_PAUSE: Duration = Duration::from_secs(5);

/// Why a request was not answered.
#[derive(Debug)]
pub enum PlainHttpError {
    /// No connection could be made: nothing was sent.
    Connect(String),
    /// The request failed on its connection (it may have reached the upstream).
    Exchange(String),
}

/// An idle connection and when it went idle.
struct Idle {
    sender: SendRequest<UpstreamBody>,
    since: Instant,
}

impl Idle {
    /// Whether it may take a request: open, and idle for less than `idle_timeout`.
    fn usable(&self, idle_timeout: Duration) -> bool {
        self.since.elapsed() < idle_timeout && !self.sender.is_closed()
    }
}

/// Where idle connections are kept: the serving thread whose runtime runs the connection's task,
/// and the host.
type IdleKey = (usize, Arc<str>);

/// Where a plain-`http` upstream's requests go, worked out once per URL (`upstream.rs` keeps it
/// with the URL's route): the request's origin form, its `Host` header, and the host the pool keeps
/// connections under. The absolute URL to connect to is the request's own.
#[derive(Debug)]
pub struct PlainTarget {
    origin_form: Uri,
    host_header: HeaderValue,
    host: Arc<str>,
}

impl PlainTarget {
    /// The target of the absolute `http` URL `destination`; `None` when it names no host that a
    /// `Host` header can carry.
    pub fn of(destination: &Uri) -> Option<Self> {
        let host = host_of(destination)?;
        let origin_form =
            Uri::try_from(destination.path_and_query().map_or("/", |path| path.as_str())).ok()?;
        let host_header = HeaderValue::try_from(host.as_str()).ok()?;
        Some(Self { origin_form, host_header, host: host.into() })
    }
}

/// The connections to plain-`http` upstreams, idle ones by serving thread and host.
pub struct PlainHttpPool {
    connector: ProxiedConnector,
    idle_timeout: Duration,
    idle: Mutex<HashMap<IdleKey, Vec<Idle>>>,
    sweeping: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for PlainHttpPool {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PlainHttpPool")
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

/// A connection lent to one request: given back with [`Lease::give_back`] once its answer was read
/// to the end, closed if dropped before.
pub struct Lease {
    pool: Weak<PlainHttpPool>,
    key: IdleKey,
    sender: SendRequest<UpstreamBody>,
}

impl Lease {
    /// Puts the connection back for the next request (the answer was read to its end).
    pub fn give_back(self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.put(self.key, self.sender);
        }
    }
}

/// `host` or `host:port` of `uri`, as the `Host` header and the pool's key; `None` without a host.
fn host_of(uri: &Uri) -> Option<String> {
    let host = uri.host()?;
    Some(match uri.port_u16() {
        Some(port) if port != 80 => format!("{host}:{port}"),
        _ => host.to_owned(),
    })
}

impl PlainHttpPool {
    /// A pool that connects with `connector` and closes connections idle for `idle_timeout`.
    pub fn new(connector: ProxiedConnector, idle_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            connector,
            idle_timeout,
            idle: Mutex::default(),
            sweeping: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Sends `request`, addressed to `target`'s absolute URL, on an idle connection to its host or
    /// on a new one, in origin form with the target's `Host`. A request that an idle connection
    /// could not take (the upstream had closed it) goes on another; nothing is sent twice.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<UpstreamBody>,
        target: &PlainTarget,
    ) -> Result<(Response<Incoming>, Lease), PlainHttpError> {
        let destination = std::mem::replace(request.uri_mut(), target.origin_form.clone());
        if !request.headers().contains_key(header::HOST) {
            request.headers_mut().insert(header::HOST, target.host_header.clone());
        }
        let key = (super::serving_threads::current(), Arc::clone(&target.host));
        while let Some(mut sender) = self.take(&key) {
            // Closed by the upstream while it was idle: nothing was sent on it.
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, self.lease(key, sender))),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(PlainHttpError::Exchange(error_chain(&failed.into_error()))),
                },
            }
        }
        let mut sender = self.connect(destination).await?;
        match sender.send_request(request).await {
            Ok(response) => Ok((response, self.lease(key, sender))),
            Err(error) => Err(PlainHttpError::Exchange(error_chain(&error))),
        }
    }

    fn lease(self: &Arc<Self>, key: IdleKey, sender: SendRequest<UpstreamBody>) -> Lease {
        Lease { pool: Arc::downgrade(self), key, sender }
    }

    /// A new connection to `destination`'s host, its connection task running.
    async fn connect(&self, destination: Uri) -> Result<SendRequest<UpstreamBody>, PlainHttpError> {
        let mut connector = self.connector.clone();
        let stream = connector
            .call(destination)
            .await
            .map_err(|error| PlainHttpError::Connect(error_chain(error.as_ref())))?;
        let (mut sender, connection) = http1::Builder::new()
            .handshake(stream)
            .await
            .map_err(|error| PlainHttpError::Connect(error_chain(&error)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(error = %error_chain(&error), "upstream connection ended");
            }
        });
        sender.ready().await.map_err(|error| PlainHttpError::Connect(error_chain(&error)))?;
        Ok(sender)
    }

    /// The most recently idle connection of `key` that is not past the idle timeout.
    fn take(&self, key: &IdleKey) -> Option<SendRequest<UpstreamBody>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = idle.get_mut(key)?;
        while let Some(connection) = kept.pop() {
            if connection.usable(self.idle_timeout) {
                return Some(connection.sender);
            }
        }
        None
    }

    /// Keeps `sender` for the next request of `key`, and starts the sweep of idle connections if
    /// it is not running.
    fn put(self: Arc<Self>, key: IdleKey, sender: SendRequest<UpstreamBody>) {
        if sender.is_closed() {
            return;
        }
        {
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            let kept = idle.entry(key).or_default();
            if kept.len() >= IDLE_CONNECTIONS_PER_HOST {
                return;
            }
            kept.push(Idle { sender, since: Instant::now() });
        }
        // The flag is taken only where a sweep can be started, so it never stays set without one.
        if let Ok(runtime) = tokio::runtime::Handle::try_current()
            && !self.sweeping.swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            runtime.spawn(sweep(Arc::downgrade(&self)));
        }
    }

    /// Closes the connections idle for the idle timeout; says whether any stay idle.
    fn close_expired(&self) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|_, kept| {
            kept.retain(|connection| connection.usable(self.idle_timeout));
            !kept.is_empty()
        });
        !idle.is_empty()
    }

    /// Idle connections, for tests.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).values().map(Vec::len).sum()
    }
}

/// Closes idle connections once they pass the idle timeout; ends when none is idle (the next one
/// kept starts it again) or the pool is gone.
async fn sweep(pool: Weak<PlainHttpPool>) {
    loop {
        let Some(pause) = pool.upgrade().map(|pool| (pool.idle_timeout / 2).min(LONGEST_SWEEP_PAUSE)) else {
            return;
        };
        tokio::time::sleep(pause.max(Duration::from_millis(10))).await;
        let Some(pool) = pool.upgrade() else { return };
        if !pool.close_expired() {
            pool.sweeping.store(false, std::sync::atomic::Ordering::Release);
            // One kept after the check and before the flag was cleared would find it set.
            if !pool.close_expired() || pool.sweeping.swap(true, std::sync::atomic::Ordering::AcqRel) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::connector::tests::answer_once as answer;
    use super::*;
    use http_body_util::{BodyExt, Full};

    #[test]
    fn the_host_header_names_a_port_other_than_80() {
        let host = |text: &str| host_of(&text.parse::<Uri>().unwrap());
        assert_eq!(host("http://127.0.0.1:8080/v1/models").as_deref(), Some("127.0.0.1:8080"));
        assert_eq!(host("http://upstream.internal:80/v1").as_deref(), Some("upstream.internal"));
        assert_eq!(host("http://upstream.internal/v1").as_deref(), Some("upstream.internal"));
        assert_eq!(host("http://[::1]:65535/").as_deref(), Some("[::1]:65535"));
        assert_eq!(host("/v1/models"), None, "an origin-form URI names no host");
        let target = PlainTarget::of(&"http://127.0.0.1:8080/v1/models?limit=1".parse().unwrap()).unwrap();
        assert_eq!(target.origin_form, "/v1/models?limit=1");
        assert_eq!(target.host_header, "127.0.0.1:8080");
        assert!(PlainTarget::of(&"/v1/models".parse().unwrap()).is_none());
    }

    /// Sends `get(address)` on `pool`.
    async fn send_get(
        pool: &Arc<PlainHttpPool>,
        address: std::net::SocketAddr,
    ) -> Result<(Response<Incoming>, Lease), PlainHttpError> {
        let request = get(address);
        let target = PlainTarget::of(request.uri()).unwrap();
        pool.send(request, &target).await
    }

    fn get(address: std::net::SocketAddr) -> Request<UpstreamBody> {
        let mut request = Request::new(Full::new(Bytes::new()).boxed());
        *request.uri_mut() = format!("http://{address}/v1/models?limit=1").parse().unwrap();
        request
    }

    async fn read_to_end(response: Response<Incoming>) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_connection_given_back_serves_the_next_request_in_origin_form_with_its_host() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let heads = tokio::spawn(async move {
            let (mut stream, _) = server.accept().await.unwrap();
            let first = answer(&mut stream).await;
            let second = answer(&mut stream).await;
            // No second connection was opened.
            let another = tokio::time::timeout(Duration::from_millis(200), server.accept()).await;
            (first, second, another.is_err())
        });
        let pool = PlainHttpPool::new(ProxiedConnector::direct(), Duration::from_secs(60));
        for _ in 0..2 {
            let (response, lease) = send_get(&pool, address).await.unwrap();
            assert_eq!(read_to_end(response).await, Bytes::from_static(b"{}"));
            lease.give_back();
        }
        let (first, second, one_connection) = heads.await.unwrap();
        let expected = format!("GET /v1/models?limit=1 HTTP/1.1\r\nhost: {address}\r\n");
        assert!(first.to_ascii_lowercase().starts_with(&expected.to_ascii_lowercase()), "{first}");
        assert!(second.to_ascii_lowercase().starts_with(&expected.to_ascii_lowercase()), "{second}");
        assert!(one_connection, "the second request reused the first connection");
    }

    #[tokio::test]
    async fn a_lease_dropped_before_the_end_closes_its_connection_and_the_next_request_opens_one() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let accepted = tokio::spawn(async move {
            let mut connections = 0;
            for _ in 0..2 {
                let (mut stream, _) = server.accept().await.unwrap();
                connections += 1;
                answer(&mut stream).await;
            }
            connections
        });
        let pool = PlainHttpPool::new(ProxiedConnector::direct(), Duration::from_secs(60));
        let (_unread, lease) = send_get(&pool, address).await.unwrap();
        drop(lease);
        assert_eq!(pool.idle_count(), 0, "a connection whose answer was not read is not kept");
        let (response, lease) = send_get(&pool, address).await.unwrap();
        assert_eq!(read_to_end(response).await, Bytes::from_static(b"{}"));
        lease.give_back();
        assert_eq!(accepted.await.unwrap(), 2);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_while_idle_is_not_used_and_nothing_is_lost() {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let served = tokio::spawn(async move {
            let (mut stream, _) = server.accept().await.unwrap();
            answer(&mut stream).await;
            drop(stream);
            let (mut stream, _) = server.accept().await.unwrap();
            answer(&mut stream).await
        });
        let pool = PlainHttpPool::new(ProxiedConnector::direct(), Duration::from_secs(60));
        let (response, lease) = send_get(&pool, address).await.unwrap();
        read_to_end(response).await;
        lease.give_back();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (response, lease) = send_get(&pool, address).await.unwrap();
        assert_eq!(read_to_end(response).await, Bytes::from_static(b"{}"));
        lease.give_back();
        assert!(
            served.await.unwrap().starts_with("GET /v1/models"),
            "the request reached the upstream on a new connection"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let unused = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = unused.local_addr().unwrap();
        drop(unused);
        let pool = PlainHttpPool::new(ProxiedConnector::direct(), Duration::from_secs(60));
        let refused = send_get(&pool, address).await;
        assert!(matches!(refused, Err(PlainHttpError::Connect(_))), "{:?}", refused.err());
    }
}
