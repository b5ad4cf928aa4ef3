//! The operator never harms what is not its own, on a real control plane: orphan cleanup spares a
//! user's look-alike object, deleting a namespace full of Agents is not counted as failures, the
//! journal claim goes with its Agent unless kept (and a new Agent of the same name is a new owner),
//! a summariser that cannot reach its model is reported, and the controller's log file carries no
//! terminal colour codes. (A failed compaction's reason: tests/compaction.rs.)
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use strata_api::Agent;
use strata_e2e::{client, controller_metrics, eventually, fleet_namespace, harness_var, metric_sum};

const MINUTE: Duration = Duration::from_secs(60);

async fn settled(client: &Client, namespace: &str, agents: &Api<Agent>, name: &str) -> Agent {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("StatefulSet {name}"), MINUTE, || async { sets.get_opt(name).await.ok().flatten() })
        .await;
    eventually(&format!("{name}'s status.prefix"), MINUTE, || async {
        let agent = agents.get(name).await.ok()?;
        agent.status.as_ref()?.prefix.as_ref()?;
        Some(agent)
    })
    .await
}

fn labelled_for(agent: &str) -> serde_json::Value {
    json!({"app.kubernetes.io/managed-by": "strata-operator", "strata.dev/agent": agent})
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn orphan_cleanup_deletes_what_the_agent_controls_and_spares_a_users_look_alike() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "lookalike").await.unwrap();
    let ns = &namespace.name;
    let agent = settled(&client, ns, &agents, "builder").await;
    let uid = agent.metadata.uid.clone().unwrap();

    // A user's own Service that carries the agent's labels, with no ownerReference.
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let look_alike: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "builder-dashboard", "labels": labelled_for("builder")},
        "spec": {"ports": [{"port": 8080}]}}))
    .unwrap();
    services.create(&PostParams::default(), &look_alike).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // A stale child the Agent does control (left by an older operator version): it must go.
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let stale: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "builder-gateway-v0", "labels": labelled_for("builder"),
                     "ownerReferences": [{"apiVersion": "strata.dev/v1alpha1", "kind": "Agent", "name": "builder",
                                          "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
        "data": {"gateway.json": "{}"}}))
    .unwrap();
    maps.create(&PostParams::default(), &stale).await.unwrap();
    eventually("the controller to delete its stale ConfigMap", MINUTE, || async {
        maps.get_opt("builder-gateway-v0").await.ok()?.is_none().then_some(())
    })
    .await;
    // Another reconcile for good measure (an annotation on the Agent is a watch event).
    let touch = json!({"metadata": {"annotations": {"e2e/touched": "yes"}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(&touch)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let survivor = services.get_opt("builder-dashboard").await.unwrap();
    assert!(survivor.is_some(), "the user's look-alike Service (no ownerReference) was deleted");
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn deleting_a_namespace_full_of_agents_counts_no_failures() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "teardown").await.unwrap();
    let ns = namespace.name.clone();
    let builder = agents.get("builder").await.unwrap();
    let names: Vec<String> = (1..=12).map(|n| format!("worker-{n}")).collect();
    for name in &names {
        let mut copy = Agent::new(name, builder.spec.clone());
        copy.metadata.namespace = Some(ns.clone());
        agents.create(&PostParams::default(), &copy).await.unwrap();
    }
    for name in &names {
        settled(&client, &ns, &agents, name).await;
    }
    let forbidden =
        |text: &str| metric_sum(text, "strata_controller_reconcile_errors_total", "reason=\"forbidden\"");
    let forbidden_before = forbidden(&controller_metrics().await);
    // Other tests run beside this one and may count errors of their own, so failures of this
    // namespace's reconciles are read from the controller's log (one WARN line each, naming the
    // object), from here on.
    let log_path = harness_var("STRATA_E2E_CONTROLLER_LOG");
    let log_from = std::fs::metadata(&log_path).map(|meta| meta.len()).unwrap_or(0);
    namespace.delete().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    eventually("the namespace to be deleted", Duration::from_secs(180), || async {
        namespaces.get_opt(&ns).await.ok()?.is_none().then_some(())
    })
    .await;
    // Requeues that might still be in flight.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        forbidden(&controller_metrics().await),
        forbidden_before,
        "deleting a namespace with 13 Agents counted reconcile errors with reason=\"forbidden\""
    );
    let log = std::fs::read(&log_path).unwrap();
    let since = String::from_utf8_lossy(log.get(usize::try_from(log_from).unwrap()..).unwrap_or_default());
    let object = format!(".{ns} ");
    let failed: Vec<&str> =
        since.lines().filter(|line| line.contains("reconcile failed") && line.contains(&object)).collect();
    assert!(failed.is_empty(), "deleting a namespace counted reconcile errors:\n{}", failed.join("\n"));
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn the_journal_claim_goes_with_its_agent_unless_kept_and_a_new_agent_is_a_new_owner() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "journal").await.unwrap();
    let ns = &namespace.name;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    settled(&client, ns, &agents, "builder").await;
    let retention =
        sets.get("builder").await.unwrap().spec.unwrap().persistent_volume_claim_retention_policy.unwrap();
    assert_eq!(
        (retention.when_deleted.as_deref(), retention.when_scaled.as_deref()),
        (Some("Delete"), Some("Retain"))
    );
    eventually("the journal claim (made by the StatefulSet controller)", MINUTE, || async {
        claims.get_opt("journal-builder-0").await.ok().flatten()
    })
    .await;
    agents.delete("builder", &DeleteParams::background()).await.unwrap();
    eventually("the journal claim to be deleted with its Agent", MINUTE, || async {
        claims.get_opt("journal-builder-0").await.ok()?.is_none().then_some(())
    })
    .await;

    // Kept on purpose: spec.storage.retainOnDelete.
    let builder = {
        let path = strata_e2e::samples_dir().join("strata_v1alpha1_agent.yaml");
        let doc = strata_e2e::load_documents(&path).unwrap().remove(0);
        let mut agent: Agent = serde_json::from_value(doc).unwrap();
        agent.spec.context_policy_ref = None;
        agent.spec.storage.get_or_insert_default().retain_on_delete = Some(true);
        agent
    };
    agents.create(&PostParams::default(), &builder).await.unwrap();
    let first = settled(&client, ns, &agents, "builder").await;
    eventually("the StatefulSet to retain its claim on delete", MINUTE, || async {
        let set = sets.get_opt("builder").await.ok()??;
        let policy = set.spec?.persistent_volume_claim_retention_policy?;
        (policy.when_deleted.as_deref() == Some("Retain")).then_some(())
    })
    .await;
    eventually("the kept journal claim", MINUTE, || async {
        claims.get_opt("journal-builder-0").await.ok().flatten()
    })
    .await;
    agents.delete("builder", &DeleteParams::background()).await.unwrap();
    eventually("the StatefulSet to be collected", MINUTE, || async {
        sets.get_opt("builder").await.ok()?.is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(claims.get_opt("journal-builder-0").await.unwrap().is_some(), "retainOnDelete keeps the claim");

    // A new Agent of the same name gets the kept claim, but its gateway is told its own UID: the
    // gateway refuses the old journal (tests/gateway_lifecycle.rs) until the annotation adopts it.
    let mut again = builder.clone();
    again.metadata.uid = None;
    again.metadata.resource_version = None;
    agents.create(&PostParams::default(), &again).await.unwrap();
    let second = settled(&client, ns, &agents, "builder").await;
    assert_ne!(first.metadata.uid, second.metadata.uid);
    let identity = |map: ConfigMap| {
        let text = map.data.unwrap().remove("gateway.json").unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["agent"].clone()
    };
    let agent_of_config = eventually("gateway.json naming the new Agent's UID", MINUTE, || async {
        let agent = identity(maps.get("builder-gateway").await.ok()?);
        (agent["uid"].as_str() == second.metadata.uid.as_deref()).then_some(agent)
    })
    .await;
    assert!(agent_of_config.get("adoptJournalFromUid").is_none());
    let old_uid = first.metadata.uid.clone().unwrap();
    let adopt = json!({"metadata": {"annotations": {"strata.dev/adopt-journal-from-uid": old_uid}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(&adopt)).await.unwrap();
    eventually("gateway.json adopting the old journal", MINUTE, || async {
        let agent = identity(maps.get("builder-gateway").await.ok()?);
        (agent["adoptJournalFromUid"].as_str() == Some(old_uid.as_str())).then_some(())
    })
    .await;
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_summariser_that_cannot_reach_its_model_is_reported_until_it_gets_its_own_provider() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "summariser").await.unwrap();
    let ns = &namespace.name;
    // An OpenAI agent beside the Anthropic builder.
    let builder = agents.get("builder").await.unwrap();
    let mut spec = builder.spec.clone();
    spec.model.provider = strata_api::agent::Provider::OpenAI;
    spec.model.name = "gpt-4.1".into();
    spec.model.tokenizer = None;
    spec.model.endpoint = None;
    spec.model.credentials_secret_ref.name = "openai-api".into();
    let mut scout = Agent::new("scout", spec);
    scout.metadata.namespace = Some(ns.clone());
    agents.create(&PostParams::default(), &scout).await.unwrap();
    // The namespace policy names an Anthropic summariser without saying where it lives.
    let policies: Api<strata_api::ContextPolicy> = Api::namespaced(client.clone(), ns);
    let policy: strata_api::ContextPolicy = serde_json::from_value(json!({
        "apiVersion": "strata.dev/v1alpha1", "kind": "ContextPolicy", "metadata": {"name": "default"},
        "spec": {"compaction": {"summarizer": {"model": "claude-3-5-haiku-20241022"}}}}))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.unwrap();
    let summarizer_condition =
        |agent: Agent| agent.status?.conditions.into_iter().find(|c| c.type_ == "SummarizerReady");
    let unavailable = eventually("scout's SummarizerReady=False", MINUTE, || async {
        let condition = summarizer_condition(agents.get("scout").await.ok()?)?;
        (condition.status == "False").then_some(condition)
    })
    .await;
    assert_eq!(unavailable.reason, "SummarizerUnavailable");
    assert!(unavailable.message.contains("claude-3-5-haiku-20241022"), "{}", unavailable.message);
    let builder_ready = eventually("builder's SummarizerReady", MINUTE, || async {
        summarizer_condition(agents.get("builder").await.ok()?)
    })
    .await;
    assert_eq!(builder_ready.status, "True", "an Anthropic model at the Anthropic agent's provider works");
    let scout_phase = agents.get("scout").await.unwrap().status.unwrap().phase;
    assert_ne!(scout_phase, Some(strata_api::agent::AgentPhase::Failed), "the agent itself still runs");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    eventually("a SummarizerUnavailable Warning Event on scout", MINUTE, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items
            .into_iter()
            .find(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("scout")
                    && e.reason.as_deref() == Some("SummarizerUnavailable")
            })
            .map(|_| ())
    })
    .await;

    // The fix the message asks for: the summariser's own provider and key.
    let fix = json!({"spec": {"compaction": {"summarizer": {"provider": "Anthropic",
        "credentialsSecretRef": {"name": "anthropic-api", "key": "api-key"}}}}});
    policies.patch("default", &PatchParams::default(), &Patch::Merge(&fix)).await.unwrap();
    eventually("scout's SummarizerReady=True", MINUTE, || async {
        let condition = summarizer_condition(agents.get("scout").await.ok()?)?;
        (condition.status == "True").then_some(())
    })
    .await;
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn the_controllers_log_file_has_no_colour_codes() {
    let path = harness_var("STRATA_E2E_CONTROLLER_LOG");
    let log = std::fs::read(&path).unwrap();
    assert!(log.windows(7).any(|w| w == b" INFO  " || w.starts_with(b" INFO ")), "no INFO lines in {path}");
    let escapes = log.iter().filter(|b| **b == 0x1b).count();
    assert_eq!(escapes, 0, "{path} holds {escapes} escape bytes (terminal colour codes)");
}
