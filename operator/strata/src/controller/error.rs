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
    /// The apiserver refused to create something in a namespace that is being deleted (HTTP 403
    /// with cause `NamespaceTerminating`). Not a failure: nothing may be created there any more.
    #[error("{action}: namespace {namespace} is being deleted; nothing more is created in it")]
    NamespaceTerminating {
        /// What was being done.
        action: String,
        /// The namespace.
        namespace: String,
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
    /// Wrap a client error with what was being done; a 409 becomes [`Error::Conflict`], and a 403
    /// for a namespace being deleted [`Error::NamespaceTerminating`].
    pub fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        let action = action.into();
        match &source {
            kube::Error::Api(status) if status.code == 409 => Error::Conflict { action },
            kube::Error::Api(status) if let Some(namespace) = terminating_namespace(status) => {
                Error::NamespaceTerminating { action, namespace }
            }
            _ => Error::Kube { action, source: Box::new(source) },
        }
    }

    /// Whether this error is the expected refusal of a namespace being deleted: not counted as a
    /// failure and not retried soon.
    pub fn is_namespace_terminating(&self) -> bool {
        matches!(self, Error::NamespaceTerminating { .. })
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
            Error::NamespaceTerminating { .. } => "namespace_terminating",
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
            Error::NamespaceTerminating { .. }
            | Error::MissingField { .. }
            | Error::Serialize { .. }
            | Error::CacheIdentity(_) => Duration::from_secs(300),
            _ => Duration::from_secs(15),
        }
    }
}

/// The namespace a 403 names as being deleted: the apiserver's `NamespaceTerminating` cause, or its
/// message "unable to create new content in namespace X because it is being terminated".
fn terminating_namespace(status: &kube::core::Status) -> Option<String> {
    if status.code != 403 {
        return None;
    }
    let details = status.details.as_ref();
    let by_cause = details.is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"));
    if !by_cause && !status.message.contains("because it is being terminated") {
        return None;
    }
    let from_message = status
        .message
        .split_once("in namespace ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .map(String::from);
    from_message.or_else(|| details.map(|d| d.name.clone())).filter(|name| !name.is_empty())
}

/// A reconcile's result with a terminating namespace's refusal taken as what it is: not a failure
/// (so it is neither counted in the errors metric nor retried hot) but a slow requeue; the objects
/// in that namespace are about to be deleted with it.
pub fn settle_namespace_terminating(
    result: Result<kube::runtime::controller::Action>,
    retry: Duration,
) -> Result<kube::runtime::controller::Action> {
    match result {
        Err(error) if error.is_namespace_terminating() => {
            tracing::debug!(%error, "namespace is being deleted; not applying into it");
            Ok(kube::runtime::controller::Action::requeue(retry))
        }
        other => other,
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
