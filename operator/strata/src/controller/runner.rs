//! Wiring: the four kube-runtime Controllers, their watches and caches, bounded concurrency, and
//! graceful shutdown. Children, namespaces and unmanaged ConfigMaps are watched metadata-only (a
//! child's `managedFields` feed drift detection, then are dropped); agent pods and FailedMount
//! events are cached trimmed. An Agent is woken only by a change that matters to it: its spec,
//! metadata or the status others write, a child deleted or drifted, its pod's phase or readiness, a
//! mount failure, a ConfigMap, policy or namespace it depends on. Secrets are never read.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, PredicateConfig, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use strata_api::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};
use strata_core::cache_key::MasterKey;

use crate::controller::agent_pods::{self, PodIndex, agent_pod_selector};
use crate::controller::child_index::{ChildIndex, ChildKind};
use crate::controller::context::{Caches, Context, Settings, system_clock};
use crate::controller::error::{Error, settle_namespace_terminating};
use crate::controller::labels::MANAGED_SELECTOR;
use crate::controller::metrics::Metrics;
use crate::controller::{agent, compaction, policy, referenced_config_maps};

/// Requeue after an error, with the error's own delay.
pub fn error_policy<K>(_object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, reason = error.metric_label(), "reconcile failed");
    Action::requeue(error.requeue_after())
}

/// A metadata-only watch of one child kind that keeps `index` current and yields the Agents an
/// event shows something to act on (see [`ChildIndex::apply_event`]).
fn child_triggers<K>(
    client: &Client,
    kind: ChildKind,
    index: &ChildIndex,
) -> impl futures::Stream<Item = ObjectRef<Agent>> + Send + 'static
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let index = index.clone();
    let config = watcher::Config::default().labels(MANAGED_SELECTOR);
    watcher(Api::<PartialObjectMeta<K>>::all(client.clone()), config)
        .default_backoff()
        .filter_map(move |event| {
            futures::future::ready(match event {
                Ok(event) => Some(index.apply_event(kind, &event)),
                Err(error) => {
                    tracing::warn!(%error, kind = kind.as_str(), "watching children failed; retrying");
                    None
                }
            })
        })
        .flat_map(|agents| {
            futures::stream::iter(
                agents.into_iter().map(|(namespace, name)| ObjectRef::new(&name).within(&namespace)),
            )
        })
}

/// Keep an Agent's spec, metadata and the status fields others write (context use, last
/// compaction); drop `managedFields` and the last-applied annotation from the cache.
fn trim_agent(agent: &mut Agent) {
    agent.metadata.managed_fields = None;
    if let Some(annotations) = agent.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// What of an Agent wakes its reconcile: not the status fields the controller writes itself.
fn agent_fingerprint(agent: &Agent) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    agent.metadata.uid.hash(&mut hasher);
    agent.metadata.generation.hash(&mut hasher);
    agent.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    agent.metadata.labels.hash(&mut hasher);
    agent.metadata.annotations.hash(&mut hasher);
    let status = agent.status.as_ref();
    serde_json::to_string(&status.map(|s| (&s.context, &s.last_compaction))).ok().hash(&mut hasher);
    Some(hasher.finish())
}

fn agents_in(store: &Store<Agent>, namespace: Option<&str>) -> Vec<ObjectRef<Agent>> {
    store
        .state()
        .iter()
        .filter(|agent| namespace.is_none() || agent.metadata.namespace.as_deref() == namespace)
        .map(|agent| ObjectRef::from_obj(agent.as_ref()))
        .collect()
}

