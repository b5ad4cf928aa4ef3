//! The ContextPolicy kind: a tenant's context rules for the agents in its namespace.
// Each `printcolumn(...)` repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::policy::PolicySpec;

/// A namespace's context policy. Agents use it through `contextPolicyRef`, or by its name `default`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "ContextPolicy",
    doc = "A namespace's context rules for its agents: budget, tool-result spill and elision, retention, compaction, caching.",
    namespaced,
    status = "PolicyStatus",
    shortname = "ctxp",
    category = "strata",
    cel,
    printcolumn(name = "Agents", type_ = "integer", json_path = ".status.agentCount"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ContextPolicySpec {
    /// The policy fields this tenant sets.
    #[serde(flatten)]
    pub policy: PolicySpec,
}

/// Observed state of a ContextPolicy or ClusterContextPolicy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// Agents whose effective policy uses this object.
    #[serde(default)]
    pub agent_count: u32,
    /// Problems found while applying it, e.g. a lock on a field the policy does not set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
