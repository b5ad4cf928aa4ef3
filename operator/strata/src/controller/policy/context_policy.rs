//! Reconcile a ContextPolicy: count the Agents that use it and report fields a cluster lock overrides.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use strata_api::{Agent, ContextPolicy};

use super::problems::{locked_fields_set, selecting};
use super::{RECOUNT_INTERVAL, desired_status, status_changed};
use crate::controller::agent::dereference::DEFAULT_POLICY_NAME;
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::error::{Error, Result, name_of, namespace_of};

/// Whether `agent` takes its namespace policy from the ContextPolicy called `policy`.
pub fn uses_policy(agent: &Agent, policy: &str) -> bool {
    match &agent.spec.context_policy_ref {
        Some(policy_ref) => policy_ref.name == policy,
        None => policy == DEFAULT_POLICY_NAME,
    }
}

/// Reconcile one ContextPolicy, for the kube-runtime Controller.
pub async fn reconcile(policy: Arc<ContextPolicy>, ctx: Arc<Context>) -> Result<Action> {
    ctx.caches.ensure_synced().await?;
    let namespace = namespace_of(&policy.metadata, "ContextPolicy")?;
    let name = name_of(&policy.metadata, "ContextPolicy")?;
    let agent_count = ctx
        .caches
        .agents
        .state()
        .iter()
        .filter(|agent| {
            agent.metadata.namespace.as_deref() == Some(namespace.as_str()) && uses_policy(agent, &name)
        })
        .count();
    let labels = ctx
        .caches
        .namespaces
        .get(&ObjectRef::<PartialObjectMeta<Namespace>>::new(&namespace))
        .and_then(|ns| ns.metadata.labels.clone())
        .unwrap_or_default();
    let cluster_policies = ctx.caches.cluster_policies.state();
    let problems = locked_fields_set(&policy.spec.policy, &selecting(&cluster_policies, &labels));
    let desired = desired_status(
        policy.status.as_ref(),
        u32::try_from(agent_count).unwrap_or(u32::MAX),
        problems,
        policy.metadata.generation,
        ctx.now(),
    );
    if status_changed(policy.status.as_ref(), &desired) {
        let api: Api<ContextPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
        let body = json!({
            "apiVersion": format!("{}/{}", strata_api::GROUP, strata_api::VERSION),
            "kind": "ContextPolicy",
            "status": desired,
        });
        api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
            .map_err(|e| Error::kube(format!("writing the status of ContextPolicy {namespace}/{name}"), e))?;
    }
    Ok(Action::requeue(RECOUNT_INTERVAL))
}
