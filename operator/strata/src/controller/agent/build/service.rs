//! The headless metrics Service; it is also the StatefulSet's governing Service.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::metadata::ChildMeta;
use super::stateful_set::METRICS_PORT;

/// The metrics Service.
pub fn service(meta: &ChildMeta) -> Service {
    Service {
        metadata: meta.object_meta(&meta.agent),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(meta.selector.clone()),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: METRICS_PORT,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}
