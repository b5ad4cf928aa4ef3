//! The one error type of the controller, with a bounded `reason` label for metrics.

use std::time::Duration;

/// Everything a reconcile or the controller's plumbing can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, e.g. `applying StatefulSet rateright/builder`.
        action: String,
        /// The client's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A write lost a race with another writer (HTTP 409); the object is requeued.
    #[error("{action}: conflict with another writer; retrying with fresh state")]
    Conflict {
        /// What was being done.
        action: String,
    },
    /// An object lacks a field the controller needs (name, namespace, uid).
    #[error(
        "{kind} is missing {field}; the apiserver always sets it, so this object was not read from a cluster"
    )]
    MissingField {
        /// Kind of the object.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A cache the reconcile depends on has not finished its initial list yet.
    #[error("the {0} cache has not synced yet; retrying shortly")]
    CacheNotReady(&'static str),
    /// The cache-key master Secret holds unusable key material.
    #[error(
        "master key Secret {namespace}/{name} is unusable: {message}; delete it and restart the operator to create a new one (this revokes every cache key)"
    )]
    MasterKey {
        /// Operator namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Serialising a desired object failed (a bug, reported rather than panicked).
    #[error("serialising {what}: {source}")]
    Serialize {
        /// What was serialised.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The stable prefix or cache key could not be computed from valid references.
    #[error("computing the cache identity: {0}")]
    CacheIdentity(String),
    /// Listening for /metrics, /healthz and /readyz failed.
    #[error("serving {address}: {source}")]
    Serve {
        /// The address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An apiserver call did not answer in time.
    #[error("{action}: no answer within {after:?}")]
    Timeout {
        /// What was being done.
        action: String,
        /// The timeout.
        after: Duration,
    },
    /// The controller lost its leader Lease and stops so that a standby can take over.
    #[error("lost the leader Lease {namespace}/{name} to {holder}; stopping so the new leader alone writes")]
    LostLeadership {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Who holds it now.
        holder: String,
    },
}

/// Result alias for the controller.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wrap a client error with what was being done; a 409 becomes [`Error::Conflict`].
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        let action = action.into();
        match &source {
            kube::Error::Api(status) if status.code == 409 => Error::Conflict { action },
            _ => Error::Kube { action, source: Box::new(source) },
        }
    }

    /// A short, bounded label for the `reason` of the errors metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { source, .. } => match source.as_ref() {
                kube::Error::Api(status) if status.code == 403 => "forbidden",
                kube::Error::Api(status) if status.code == 404 => "not_found",
                kube::Error::Api(status) if status.code == 422 => "invalid",
                kube::Error::Api(_) => "api_error",
                _ => "transport",
            },
            Error::Conflict { .. } => "conflict",
            Error::MissingField { .. } => "missing_field",
            Error::CacheNotReady(_) => "cache_not_ready",
            Error::MasterKey { .. } => "master_key",
            Error::Serialize { .. } => "serialize",
            Error::CacheIdentity(_) => "cache_identity",
            Error::Serve { .. } => "serve",
            Error::LostLeadership { .. } => "lost_leadership",
            Error::Timeout { .. } => "timeout",
        }
    }

    /// How long to wait before reconciling again after this error.
    pub fn requeue_after(&self) -> Duration {
        match self {
            Error::Conflict { .. } | Error::CacheNotReady(_) => Duration::from_secs(1),
            Error::MissingField { .. } | Error::Serialize { .. } | Error::CacheIdentity(_) => {
                Duration::from_secs(300)
            }
            _ => Duration::from_secs(15),
        }
    }
}

/// The object's namespace, or [`Error::MissingField`].
pub fn namespace_of(meta: &kube::api::ObjectMeta, kind: &'static str) -> Result<String> {
    meta.namespace.clone().ok_or(Error::MissingField { kind, field: "metadata.namespace" })
}

/// The object's name, or [`Error::MissingField`].
pub fn name_of(meta: &kube::api::ObjectMeta, kind: &'static str) -> Result<String> {
    meta.name.clone().ok_or(Error::MissingField { kind, field: "metadata.name" })
}
