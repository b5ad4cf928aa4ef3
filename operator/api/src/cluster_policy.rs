//! The ClusterContextPolicy kind: fleet-wide context rules with platform locks and bounds.
// Each `printcolumn(...)` repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::context_policy::PolicyStatus;
use crate::fields::{NumericField, PolicyField};
use crate::policy::PolicySpec;

/// Fleet-wide defaults for the namespaces it selects, with fields that tenants may tighten but never loosen.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "strata.dev",
    version = "v1alpha1",
    kind = "ClusterContextPolicy",
    doc = "Fleet-wide context rules for selected namespaces, with platform locks and bounds tenants cannot loosen.",
    status = "PolicyStatus",
    shortname = "cctxp",
    category = "strata",
    cel,
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "Agents", type_ = "integer", json_path = ".status.agentCount"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.locks) || !has(self.bounds) || self.bounds.all(b, !(b.field in self.locks))")
    .message("a field cannot be both locked and bounded: a lock already fixes its value; remove it from locks or from bounds"))]
pub struct ClusterContextPolicySpec {
    /// Namespaces this policy applies to; an empty selector selects every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Order among matching cluster policies: higher priority applies later and wins. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub priority: Option<u32>,
    /// The policy fields this fleet policy sets.
    #[serde(flatten)]
    pub policy: PolicySpec,
    /// Fields fixed to this policy's value: tenants and agents cannot change them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub locks: Option<Vec<PolicyField>>,
    /// Numeric ranges that tenant and agent values are clamped into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub bounds: Option<Vec<FieldBound>>,
}

/// An allowed range for one numeric policy field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.min) || has(self.max)")
        .message("a bound needs min, max or both"),
    validation = Rule::new("!has(self.min) || !has(self.max) || self.min <= self.max")
        .message("a bound's min must not exceed its max"),
)]
pub struct FieldBound {
    /// The bounded field.
    pub field: NumericField,
    /// Lowest allowed value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    /// Highest allowed value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}
