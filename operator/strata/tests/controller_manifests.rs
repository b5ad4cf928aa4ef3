//! The install manifests: config/default renders (when kubectl is on PATH) to the namespace, the
//! CRDs, least-privilege RBAC and a restricted Deployment with probes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::process::Command;

use controller_support::repo_root;
use serde_json::Value;

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn file(path: &str) -> Vec<Value> {
    yaml_documents(&std::fs::read_to_string(repo_root().join(path)).unwrap())
}

fn rules(role: &Value) -> Vec<Value> {
    role["rules"].as_array().unwrap().clone()
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

#[test]
fn no_cluster_wide_secret_access_and_secrets_only_by_name_in_the_operator_namespace() {
    let cluster_role = file("config/rbac/cluster_role.yaml").remove(0);
    for rule in rules(&cluster_role) {
        assert!(!strings(&rule["resources"]).iter().any(|r| r == "secrets" || r == "*"), "{rule}");
        assert!(
            !strings(&rule["verbs"]).iter().any(|v| v == "*" || v == "escalate" || v == "bind"),
            "{rule}"
        );
    }
    let role = file("config/rbac/role.yaml").remove(0);
    let secret_rules: Vec<Value> = rules(&role)
        .into_iter()
        .filter(|r| strings(&r["resources"]).contains(&"secrets".to_string()))
        .collect();
    for rule in &secret_rules {
        let verbs = strings(&rule["verbs"]);
        if verbs.contains(&"get".to_string()) {
            assert_eq!(strings(&rule["resourceNames"]), ["strata-cache-master-key"]);
        }
        assert!(!verbs.contains(&"list".to_string()) && !verbs.contains(&"watch".to_string()));
    }
}

#[test]
fn every_cluster_role_rule_is_justified_by_a_comment() {
    let text = std::fs::read_to_string(repo_root().join("config/rbac/cluster_role.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("- apiGroups:") {
            assert!(lines[i - 1].trim_start().starts_with('#'), "rule at line {} has no comment", i + 1);
        }
    }
}

#[test]
fn config_default_renders_the_whole_install() {
    let Ok(output) =
        Command::new("kubectl").arg("kustomize").arg(repo_root().join("config/default")).output()
    else {
        eprintln!("kubectl is not on PATH; skipping the render (the static checks above still ran)");
        return;
    };
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let docs = yaml_documents(&String::from_utf8(output.stdout).unwrap());
    let mut kinds: Vec<String> = docs.iter().map(|d| d["kind"].as_str().unwrap().to_string()).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap();
        if !matches!(kind, "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition" | "Namespace") {
            assert_eq!(doc["metadata"]["namespace"], "strata-system", "{kind}");
        }
    }
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    let container = &pod["containers"][0];
    assert_eq!(container["args"][0], "controller");
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let namespace = docs.iter().find(|d| d["kind"] == "Namespace").unwrap();
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
    let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").unwrap();
    assert_eq!(binding["subjects"][0]["namespace"], "strata-system");
}
