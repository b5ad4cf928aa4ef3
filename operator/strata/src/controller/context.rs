//! What every reconcile shares: the client, settings, caches, the master key, metrics and a clock.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use strata_api::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};
use strata_core::cache_key::MasterKey;

use crate::controller::agent_pods::PodIndex;
use crate::controller::child_index::ChildIndex;
use crate::controller::compaction::turn::AgentLocks;
use crate::controller::error::{Error, Result};
use crate::controller::metrics::Metrics;
use crate::controller::prefix_cache::PrefixCache;
use crate::controller::referenced_config_maps::ConfigMapData;

/// Field manager of every server-side apply the controller makes.
pub const FIELD_MANAGER: &str = "strata.dev/controller";
/// Field manager of the Agent status fields the CompactionJob controller owns (`lastCompaction`).
pub const COMPACTION_FIELD_MANAGER: &str = "strata.dev/compaction-controller";

/// Operator-wide settings from the command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Image of the gateway sidecar (`strata gateway`).
    pub gateway_image: String,
    /// Image of compaction Jobs (`strata compact`).
    pub compactor_image: String,
    /// Namespace the operator runs in (master key Secret, Lease, metrics scrapers).
    pub operator_namespace: String,
    /// At most one Budget CompactionJob per agent per this interval.
    pub budget_compaction_interval: Duration,
    /// Every Agent is reconciled at least this often (picks up ConfigMap edits).
    pub resync_interval: Duration,
}

impl Settings {
    /// Settings with the default intervals.
    pub fn new(gateway_image: &str, compactor_image: &str, operator_namespace: &str) -> Self {
        Settings {
            gateway_image: gateway_image.into(),
            compactor_image: compactor_image.into(),
            operator_namespace: operator_namespace.into(),
            budget_compaction_interval: Duration::from_secs(600),
            resync_interval: Duration::from_secs(300),
        }
    }
}

/// Reflector caches of small, non-secret objects (trimmed to what reconciles read), plus the
/// metadata index of children.
#[derive(Clone)]
pub struct Caches {
    /// Every Agent.
    pub agents: Store<Agent>,
    /// Every ContextPolicy.
    pub context_policies: Store<ContextPolicy>,
    /// Every ClusterContextPolicy.
    pub cluster_policies: Store<ClusterContextPolicy>,
    /// Namespace metadata (labels, UID, cache-epoch annotation).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Every CompactionJob.
    pub compaction_jobs: Store<CompactionJob>,
    /// Children by Agent, from metadata-only watches.
    pub children: ChildIndex,
    /// Agent pods, reduced to phase, readiness, node and the gateway's refusal message.
    pub pods: PodIndex,
    /// FailedMount events of pods, trimmed to the pod and the message.
    pub mount_failures: Store<CoreEvent>,
    /// Names and resourceVersions of the ConfigMaps Strata does not manage.
    pub config_maps: Store<PartialObjectMeta<ConfigMap>>,
}

impl Caches {
    /// Fail fast with [`Error::CacheNotReady`] unless every store has finished its initial list.
    pub async fn ensure_synced(&self) -> Result<()> {
        let wait = Duration::from_millis(50);
        ready(&self.agents, wait, "Agent").await?;
        ready(&self.context_policies, wait, "ContextPolicy").await?;
        ready(&self.cluster_policies, wait, "ClusterContextPolicy").await?;
        ready(&self.namespaces, wait, "Namespace").await?;
        ready(&self.compaction_jobs, wait, "CompactionJob").await?;
        ready(&self.mount_failures, wait, "Event").await?;
        ready(&self.config_maps, wait, "ConfigMap").await?;
        if !self.children.is_synced() {
            return Err(Error::CacheNotReady("children"));
        }
        if !self.pods.is_synced() {
            return Err(Error::CacheNotReady("Pod"));
        }
        Ok(())
    }
}

async fn ready<K>(store: &Store<K>, wait: Duration, name: &'static str) -> Result<()>
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    match tokio::time::timeout(wait, store.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Error::CacheNotReady(name)),
    }
}

/// A source of the current time (fixed in tests).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(Timestamp::now)
}

/// Shared state of every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Command-line settings.
    pub settings: Settings,
    /// Caches.
    pub caches: Caches,
    /// The root of every tenant's cache key.
    pub master_key: Arc<MasterKey>,
    /// Memoised stable prefixes.
    pub prefixes: PrefixCache,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// events.k8s.io publisher.
    pub recorder: Recorder,
    /// The time.
    pub clock: Clock,
    /// Per-agent locks: one compaction Job per agent at a time.
    pub compaction_turns: AgentLocks,
    /// Data of referenced ConfigMaps, one read per version.
    pub config_map_data: ConfigMapData,
}

impl Context {
    /// A context with a fresh prefix cache and an events recorder for `reporter`.
    pub fn new(
        client: Client,
        settings: Settings,
        caches: Caches,
        master_key: Arc<MasterKey>,
        metrics: Arc<Metrics>,
        clock: Clock,
    ) -> Self {
        let reporter =
            Reporter { controller: "strata-operator".into(), instance: std::env::var("POD_NAME").ok() };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            caches,
            master_key,
            prefixes: PrefixCache::default(),
            metrics,
            clock,
            compaction_turns: AgentLocks::default(),
            config_map_data: ConfigMapData::default(),
        }
    }

    /// The current time.
    pub fn now(&self) -> Timestamp {
        (self.clock)()
    }
}
