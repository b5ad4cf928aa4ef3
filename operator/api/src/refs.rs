//! Local (same-namespace) object references: no reference type carries a namespace.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A reference to an object in the referrer's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalRef {
    /// Name of the object, in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// A key inside a Secret or ConfigMap in the referrer's own namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalKeyRef {
    /// Name of the Secret or ConfigMap, in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within it.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}
