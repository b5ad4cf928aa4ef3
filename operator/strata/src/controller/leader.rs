//! Leader election on a coordination.k8s.io/v1 Lease, safe against pauses and clock skew:
//! - the holder renews every `retry_period` with a resourceVersion-checked replace and counts as
//!   leader only until `renew_deadline` (shorter than the lease) after the start of its last
//!   successful renewal, measured on its own monotonic clock ([`Leadership`]); past that it stops
//!   writing at once (the client refuses writes, see [`super::client`]) and exits;
//! - a standby never compares the holder's `renewTime` with its own wall clock: it takes the Lease
//!   only after it has itself watched the record stay unchanged for the lease duration;
//! - every apiserver call of the election has a timeout, so a hung connection cannot stretch a term.
//!
//! Why not a crate: kube-lease-manager 0.13 (the maintained one for kube 5) judges expiry from the
//! holder's `renewTime` against the local wall clock, has no per-call timeout and exposes no
//! monotonic deadline a write guard could check; the safety properties above are the point here.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::controller::context::Clock;
use crate::controller::error::{Error, Result};

/// Lease parameters.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// A standby takes the Lease once it has seen it unrenewed for this long.
    pub lease_duration: Duration,
    /// The holder stops writing this long after the start of its last successful renewal.
    pub renew_deadline: Duration,
    /// How often the holder renews and a standby looks.
    pub retry_period: Duration,
    /// Longest wait for one apiserver call of the election.
    pub call_timeout: Duration,
}

impl LeaseSettings {
    /// Settings with the defaults: 15 s lease, 10 s renew deadline, 2 s retry, 5 s per call. A
    /// standby takes over within about 17 s; the old holder stopped writing 5 s before that.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseSettings {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// Who holds the Lease after one attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// This replica holds it.
    Leading,
    /// Another replica holds it (empty when unknown).
    Following(String),
}

/// Whether this replica may write now: leading, and within the renew deadline of its last
/// successful renewal. Cheap to clone and to check; the client checks it before every write.
#[derive(Clone, Debug)]
pub struct Leadership {
    valid_until: Arc<Mutex<Option<Instant>>>,
    unconditional: bool,
}

impl Leadership {
    /// Leadership that must be won and kept through the Lease.
    pub fn elected() -> Self {
        Leadership { valid_until: Arc::default(), unconditional: false }
    }

    /// Leadership of a single replica running without election.
    pub fn unconditional() -> Self {
        Leadership { valid_until: Arc::default(), unconditional: true }
    }

    /// Whether writes are allowed now.
    pub fn is_leading(&self) -> bool {
        self.unconditional || self.lock().is_some_and(|until| Instant::now() < until)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.valid_until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn extend(&self, until: Instant) {
        *self.lock() = Some(until);
    }

    fn revoke(&self) {
        *self.lock() = None;
    }
}

/// The Lease record a standby watches, and when it last saw it change.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    record: (Option<String>, Option<MicroTime>, Option<i32>, Option<String>),
    since: Instant,
}

/// Acquires, renews and releases the Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    clock: Clock,
    leadership: Leadership,
    observed: Mutex<Option<Observed>>,
}

