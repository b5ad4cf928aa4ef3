//! The foundation against a real apiserver: the CRDs install without warnings, a sample Agent is
//! accepted, and every manifest in config/samples/invalid is rejected by the apiserver itself with
//! the message its header names (`# apiserver:` where the apiserver words it differently from the
//! offline validator's `# expect:`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use std::path::PathBuf;
use strata_e2e::{TempNamespace, client, install_crds, load_documents, repo_root, samples_dir};

fn api_for(client: &kube::Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(strata_api::GROUP, strata_api::VERSION, kind);
    let resource = ApiResource::from_gvk(&gvk);
    if kind == "ClusterContextPolicy" {
        Api::all_with(client.clone(), &resource)
    } else {
        Api::namespaced_with(client.clone(), namespace, &resource)
    }
}

async fn create(client: &kube::Client, namespace: &str, doc: &Value) -> Result<DynamicObject, kube::Error> {
    let object: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    let kind = doc["kind"].as_str().unwrap();
    api_for(client, namespace, kind).create(&PostParams::default(), &object).await
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn sample_agent_is_accepted() {
    let client = client().await.unwrap();
    install_crds(&client).await.unwrap();
    let namespace =
        TempNamespace::create(&client, "accept", &[("strata.dev/fleet", "always-on")]).await.unwrap();
    for doc in load_documents(&samples_dir().join("strata_v1alpha1_agent.yaml")).unwrap() {
        let created = create(&client, &namespace.name, &doc).await;
        assert!(created.is_ok(), "sample Agent rejected: {created:?}");
    }
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn invalid_agent_is_rejected_by_apiserver_cel() {
    let client = client().await.unwrap();
    install_crds(&client).await.unwrap();
    let namespace = TempNamespace::create(&client, "reject", &[]).await.unwrap();
    let invalid = samples_dir().join("invalid/agent-compatible-without-endpoint.yaml");
    let doc = load_documents(&invalid).unwrap().remove(0);
    match create(&client, &namespace.name, &doc).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("model.endpoint is required when model.provider is OpenAICompatible"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 422 from CEL, got {other:?}"),
    }
    namespace.delete().await.unwrap();
}

fn header(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| line.strip_prefix(&format!("# {key}: "))).map(|s| s.trim().to_string())
}

/// `kubectl <args> -f <file>` in `namespace`, as a user would run it; returns (success, stderr).
fn kubectl(namespace: &str, args: &[&str], file: &std::path::Path) -> (bool, String) {
    let output = std::process::Command::new("kubectl")
        .args(["--namespace", namespace])
        .args(args)
        .arg("-f")
        .arg(file)
        .env("KUBECONFIG", std::env::var("STRATA_E2E_KUBECONFIG").unwrap())
        .output()
        .unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn every_invalid_sample_is_refused_with_the_apiservers_own_message() {
    let client = client().await.unwrap();
    install_crds(&client).await.unwrap();
    let dir = samples_dir().join("invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    assert_eq!(files.len(), 23, "the full set of invalid samples");
    let namespace = TempNamespace::create(&client, "invalid", &[]).await.unwrap();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let expected = header(&text, "apiserver").or_else(|| header(&text, "expect")).unwrap();
        let (accepted, stderr) = match header(&text, "update-of") {
            Some(base) => {
                let (created, error) = kubectl(&namespace.name, &["apply"], &dir.join(&base));
                assert!(created, "{base}: {error}");
                kubectl(&namespace.name, &["apply"], path)
            }
            None => kubectl(&namespace.name, &["create"], path),
        };
        assert!(!accepted, "{} was accepted", path.display());
        assert!(
            stderr.contains(&expected),
            "{}: the apiserver said\n  {stderr}\nwhich does not contain\n  {expected}",
            path.display()
        );
    }
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn the_crds_apply_without_apiserver_warnings() {
    let kubeconfig = std::env::var("STRATA_E2E_KUBECONFIG").unwrap();
    for (dir, flag) in [("crds", "-k"), ("charts/strata/crds", "-f")] {
        let output = std::process::Command::new("kubectl")
            .args(["apply", "--server-side", "--force-conflicts", "--dry-run=server", flag])
            .arg(repo_root().join(dir))
            .args(["--field-manager", "strata-e2e-warnings"])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let warnings: Vec<&str> = stderr.lines().filter(|l| l.to_lowercase().contains("warning")).collect();
        assert!(warnings.is_empty(), "{dir}: the apiserver warned: {warnings:?}");
        assert_eq!(stdout.matches("serverside-applied").count(), 4, "{dir}: {stdout}{stderr}");
    }
}
