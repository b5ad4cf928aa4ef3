//! Leader election on a coordination.k8s.io/v1 Lease. The holder renews every few seconds with a
//! resourceVersion-checked replace; a standby takes the Lease once it has not been renewed for the
//! lease duration. Only the holder runs the controllers; one that loses the Lease stops.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

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
    /// A Lease not renewed for this long may be taken.
    pub lease_duration: Duration,
    /// How often the holder renews and a standby retries.
    pub retry_period: Duration,
}

impl LeaseSettings {
    /// Settings with the defaults: 15 s lease, 5 s retry, so a standby takes over within about 20 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseSettings {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(5),
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

/// Acquires, renews and releases the Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    settings: LeaseSettings,
    clock: Clock,
}

impl LeaderElector {
    /// An elector for `settings`.
    pub fn new(client: Client, settings: LeaseSettings, clock: Clock) -> Self {
        LeaderElector { api: Api::namespaced(client, &settings.namespace), settings, clock }
    }

    fn action(&self, verb: &str) -> String {
        format!("{verb} Lease {}/{}", self.settings.namespace, self.settings.name)
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// One round: create the Lease, renew it, take it over if expired, or report who holds it.
    pub async fn try_acquire_or_renew(&self) -> Result<LeaseState> {
        let now = (self.clock)();
        let me = &self.settings.identity;
        let existing = self
            .api
            .get_opt(&self.settings.name)
            .await
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
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(LeaseState::Leading),
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    Ok(LeaseState::Following(String::new()))
                }
                Err(e) => Err(Error::kube(self.action("creating"), e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == *me {
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
        } else {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(self.duration_seconds()));
            let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
            let expired = holder.is_empty() || now.as_second() - renewed.as_second() >= duration;
            if !expired {
                return Ok(LeaseState::Following(holder));
            }
            spec.holder_identity = Some(me.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(self.duration_seconds());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        match self.api.replace(&self.settings.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(LeaseState::Leading),
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(LeaseState::Following(holder)),
            Err(e) => Err(Error::kube(self.action("renewing"), e)),
        }
    }

    /// Give the Lease up (on shutdown) so a standby takes over at its next retry.
    pub async fn release(&self) -> Result<()> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.settings.name)
            .await
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
        match self.api.replace(&self.settings.name, &PostParams::default(), &lease).await {
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

    /// Keep renewing; returns [`Error::LostLeadership`] once another replica holds the Lease or
    /// renewals have failed for longer than the lease duration.
    pub async fn keep_leading(&self) -> Error {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.settings.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(LeaseState::Leading) => last_renewal = tokio::time::Instant::now(),
                Ok(LeaseState::Following(holder)) => return self.lost(holder),
                Err(error) => {
                    tracing::warn!(%error, "renewing the leader Lease failed");
                    if last_renewal.elapsed() >= self.settings.lease_duration {
                        return self.lost(String::from("nobody (renewals failed)"));
                    }
                }
            }
        }
    }

    fn lost(&self, holder: String) -> Error {
        Error::LostLeadership {
            namespace: self.settings.namespace.clone(),
            name: self.settings.name.clone(),
            holder,
        }
    }
}
