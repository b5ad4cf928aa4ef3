//! The generated CustomResourceDefinitions of every Strata kind, in a fixed order.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{Agent, ClusterContextPolicy, CompactionJob, ContextPolicy};

/// Every CRD, in the order they are written to `crds/`.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![Agent::crd(), ContextPolicy::crd(), ClusterContextPolicy::crd(), CompactionJob::crd()]
}
