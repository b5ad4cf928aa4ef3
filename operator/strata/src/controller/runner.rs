//! Wiring: the four kube-runtime Controllers, their watches and caches, bounded concurrency, and
//! graceful shutdown. Children and namespaces are watched metadata-only (a child's `managedFields`
//! feed drift detection, then are dropped); Secrets and ConfigMaps are never cached.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use strata_api::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};
use strata_core::cache_key::MasterKey;

use crate::controller::child_index::{ChildIndex, ChildKind};
use crate::controller::context::{Caches, Context, Settings, system_clock};
use crate::controller::error::{Error, settle_namespace_terminating};
use crate::controller::labels::MANAGED_SELECTOR;
use crate::controller::metrics::Metrics;
use crate::controller::{agent, compaction, policy};

/// Requeue after an error, with the error's own delay.
pub fn error_policy<K>(_object: Arc<K>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, reason = error.metric_label(), "reconcile failed");
    Action::requeue(error.requeue_after())
}

/// A metadata-only watch of one child kind that keeps `index` current and yields the objects.
fn child_stream<K>(
    client: &Client,
    kind: ChildKind,
    index: &ChildIndex,
) -> impl futures::Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
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
        .map_ok(move |event| {
            index.apply_event(kind, &event);
            event
        })
        .modify(|object| object.managed_fields_mut().clear())
        .touched_objects()
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

    let agent_controller = Controller::new(Api::<Agent>::all(client.clone()), semantic.clone());
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

    let children = ChildIndex::new();
    let caches = Caches {
        agents: agent_controller.store(),
        context_policies: context_policy_controller.store(),
        cluster_policies: cluster_policy_controller.store(),
        namespaces,
        compaction_jobs: compaction_controller.store(),
        children: children.clone(),
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
    let agents = agent_controller
        .with_config(config.clone())
        .owns_stream(child_stream::<ServiceAccount>(&client, ChildKind::ServiceAccount, &children))
        .owns_stream(child_stream::<Role>(&client, ChildKind::Role, &children))
        .owns_stream(child_stream::<RoleBinding>(&client, ChildKind::RoleBinding, &children))
        .owns_stream(child_stream::<ConfigMap>(&client, ChildKind::ConfigMap, &children))
        .owns_stream(child_stream::<Service>(&client, ChildKind::Service, &children))
        .owns_stream(child_stream::<NetworkPolicy>(&client, ChildKind::NetworkPolicy, &children))
        .owns_stream(child_stream::<StatefulSet>(&client, ChildKind::StatefulSet, &children))
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
