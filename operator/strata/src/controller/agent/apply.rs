//! Step 4 of the Agent pipeline (IO): server-side apply every child whose observed spec hash
//! differs from the desired one, or whose fields someone else changed since the last apply (drift,
//! seen in the child's `managedFields` on its watch event). An unchanged Agent costs no writes.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::build::{Children, DesiredChild};
use crate::controller::child_index::{ChildKind, ObservedChild, Ownership};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::error::{Error, Result};

/// The children that are missing, whose observed spec hash differs from the desired one, or that
/// drifted.
pub fn stale_children(desired: &[DesiredChild], observed: &[ObservedChild]) -> Vec<DesiredChild> {
    desired
        .iter()
        .filter(|want| {
            !observed.iter().any(|have| {
                have.kind == want.kind
                    && have.name == want.name
                    && have.spec_hash.as_deref() == Some(want.spec_hash.as_str())
                    && !have.drifted
            })
        })
        .cloned()
        .collect()
}

/// Apply the stale children; returns how many were written.
pub async fn apply_children(
    ctx: &Context,
    namespace: &str,
    agent: &str,
    children: &Children,
) -> Result<usize> {
    let observed = ctx.caches.children.children_of(namespace, agent);
    let stale = stale_children(&children.desired(), &observed);
    for child in &stale {
        if observed.iter().any(|have| have.kind == child.kind && have.name == child.name && have.drifted) {
            tracing::info!(
                kind = child.kind.as_str(),
                %namespace,
                name = %child.name,
                "another field manager changed fields the controller sets; re-applying"
            );
        }
        let applied = match child.kind {
            ChildKind::ServiceAccount => apply_one(ctx, namespace, &children.service_account).await?,
            ChildKind::Role => apply_one(ctx, namespace, &children.role).await?,
            ChildKind::RoleBinding => apply_one(ctx, namespace, &children.role_binding).await?,
            ChildKind::ConfigMap => apply_one(ctx, namespace, &children.config_map).await?,
            ChildKind::Service => apply_one(ctx, namespace, &children.service).await?,
            ChildKind::NetworkPolicy => apply_one(ctx, namespace, &children.network_policy).await?,
            ChildKind::StatefulSet => apply_one(ctx, namespace, &children.stateful_set).await?,
        };
        ctx.caches.children.record_applied(
            child.kind,
            namespace,
            agent,
            &child.name,
            Some(child.spec_hash.clone()),
            applied,
        );
    }
    Ok(stale.len())
}

/// Apply one child; returns the field ownership of the object the apiserver stored.
async fn apply_one<K>(ctx: &Context, namespace: &str, object: &K) -> Result<Ownership>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let name = object.meta().name.clone().unwrap_or_default();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let stored = api
        .patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(|e| Error::kube(format!("applying {} {namespace}/{name}", K::kind(&())), e))?;
    Ok(Ownership::of(stored.meta()))
}
