//! The operator against a real cluster. These tests expect `strata controller` to be running there,
//! installed with `kubectl apply -k config/default` (image loaded into the cluster). They are
//! ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use strata_api::{Agent, CompactionJob};
use strata_e2e::{TempNamespace, client, install_crds, load_documents, samples_dir};

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn references() -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../operator/strata/tests/golden/fleet-references.yaml");
    load_documents(&path).unwrap()
}

/// A namespace with the fleet's ConfigMaps and the builder Agent.
async fn fleet_namespace(client: &Client, prefix: &str) -> (TempNamespace, Api<Agent>) {
    install_crds(client).await.unwrap();
    let namespace =
        TempNamespace::create(client, prefix, &[("strata.dev/fleet", "always-on")]).await.unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace.name);
    for doc in references().into_iter().filter(|d| d["kind"] == "ConfigMap") {
        let mut map: ConfigMap = serde_json::from_value(doc).unwrap();
        map.metadata.namespace = Some(namespace.name.clone());
        config_maps.create(&PostParams::default(), &map).await.unwrap();
    }
    let agents: Api<Agent> = Api::namespaced(client.clone(), &namespace.name);
    let doc = load_documents(&samples_dir().join("strata_v1alpha1_agent.yaml")).unwrap().remove(0);
    let mut agent: Agent = serde_json::from_value(doc).unwrap();
    agent.spec.context_policy_ref = None;
    agents.create(&PostParams::default(), &agent).await.unwrap();
    (namespace, agents)
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn an_agent_gets_its_children_and_a_cache_identity_then_stays_quiet() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "children").await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace.name);
    let set = eventually("the StatefulSet", Duration::from_secs(60), || async {
        sets.get_opt("builder").await.ok().flatten()
    })
    .await;
    let pod = set.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.init_containers.unwrap()[0].restart_policy.as_deref(), Some("Always"));
    let prefix = eventually("status.prefix", Duration::from_secs(60), || async {
        agents.get("builder").await.ok()?.status?.prefix
    })
    .await;
    assert_eq!(prefix.cache_key.len(), 16);

    let before = sets.get("builder").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        sets.get("builder").await.unwrap().metadata.resource_version,
        before,
        "a settled Agent is not rewritten"
    );
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_missing_config_map_is_a_condition() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "missing").await;
    let patch = json!({"spec": {"stablePrefix": {"systemPrompt": {"configMapKeyRef": {"name": "nope", "key": "system.md"}}}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let reason = eventually("ReferencesResolved=False", Duration::from_secs(60), || async {
        let status = agents.get("builder").await.ok()?.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "ReferencesResolved")?;
        (condition.status == "False").then_some(condition.reason)
    })
    .await;
    assert_eq!(reason, "ConfigMapNotFound");
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_compaction_job_runs_as_a_batch_job() {
    let client = client().await.unwrap();
    let (namespace, _agents) = fleet_namespace(&client, "compact").await;
    let doc = load_documents(&samples_dir().join("strata_v1alpha1_compactionjob.yaml")).unwrap().remove(0);
    let compaction: CompactionJob = serde_json::from_value(doc).unwrap();
    let compactions: Api<CompactionJob> = Api::namespaced(client.clone(), &namespace.name);
    compactions.create(&PostParams::default(), &compaction).await.unwrap();
    let job_name = eventually("status.jobName", Duration::from_secs(60), || async {
        compactions.get("builder-sprint-42-boundary").await.ok()?.status?.job_name
    })
    .await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace.name);
    let job = jobs.get(&job_name).await.unwrap();
    let args = job.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert_eq!(&args[..2], ["compact", "--data-dir"]);
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn one_replica_holds_the_leader_lease() {
    let client = client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "strata-system");
    let lease = eventually("the leader Lease", Duration::from_secs(30), || async {
        leases.get_opt("strata-controller-leader").await.ok().flatten()
    })
    .await;
    let spec = lease.spec.unwrap();
    assert!(spec.holder_identity.is_some_and(|h| !h.is_empty()));
    assert_eq!(spec.lease_duration_seconds, Some(15));
}
