//! The gateway's identity: a ServiceAccount, a Role that may only patch this Agent's status, and
//! the RoleBinding between them.

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use super::metadata::ChildMeta;

/// The ServiceAccount. Its token is not automounted: the pod mounts it into the sidecar only.
pub fn service_account(meta: &ChildMeta) -> ServiceAccount {
    ServiceAccount {
        metadata: meta.object_meta(&meta.agent),
        automount_service_account_token: Some(false),
        ..ServiceAccount::default()
    }
}

/// The Role: `patch` on `agents/status`, for this Agent only.
pub fn role(meta: &ChildMeta) -> Role {
    Role {
        metadata: meta.object_meta(&meta.agent),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![strata_api::GROUP.into()]),
            resources: Some(vec!["agents/status".into()]),
            resource_names: Some(vec![meta.agent.clone()]),
            verbs: vec!["patch".into()],
            non_resource_urls: None,
        }]),
    }
}

/// The RoleBinding of the Role to the ServiceAccount.
pub fn role_binding(meta: &ChildMeta) -> RoleBinding {
    RoleBinding {
        metadata: meta.object_meta(&meta.agent),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: meta.agent.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: meta.agent.clone(),
            namespace: Some(meta.namespace.clone()),
            api_group: None,
        }]),
    }
}
