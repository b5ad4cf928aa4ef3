//! The HTTP endpoints of the controller: `/metrics` (Prometheus text), `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::controller::error::{Error, Result};
use crate::controller::metrics::Metrics;

/// What the endpoints read.
#[derive(Clone)]
pub struct Probes {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Set once the process has a client and serves (a standby is ready too).
    pub ready: Arc<AtomicBool>,
}

/// The router.
pub fn router(probes: Probes) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(probes)
}

async fn metrics(State(probes): State<Probes>) -> String {
    probes.metrics.render()
}

async fn readyz(State(probes): State<Probes>) -> (StatusCode, &'static str) {
    if probes.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serve until `shutdown` completes.
pub async fn serve(
    address: SocketAddr,
    probes: Probes,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let serve_error = |source| Error::Serve { address: address.to_string(), source };
    let listener = tokio::net::TcpListener::bind(address).await.map_err(serve_error)?;
    axum::serve(listener, router(probes)).with_graceful_shutdown(shutdown).await.map_err(serve_error)
}