impl LeaderElector {
    /// An elector for `settings`; it extends and revokes `leadership`.
    pub fn new(client: Client, settings: LeaseSettings, clock: Clock, leadership: Leadership) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            clock,
            leadership,
            observed: Mutex::new(None),
        }
    }

    fn action(&self, verb: &str) -> String {
        format!("{verb} Lease {}/{}", self.settings.namespace, self.settings.name)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    async fn within_timeout<T>(
        &self,
        verb: &str,
        call: impl std::future::Future<Output = std::result::Result<T, kube::Error>>,
    ) -> Result<std::result::Result<T, kube::Error>> {
        tokio::time::timeout(self.settings.call_timeout, call)
            .await
            .map_err(|_| Error::Timeout { action: self.action(verb), after: self.settings.call_timeout })
    }

    /// Whether the holder's record has stood unchanged, as this replica watched it, for the lease
    /// duration. The first sight of a record starts the watch; the holder's clock is never used.
    fn unrenewed_for_lease_duration(&self, spec: &LeaseSpec, resource_version: Option<String>) -> bool {
        let record =
            (spec.holder_identity.clone(), spec.renew_time.clone(), spec.lease_transitions, resource_version);
        let now = Instant::now();
        let mut observed = self.observed.lock().unwrap_or_else(PoisonError::into_inner);
        match observed.as_ref() {
            Some(seen) if seen.record == record => {
                now.duration_since(seen.since) >= self.settings.lease_duration
            }
            _ => {
                *observed = Some(Observed { record, since: now });
                false
            }
        }
    }

    /// One round: create the Lease, renew it, take it over if expired, or report who holds it.
    /// A successful create or replace extends [`Leadership`] to the renew deadline from the start
    /// of this round.
    pub async fn try_acquire_or_renew(&self) -> Result<LeaseState> {
        let started = Instant::now();
        let state = self.acquire_or_renew().await?;
        if state == LeaseState::Leading {
            self.leadership.extend(started + self.settings.renew_deadline);
        }
        Ok(state)
    }

    async fn acquire_or_renew(&self) -> Result<LeaseState> {
        let now = (self.clock)();
        let me = &self.settings.identity;
        let existing = self
            .within_timeout("reading", self.api.get_opt(&self.settings.name))
            .await?
            .map_err(|e| Error::kube(self.action("reading"), e))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.settings.name.clone()),
                    namespace: Some(self.settings.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self
                .within_timeout("creating", self.api.create(&PostParams::default(), &lease))
                .await?
            {
                Ok(_) => Ok(LeaseState::Leading),
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    Ok(LeaseState::Following(String::new()))
                }
                Err(e) => Err(Error::kube(self.action("creating"), e)),
            };
        };
        let resource_version = lease.metadata.resource_version.clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == *me {
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
        } else {
            let expired = holder.is_empty() || self.unrenewed_for_lease_duration(spec, resource_version);
            if !expired {
                return Ok(LeaseState::Following(holder));
            }
            spec.holder_identity = Some(me.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        let params = PostParams::default();
        let replace = self.api.replace(&self.settings.name, &params, &lease);
        match self.within_timeout("renewing", replace).await? {
            Ok(_) => Ok(LeaseState::Leading),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(LeaseState::Following(holder)),
            Err(e) => Err(Error::kube(self.action("renewing"), e)),
        }
    }

    /// Give the Lease up (on shutdown) so a standby takes over at its next retry.
    pub async fn release(&self) -> Result<()> {
        self.leadership.revoke();
        let Some(mut lease) = self
            .within_timeout("reading", self.api.get_opt(&self.settings.name))
            .await?
            .map_err(|e| Error::kube(self.action("reading"), e))?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.settings.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        let params = PostParams::default();
        let replace = self.api.replace(&self.settings.name, &params, &lease);
        match self.within_timeout("releasing", replace).await? {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(()),
            Err(e) => Err(Error::kube(self.action("releasing"), e)),
        }
    }

    /// Retry until this replica leads.
    pub async fn wait_until_leading(&self) {
        loop {
            match self.try_acquire_or_renew().await {
                Ok(LeaseState::Leading) => return,
                Ok(LeaseState::Following(holder)) => tracing::debug!(%holder, "standing by"),
                Err(error) => tracing::warn!(%error, "leader election attempt failed"),
            }
            tokio::time::sleep(self.settings.retry_period).await;
        }
    }

    /// Keep renewing; returns [`Error::LostLeadership`] (with writes already refused) once another
    /// replica holds the Lease or no renewal has succeeded within the renew deadline.
    pub async fn keep_leading(&self) -> Error {
        loop {
            tokio::time::sleep(self.settings.retry_period).await;
            if !self.leadership.is_leading() {
                return self.lost(String::from("nobody (no renewal within the renew deadline)"));
            }
            match self.try_acquire_or_renew().await {
                Ok(LeaseState::Leading) => {}
                Ok(LeaseState::Following(holder)) => return self.lost(holder),
                Err(error) => {
                    tracing::warn!(%error, "renewing the leader Lease failed");
                    if !self.leadership.is_leading() {
                        return self.lost(String::from("nobody (renewals failed)"));
                    }
                }
            }
        }
    }

    fn lost(&self, holder: String) -> Error {
        self.leadership.revoke();
        Error::LostLeadership {
            namespace: self.settings.namespace.clone(),
            name: self.settings.name.clone(),
            holder,
        }
    }
}
