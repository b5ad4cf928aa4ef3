//! The agent's NetworkPolicy: ingress only from its own namespace, plus metrics scrapes from the
//! operator's namespace. Egress is open: the gateway must reach its model provider.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::metadata::ChildMeta;
use super::stateful_set::METRICS_PORT;
use crate::controller::context::Settings;

/// Label every namespace carries with its own name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The NetworkPolicy.
pub fn network_policy(meta: &ChildMeta, settings: &Settings) -> NetworkPolicy {
    let same_namespace = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(LabelSelector::default()),
            ..Default::default()
        }]),
        ports: None,
    };
    let operator_metrics = NetworkPolicyIngressRule {
        from: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(
                    [(NAMESPACE_NAME_LABEL.into(), settings.operator_namespace.clone())].into(),
                ),
                match_expressions: None,
            }),
            ..Default::default()
        }]),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(METRICS_PORT)),
            protocol: Some("TCP".into()),
            end_port: None,
        }]),
    };
    NetworkPolicy {
        metadata: meta.object_meta(&meta.agent),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(meta.selector.clone()),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![same_namespace, operator_metrics]),
            egress: None,
        }),
    }
}
