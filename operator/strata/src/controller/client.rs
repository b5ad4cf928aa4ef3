//! The controller's Kubernetes clients: every request is counted by method, every write is logged
//! at debug level (target `strata::controller::client`), and the reconcilers' client refuses to
//! send a write unless this replica leads within its renew deadline (the leader election's own
//! client is exempt, or it could never win).

use std::sync::Arc;

use http::Request;
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use tower::BoxError;
use tower::filter::FilterLayer;

use crate::controller::leader::Leadership;
use crate::controller::metrics::Metrics;

/// Why a write was not sent.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to send {method} {path}: this replica does not hold the leader Lease (or its renew deadline passed)"
)]
pub struct NotLeading {
    method: String,
    path: String,
}

fn is_write(request: &Request<Body>) -> bool {
    !matches!(request.method().as_str(), "GET" | "HEAD" | "OPTIONS")
}

/// Which client a request came from, for the requests metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// The controllers' reconciles, watches and caches.
    Reconcilers,
    /// The leader election (Lease reads and renewals).
    LeaderElection,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Reconcilers => "reconcilers",
            Purpose::LeaderElection => "leader-election",
        }
    }
}

/// A client that counts and logs its requests; with `leadership`, it also refuses writes while
/// this replica does not lead.
pub fn build(
    config: Config,
    metrics: Arc<Metrics>,
    purpose: Purpose,
    leadership: Option<Leadership>,
) -> kube::Result<Client> {
    let gate = FilterLayer::new(move |request: Request<Body>| -> Result<Request<Body>, BoxError> {
        let write = is_write(&request);
        if write && leadership.as_ref().is_some_and(|l| !l.is_leading()) {
            metrics.count_refused_write();
            let refused =
                NotLeading { method: request.method().to_string(), path: request.uri().path().into() };
            tracing::warn!(error = %refused, "write refused");
            return Err(refused.into());
        }
        metrics.count_request(purpose.label(), request.method().as_str());
        if write {
            tracing::debug!(method = %request.method(), path = request.uri().path(), "apiserver write");
        }
        Ok(request)
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&gate).build())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_are_not_writes() {
        let request =
            |method: &str| Request::builder().method(method).uri("/api").body(Body::empty()).unwrap();
        assert!(!is_write(&request("GET")));
        assert!(is_write(&request("PATCH")));
        assert!(is_write(&request("POST")));
        assert!(is_write(&request("DELETE")));
        assert!(is_write(&request("PUT")));
    }
}
