//! Reconcile a ClusterContextPolicy: count the Agents in the namespaces it selects and report its
//! own problems.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use strata_api::ClusterContextPolicy;
use strata_api::selector::selector_matches;

use super::problems::cluster_policy_problems;
use super::{RECOUNT_INTERVAL, desired_status, status_changed};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::error::{Error, Result, name_of};

/// Whether `policy` selects the namespace called `namespace`, by the cached namespace labels.
pub fn selects(ctx: &Context, policy: &ClusterContextPolicy, namespace: &str) -> bool {
    let Some(selector) = &policy.spec.namespace_selector else { return true };
    let labels = ctx
        .caches
        .namespaces
        .get(&ObjectRef::<PartialObjectMeta<Namespace>>::new(namespace))
        .and_then(|ns| ns.metadata.labels.clone())
        .unwrap_or_default();
    selector_matches(selector, &labels).unwrap_or(false)
}

/// Reconcile one ClusterContextPolicy, for the kube-runtime Controller.
pub async fn reconcile(policy: Arc<ClusterContextPolicy>, ctx: Arc<Context>) -> Result<Action> {
    ctx.caches.ensure_synced().await?;
    let name = name_of(&policy.metadata, "ClusterContextPolicy")?;
    let agent_count = ctx
        .caches
        .agents
        .state()
        .iter()
        .filter(|agent| agent.metadata.namespace.as_deref().is_some_and(|ns| selects(&ctx, &policy, ns)))
        .count();
    let desired = desired_status(
        policy.status.as_ref(),
        u32::try_from(agent_count).unwrap_or(u32::MAX),
        cluster_policy_problems(&policy),
        policy.metadata.generation,
        ctx.now(),
    );
    if status_changed(policy.status.as_ref(), &desired) {
        let api: Api<ClusterContextPolicy> = Api::all(ctx.client.clone());
        let body = json!({
            "apiVersion": format!("{}/{}", strata_api::GROUP, strata_api::VERSION),
            "kind": "ClusterContextPolicy",
            "status": desired,
        });
        api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(|e| Error::kube(format!("writing the status of ClusterContextPolicy {name}"), e))?;
    }
    Ok(Action::requeue(RECOUNT_INTERVAL))
}
