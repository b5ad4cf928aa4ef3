//! Step 6 of the Agent pipeline (IO): delete children labelled for this Agent that this round did
//! not build (left behind by a rename or an older operator version), but only those whose
//! controller `ownerReference` is this Agent, by UID: an object that merely carries the Agent's
//! labels (a user's look-alike, or one of an earlier Agent of the same name) is never touched.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::DeleteParams;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use super::build::DesiredChild;
use crate::controller::child_index::{ChildKind, ObservedChild};
use crate::controller::context::Context;
use crate::controller::error::{Error, Result};

/// Observed children that are not desired and whose controller owner is the Agent with `agent_uid`.
pub fn orphans(desired: &[DesiredChild], observed: &[ObservedChild], agent_uid: &str) -> Vec<ObservedChild> {
    observed
        .iter()
        .filter(|have| !desired.iter().any(|want| want.kind == have.kind && want.name == have.name))
        .filter(|have| {
            let ours = have.controller_uid.as_deref() == Some(agent_uid);
            if !ours {
                tracing::debug!(
                    kind = have.kind.as_str(),
                    name = %have.name,
                    controller = ?have.controller_uid,
                    "an object labelled for this Agent is not controlled by it; leaving it alone"
                );
            }
            ours
        })
        .cloned()
        .collect()
}

/// Delete every orphan of `agent` (whose UID is `agent_uid`); returns how many were deleted.
pub async fn delete_orphans(
    ctx: &Context,
    namespace: &str,
    agent: &str,
    agent_uid: &str,
    desired: &[DesiredChild],
) -> Result<usize> {
    let found = orphans(desired, &ctx.caches.children.children_of(namespace, agent), agent_uid);
    for orphan in &found {
        match orphan.kind {
            ChildKind::ServiceAccount => delete_one::<ServiceAccount>(ctx, namespace, &orphan.name).await?,
            ChildKind::Role => delete_one::<Role>(ctx, namespace, &orphan.name).await?,
            ChildKind::RoleBinding => delete_one::<RoleBinding>(ctx, namespace, &orphan.name).await?,
            ChildKind::ConfigMap => delete_one::<ConfigMap>(ctx, namespace, &orphan.name).await?,
            ChildKind::Service => delete_one::<Service>(ctx, namespace, &orphan.name).await?,
            ChildKind::NetworkPolicy => delete_one::<NetworkPolicy>(ctx, namespace, &orphan.name).await?,
            ChildKind::StatefulSet => delete_one::<StatefulSet>(ctx, namespace, &orphan.name).await?,
        }
        ctx.caches.children.forget(orphan.kind, namespace, agent, &orphan.name);
    }
    Ok(found.len())
}

async fn delete_one<K>(ctx: &Context, namespace: &str, name: &str) -> Result<()>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(e) => Err(Error::kube(format!("deleting orphaned {} {namespace}/{name}", K::kind(&())), e)),
    }
}
