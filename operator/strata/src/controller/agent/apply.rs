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
///
/// Two waves, each applied at once: first every child that needs no other
/// ([`ChildKind::applies_first`]), then the RoleBinding, which the apiserver refuses until its
/// Role exists, and the StatefulSet, whose pods need their ServiceAccount and ConfigMap. An Agent's
/// first reconcile so costs three round trips (two waves, then the status) instead of eight in a
/// row, which lets a fleet converge at the control plane's write rate rather than its write
/// latency. A failed apply holds back the next wave; the children applied beside it are recorded,
/// and its error is returned.
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
    }
    let (first, second): (Vec<&DesiredChild>, Vec<&DesiredChild>) =
        stale.iter().partition(|child| child.kind.applies_first());
    for wave in [first, second] {
        let applies = wave.iter().map(|child| apply_kind(ctx, namespace, children, child.kind));
        let mut first_error = None;
        for (child, applied) in wave.iter().zip(futures::future::join_all(applies).await) {
            match applied {
                Ok(ownership) => ctx.caches.children.record_applied(
                    child.kind,
                    namespace,
                    agent,
                    &child.name,
                    Some(child.spec_hash.clone()),
                    ownership,
                ),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
    }
    Ok(stale.len())
}

/// Apply the desired child of one kind.
async fn apply_kind(
    ctx: &Context,
    namespace: &str,
    children: &Children,
    kind: ChildKind,
) -> Result<Ownership> {
    match kind {
        ChildKind::ServiceAccount => apply_one(ctx, namespace, &children.service_account).await,
        ChildKind::Role => apply_one(ctx, namespace, &children.role).await,
        ChildKind::RoleBinding => apply_one(ctx, namespace, &children.role_binding).await,
        ChildKind::ConfigMap => apply_one(ctx, namespace, &children.config_map).await,
        ChildKind::Service => apply_one(ctx, namespace, &children.service).await,
        ChildKind::NetworkPolicy => apply_one(ctx, namespace, &children.network_policy).await,
        ChildKind::StatefulSet => apply_one(ctx, namespace, &children.stateful_set).await,
    }
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
