//! The foundation against a real apiserver: the CRDs install, a sample Agent is accepted, and
//! invalid manifests are rejected by the apiserver's own CEL with our messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kube::Api;
use kube::api::{DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::Value;
use strata_e2e::{TempNamespace, client, install_crds, load_documents, samples_dir};

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