/// Run every controller until `shutdown` completes.
pub async fn run_controllers<S>(
    client: Client,
    settings: Settings,
    master_key: MasterKey,
    metrics: Arc<Metrics>,
    concurrency: u16,
    shutdown: S,
) where
    S: Future<Output = ()> + Clone + Send + Sync + 'static,
{
    let config = ControllerConfig::default().concurrency(concurrency);
    let semantic = watcher::Config::default().any_semantic();

    let (agents_cache, agents_writer) = reflector::store::<Agent>();
    let agent_stream = watcher(Api::<Agent>::all(client.clone()), semantic.clone())
        .default_backoff()
        .modify(trim_agent)
        .reflect(agents_writer)
        .applied_objects()
        .predicate_filter(agent_fingerprint, PredicateConfig::default());
    let agent_controller = Controller::for_stream(agent_stream, agents_cache);
    let context_policy_controller =
        Controller::new(Api::<ContextPolicy>::all(client.clone()), semantic.clone());
    let cluster_policy_controller =
        Controller::new(Api::<ClusterContextPolicy>::all(client.clone()), semantic.clone());
    let compaction_controller = Controller::new(Api::<CompactionJob>::all(client.clone()), semantic.clone());

    let (namespaces, namespace_writer) = reflector::store::<PartialObjectMeta<Namespace>>();
    let namespace_stream = reflector::reflector(
        namespace_writer,
        watcher(Api::<PartialObjectMeta<Namespace>>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .modify(|object| object.managed_fields_mut().clear()),
    )
    .touched_objects();

    let pods = PodIndex::default();
    let pod_index = pods.clone();
    let pod_triggers =
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default().labels(&agent_pod_selector()))
            .default_backoff()
            .inspect_ok(move |event| pod_index.apply_event(event))
            .touched_objects()
            .predicate_filter(agent_pods::pod_fingerprint, PredicateConfig::default());
    let (mount_failures, mount_failures_writer) = reflector::store::<CoreEvent>();
    let mount_failure_triggers = watcher(
        Api::<CoreEvent>::all(client.clone()),
        watcher::Config::default().fields(agent_pods::MOUNT_FAILURE_FIELDS),
    )
    .default_backoff()
    .modify(agent_pods::trim_event)
    .reflect(mount_failures_writer)
    .applied_objects();
    let (config_maps, config_maps_writer) = reflector::store::<PartialObjectMeta<ConfigMap>>();
    let config_map_triggers = watcher(
        Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
        watcher::Config::default().labels(&referenced_config_maps::unmanaged_selector()),
    )
    .default_backoff()
    .modify(referenced_config_maps::trim)
    .reflect(config_maps_writer)
    .touched_objects();

    let children = ChildIndex::new();
    let caches = Caches {
        agents: agent_controller.store(),
        context_policies: context_policy_controller.store(),
        cluster_policies: cluster_policy_controller.store(),
        namespaces,
        compaction_jobs: compaction_controller.store(),
        children: children.clone(),
        pods,
        mount_failures,
        config_maps,
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        settings,
        caches.clone(),
        Arc::new(master_key),
        metrics,
        system_clock(),
    ));

    let by_namespace = caches.agents.clone();
    let by_policy = caches.agents.clone();
    let everyone = caches.agents.clone();
    let by_config_map = caches.agents.clone();
    let agents = agent_controller
        .with_config(config.clone())
        .reconcile_on(child_triggers::<ServiceAccount>(&client, ChildKind::ServiceAccount, &children))
        .reconcile_on(child_triggers::<Role>(&client, ChildKind::Role, &children))
        .reconcile_on(child_triggers::<RoleBinding>(&client, ChildKind::RoleBinding, &children))
        .reconcile_on(child_triggers::<ConfigMap>(&client, ChildKind::ConfigMap, &children))
        .reconcile_on(child_triggers::<Service>(&client, ChildKind::Service, &children))
        .reconcile_on(child_triggers::<NetworkPolicy>(&client, ChildKind::NetworkPolicy, &children))
        .reconcile_on(child_triggers::<StatefulSet>(&client, ChildKind::StatefulSet, &children))
        .watches_stream(pod_triggers, |pod| agent_pods::agent_of_pod(&pod))
        .watches_stream(mount_failure_triggers, |event| agent_pods::agent_of_event(&event))
        .watches_stream(config_map_triggers, move |config_map| {
            referenced_config_maps::agents_referring_to(&by_config_map, &config_map)
        })
        .watches_stream(namespace_stream, move |namespace| {
            agents_in(&by_namespace, Some(&namespace.name_any()))
        })
        .watches(Api::<ContextPolicy>::all(client.clone()), semantic.clone(), move |policy| {
            agents_in(&by_policy, policy.metadata.namespace.as_deref())
        })
        .watches(Api::<ClusterContextPolicy>::all(client.clone()), semantic.clone(), move |_| {
            agents_in(&everyone, None)
        })
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |object, ctx: Arc<Context>| async move {
                let metrics = ctx.metrics.clone();
                let retry = ctx.settings.resync_interval;
                let result = agent::reconcile(object, ctx);
                metrics.track("agent", async move { settle_namespace_terminating(result.await, retry) }).await
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let context_policies = context_policy_controller
        .with_config(config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |object, ctx: Arc<Context>| async move {
                let metrics = ctx.metrics.clone();
                metrics.track("contextpolicy", policy::context_policy::reconcile(object, ctx)).await
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let cluster_policies = cluster_policy_controller
        .with_config(config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(
            |object, ctx: Arc<Context>| async move {
                let metrics = ctx.metrics.clone();
                metrics.track("clustercontextpolicy", policy::cluster_policy::reconcile(object, ctx)).await
            },
            error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let job_config = watcher::Config::default().labels(MANAGED_SELECTOR);
    let compactions = compaction_controller
        .with_config(config)
        .owns(Api::<Job>::all(client.clone()), job_config)
        .graceful_shutdown_on(shutdown)
        .run(
            |object, ctx: Arc<Context>| async move {
                let metrics = ctx.metrics.clone();
                let retry = ctx.settings.resync_interval;
                let result = compaction::reconcile(object, ctx);
                metrics
                    .track("compactionjob", async move { settle_namespace_terminating(result.await, retry) })
                    .await
            },
            error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()));

    futures::join!(agents, context_policies, cluster_policies, compactions);
}

#[cfg(test)]
mod tests {
    use strata_api::agent::{AgentPhase, AgentStatus, ContextStatus};

    use super::*;

    fn builder() -> Agent {
        let mut agent: Agent = serde_json::from_value(serde_json::json!({
            "apiVersion": "strata.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": "builder", "namespace": "ns", "uid": "u", "generation": 1},
            "spec": {"model": {"provider": "OpenAI", "name": "gpt", "contextWindow": 128000,
                               "credentialsSecretRef": {"name": "k", "key": "k"}},
                     "runtime": {"image": "i"}}
        }))
        .unwrap_or_else(|error| panic!("{error}"));
        agent.status = Some(AgentStatus::default());
        agent
    }

    #[test]
    fn the_controllers_own_status_write_does_not_wake_the_agent_but_context_use_and_spec_do() {
        let before = agent_fingerprint(&builder());
        let mut own_write = builder();
        if let Some(status) = own_write.status.as_mut() {
            status.phase = Some(AgentPhase::Running);
            status.observed_generation = Some(1);
        }
        assert_eq!(agent_fingerprint(&own_write), before);

        let mut context = builder();
        if let Some(status) = context.status.as_mut() {
            status.context = Some(ContextStatus { percent: 91, ..ContextStatus::default() });
        }
        assert_ne!(agent_fingerprint(&context), before, "the budget trigger reads context use");

        let mut edited = builder();
        edited.metadata.generation = Some(2);
        assert_ne!(agent_fingerprint(&edited), before);
    }

    #[test]
    fn the_cached_agent_drops_managed_fields_and_the_last_applied_copy() {
        let mut agent = builder();
        agent.metadata.annotations = Some(
            [
                ("kubectl.kubernetes.io/last-applied-configuration".to_string(), "{...}".to_string()),
                ("strata.dev/adopt-journal-from-uid".to_string(), "old".to_string()),
            ]
            .into(),
        );
        agent.metadata.managed_fields = Some(vec![Default::default()]);
        trim_agent(&mut agent);
        assert!(agent.metadata.managed_fields.is_none());
        let annotations = agent.metadata.annotations.unwrap_or_default();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["strata.dev/adopt-journal-from-uid"]);
    }
}
