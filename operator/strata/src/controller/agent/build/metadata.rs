//! Names, labels and owner references shared by every child of an Agent.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::ObjectMeta;
use strata_api::Agent;

use crate::controller::agent::validate::Validated;
use crate::controller::error::{Error, Result, name_of, namespace_of};
use crate::controller::labels::{
    LABEL_MANAGED_BY, LABEL_MODEL, LABEL_PART_OF, LABEL_PREFIX_KEY, LABEL_TENANT, MANAGED_BY,
    sanitize_label_value, selector_labels,
};

/// `app.kubernetes.io/part-of` when the Agent has none of its own.
pub const DEFAULT_PART_OF: &str = "strata";

/// The identity every child of one Agent shares.
#[derive(Clone, Debug)]
pub struct ChildMeta {
    /// The Agent's name (also the name of most children).
    pub agent: String,
    /// The namespace.
    pub namespace: String,
    /// Labels of every child and of the pod.
    pub labels: BTreeMap<String, String>,
    /// The immutable pod selector.
    pub selector: BTreeMap<String, String>,
    /// The short prefix key.
    pub prefix_key: String,
    /// Controller owner reference to the Agent.
    pub owner: OwnerReference,
}

impl ChildMeta {
    /// The identity of `agent`'s children.
    pub fn new(agent: &Agent, validated: &Validated) -> Result<Self> {
        let name = name_of(&agent.metadata, "Agent")?;
        let namespace = namespace_of(&agent.metadata, "Agent")?;
        let owner = agent
            .controller_owner_ref(&())
            .ok_or(Error::MissingField { kind: "Agent", field: "metadata.uid" })?;
        let part_of = agent
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(LABEL_PART_OF))
            .map(|value| sanitize_label_value(value))
            .unwrap_or_else(|| DEFAULT_PART_OF.to_string());
        let prefix_key = validated.cache_key.short().to_string();
        let mut labels = selector_labels(&name);
        labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        labels.insert(LABEL_PART_OF.into(), part_of);
        labels.insert(LABEL_TENANT.into(), sanitize_label_value(&namespace));
        labels.insert(LABEL_PREFIX_KEY.into(), prefix_key.clone());
        labels.insert(LABEL_MODEL.into(), sanitize_label_value(&agent.spec.model.name));
        Ok(ChildMeta { selector: selector_labels(&name), agent: name, namespace, labels, prefix_key, owner })
    }

    /// Metadata of a child called `name`.
    pub fn object_meta(&self, name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.namespace.clone()),
            labels: Some(self.labels.clone()),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}
