//! Step 3 of the Agent pipeline (pure): the desired children of a validated Agent. Every child
//! carries the standard labels, an owner reference to the Agent, and a `strata.dev/spec-hash`
//! annotation of its own content, which the apply step compares before writing.

mod config_map;
mod egress;
mod metadata;
mod network_policy;
mod rbac;
mod service;
mod stateful_set;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Resource;
use serde::Serialize;
use strata_api::Agent;

pub use config_map::{CONFIG_FILE, config_map_name, gateway_config};
pub(crate) use egress::egress_mounts;
pub use metadata::ChildMeta;
pub use stateful_set::{
    API_KEY_FILE, CONFIG_DIR, DATA_DIR, GATEWAY_LISTEN, GATEWAY_PORT, JOURNAL_VOLUME, METRICS_PORT,
    journal_claim_name,
};
pub(crate) use stateful_set::{
    config_and_credentials_volumes, mount, restricted, runtime_default_seccomp, summarizer_mount,
    summarizer_volume,
};

use crate::controller::child_index::ChildKind;
use crate::controller::context::Settings;
use crate::controller::error::Result;
use crate::controller::hashing::json_sha256;
use crate::controller::labels::ANNOTATION_SPEC_HASH;

use super::validate::Validated;

/// Every child of one Agent.
#[derive(Clone, Debug, PartialEq)]
pub struct Children {
    /// The gateway's identity.
    pub service_account: ServiceAccount,
    /// May patch only this Agent's status.
    pub role: Role,
    /// Binds the Role to the ServiceAccount.
    pub role_binding: RoleBinding,
    /// `gateway.json`.
    pub config_map: ConfigMap,
    /// Headless metrics Service (and the StatefulSet's governing Service).
    pub service: Service,
    /// Ingress only from the namespace and from the operator for metrics.
    pub network_policy: NetworkPolicy,
    /// The agent pod with the gateway sidecar and the journal volume.
    pub stateful_set: StatefulSet,
}

/// A built child, as the apply step sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredChild {
    /// Its kind.
    pub kind: ChildKind,
    /// Its name.
    pub name: String,
    /// Its `strata.dev/spec-hash`.
    pub spec_hash: String,
}

impl Children {
    /// Kind, name and spec hash of every child, in apply order.
    pub fn desired(&self) -> Vec<DesiredChild> {
        fn entry<K: Resource>(kind: ChildKind, object: &K) -> DesiredChild {
            let meta = object.meta();
            DesiredChild {
                kind,
                name: meta.name.clone().unwrap_or_default(),
                spec_hash: meta
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_SPEC_HASH))
                    .cloned()
                    .unwrap_or_default(),
            }
        }
        vec![
            entry(ChildKind::ServiceAccount, &self.service_account),
            entry(ChildKind::Role, &self.role),
            entry(ChildKind::RoleBinding, &self.role_binding),
            entry(ChildKind::ConfigMap, &self.config_map),
            entry(ChildKind::Service, &self.service),
            entry(ChildKind::NetworkPolicy, &self.network_policy),
            entry(ChildKind::StatefulSet, &self.stateful_set),
        ]
    }
}

/// Build every child of `agent`.
pub fn build(agent: &Agent, validated: &Validated, settings: &Settings) -> Result<Children> {
    let meta = ChildMeta::new(agent, validated)?;
    Ok(Children {
        service_account: with_spec_hash(rbac::service_account(&meta))?,
        role: with_spec_hash(rbac::role(&meta))?,
        role_binding: with_spec_hash(rbac::role_binding(&meta))?,
        config_map: with_spec_hash(config_map::config_map(&meta, agent, validated)?)?,
        service: with_spec_hash(service::service(&meta))?,
        network_policy: with_spec_hash(network_policy::network_policy(&meta, settings))?,
        stateful_set: with_spec_hash(stateful_set::stateful_set(
            &meta,
            agent,
            settings,
            validated.resolution.policy.compaction.summarizer.credentials_secret_ref.as_ref(),
        )?)?,
    })
}

/// Stamp `object` with the hash of its own content.
fn with_spec_hash<K: Resource + Serialize>(mut object: K) -> Result<K> {
    let what =
        format!("{} {}", std::any::type_name::<K>(), object.meta().name.as_deref().unwrap_or_default());
    let hash = json_sha256(&object, &what)?;
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(ANNOTATION_SPEC_HASH.into(), hash);
    Ok(object)
}
