//! The operator against a real control plane, with `strata controller` running as its own
//! ServiceAccount (see e2e/control-plane.sh): children and their fields, drift repaired on the
//! watch event, garbage collection (the journal claim: tests/safety.rs), a policy edit vs.
//! a model change, the epoch bump, a policy with a broken regex refused, and the leader Lease.
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use strata_api::{Agent, ContextPolicy};
use strata_e2e::{client, eventually, fleet_namespace};

const MINUTE: Duration = Duration::from_secs(60);

async fn settled(client: &Client, namespace: &str, agents: &Api<Agent>) -> StatefulSet {
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
    let set =
        eventually("the StatefulSet", MINUTE, || async { sets.get_opt("builder").await.ok().flatten() })
            .await;
    eventually("status.prefix", MINUTE, || async { agents.get("builder").await.ok()?.status?.prefix }).await;
    set
}

fn gateway_json(map: &ConfigMap) -> String {
    map.data.as_ref().and_then(|d| d.get("gateway.json")).cloned().unwrap_or_default()
}

fn editor() -> PatchParams {
    PatchParams { field_manager: Some("e2e-editor".into()), ..PatchParams::default() }
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn an_agent_gets_its_children_owned_and_applied_by_strata() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "children").await.unwrap();
    let ns = &namespace.name;
    let set = settled(&client, ns, &agents).await;
    let agent = agents.get("builder").await.unwrap();
    let owned_by_agent = |meta: &kube::api::ObjectMeta, what: &str| {
        let owner = meta
            .owner_references
            .as_ref()
            .and_then(|o| o.first())
            .unwrap_or_else(|| panic!("{what}: no owner"));
        assert_eq!((owner.kind.as_str(), owner.controller), ("Agent", Some(true)), "{what}");
        assert_eq!(Some(&owner.uid), agent.metadata.uid.as_ref(), "{what}");
        let managers: Vec<_> =
            meta.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
        assert!(
            managers.iter().any(|m| m == "strata.dev/controller"),
            "{what} is server-side applied: {managers:?}"
        );
    };
    owned_by_agent(&set.metadata, "StatefulSet");
    let pod = set.spec.as_ref().unwrap().template.spec.clone().unwrap();
    assert_eq!(
        pod.init_containers.unwrap()[0].restart_policy.as_deref(),
        Some("Always"),
        "the gateway is a native sidecar"
    );
    assert_eq!(pod.service_account_name.as_deref(), Some("builder"));

    let role = Api::<Role>::namespaced(client.clone(), ns).get("builder").await.unwrap();
    owned_by_agent(&role.metadata, "Role");
    let rule = &role.rules.unwrap()[0];
    assert_eq!(
        (rule.verbs.clone(), rule.resources.clone()),
        (vec!["patch".to_string()], Some(vec!["agents/status".to_string()]))
    );
    assert_eq!(
        rule.resource_names,
        Some(vec!["builder".to_string()]),
        "the gateway may patch only its own Agent"
    );
    let binding = Api::<RoleBinding>::namespaced(client.clone(), ns).get("builder").await.unwrap();
    owned_by_agent(&binding.metadata, "RoleBinding");
    assert_eq!(binding.subjects.unwrap()[0].name, "builder");
    let account = Api::<ServiceAccount>::namespaced(client.clone(), ns).get("builder").await.unwrap();
    owned_by_agent(&account.metadata, "ServiceAccount");
    let config = Api::<ConfigMap>::namespaced(client.clone(), ns).get("builder-gateway").await.unwrap();
    owned_by_agent(&config.metadata, "ConfigMap");
    let gateway: Value = serde_json::from_str(&gateway_json(&config)).unwrap();
    assert_eq!(gateway["agent"]["name"], "builder");
    assert_eq!(
        gateway["policy"]["compaction"]["triggerPercent"], 80,
        "the Agent's override is in the config"
    );
    let service = Api::<Service>::namespaced(client.clone(), ns).get("builder").await.unwrap();
    owned_by_agent(&service.metadata, "Service");
    let policy = Api::<NetworkPolicy>::namespaced(client.clone(), ns).get("builder").await.unwrap();
    owned_by_agent(&policy.metadata, "NetworkPolicy");
    assert_eq!(
        policy.spec.unwrap().ingress.unwrap().len(),
        2,
        "own namespace, plus metrics from strata-system"
    );

    let status = agent.status.unwrap();
    assert_eq!(status.prefix.unwrap().cache_key.len(), 16);
    let resolved = status.conditions.iter().find(|c| c.type_ == "PolicyResolved").unwrap();
    assert_eq!(resolved.status, "True");
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn edits_to_fields_strata_sets_are_reverted_within_seconds() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "drift").await.unwrap();
    let ns = &namespace.name;
    settled(&client, ns, &agents).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    let good_config = gateway_json(&maps.get("builder-gateway").await.unwrap());

    // Four edits the operator must undo, each the way a person would make it (an Update by another manager).
    policies.patch("builder", &editor(), &Patch::Merge(json!({"spec": {"ingress": [{}]}}))).await.unwrap();
    sets.patch(
        "builder",
        &editor(),
        &Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/name": "edited"}}})),
    )
    .await
    .unwrap();
    maps.patch("builder-gateway", &editor(), &Patch::Merge(json!({"data": {"gateway.json": "{}"}})))
        .await
        .unwrap();
    let widened = json!({"rules": [{"apiGroups": ["strata.dev"], "resources": ["agents/status"],
                                    "resourceNames": ["builder"], "verbs": ["get", "update", "delete"]}]});
    roles.patch("builder", &editor(), &Patch::Merge(widened)).await.unwrap();
    // And one the operator must leave alone: a label Strata does not set.
    sets.patch("builder", &editor(), &Patch::Merge(json!({"metadata": {"labels": {"team": "payments"}}})))
        .await
        .unwrap();

    let within = Duration::from_secs(10);
    eventually("the NetworkPolicy's ingress restored", within, || async {
        (policies.get("builder").await.ok()?.spec?.ingress?.len() == 2).then_some(())
    })
    .await;
    eventually("the StatefulSet's label restored", within, || async {
        let labels = sets.get("builder").await.ok()?.metadata.labels?;
        (labels.get("app.kubernetes.io/name").map(String::as_str) == Some("strata-agent")).then_some(())
    })
    .await;
    eventually("gateway.json restored", within, || async {
        (gateway_json(&maps.get("builder-gateway").await.ok()?) == good_config).then_some(())
    })
    .await;
    eventually("the Role's verbs restored", within, || async {
        (roles.get("builder").await.ok()?.rules?[0].verbs == ["patch"]).then_some(())
    })
    .await;
    let labels = sets.get("builder").await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels.get("team").map(String::as_str), Some("payments"), "a field Strata does not own stays");
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn deleting_an_agent_collects_its_children() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "gc").await.unwrap();
    let ns = &namespace.name;
    settled(&client, ns, &agents).await;
    agents.delete("builder", &DeleteParams::background()).await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    eventually("the garbage collector to delete the children", MINUTE, || async {
        let gone = sets.get_opt("builder").await.ok()?.is_none()
            && maps.get_opt("builder-gateway").await.ok()?.is_none()
            && roles.get_opt("builder").await.ok()?.is_none();
        gone.then_some(())
    })
    .await;
    namespace.delete().await.unwrap();
}

fn template_of(set: &StatefulSet) -> Value {
    serde_json::to_value(&set.spec.as_ref().unwrap().template).unwrap()
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_policy_edit_reaches_the_gateway_without_a_pod_roll_and_a_model_change_rolls_it() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "roll").await.unwrap();
    let ns = &namespace.name;
    let before = template_of(&settled(&client, ns, &agents).await);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);

    let policy_edit = json!({"spec": {"overrides": {"compaction": {"triggerPercent": 75}}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(policy_edit)).await.unwrap();
    eventually("gateway.json with the new trigger", MINUTE, || async {
        let config: Value =
            serde_json::from_str(&gateway_json(&maps.get("builder-gateway").await.ok()?)).ok()?;
        (config["policy"]["compaction"]["triggerPercent"] == 75).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        template_of(&sets.get("builder").await.unwrap()),
        before,
        "a policy edit is hot-reloaded, the pod stays"
    );

    let model_change = json!({"spec": {"model": {"name": "claude-opus-4-20250514"}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(model_change)).await.unwrap();
    eventually("a new pod template", MINUTE, || async {
        (template_of(&sets.get("builder").await.ok()?) != before).then_some(())
    })
    .await;
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn an_epoch_bump_gives_a_new_cache_key_and_rolls_the_pod() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "epoch").await.unwrap();
    let ns = &namespace.name;
    let set = settled(&client, ns, &agents).await;
    let key = agents.get("builder").await.unwrap().status.unwrap().prefix.unwrap().cache_key;
    let label = |set: &StatefulSet| {
        set.spec.as_ref()?.template.metadata.as_ref()?.labels.as_ref()?.get("strata.dev/prefix-key").cloned()
    };
    let prefix_label = label(&set).unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let bump = json!({"metadata": {"annotations": {"strata.dev/cache-epoch": "7"}}});
    namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(bump)).await.unwrap();
    let new_key = eventually("a new cache key", MINUTE, || async {
        let prefix = agents.get("builder").await.ok()?.status?.prefix?;
        (prefix.cache_key != key).then_some(prefix.cache_key)
    })
    .await;
    assert_eq!(new_key.len(), 16);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    eventually(
        "the pod template's prefix-key label to follow (every pod of the tenant rolls)",
        MINUTE,
        || async {
            let now = label(&sets.get("builder").await.ok()?)?;
            (now != prefix_label).then_some(())
        },
    )
    .await;
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_policy_whose_regex_cannot_compile_is_refused_and_the_last_good_config_stays() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "regex").await.unwrap();
    let ns = &namespace.name;
    settled(&client, ns, &agents).await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let good_config = gateway_json(&maps.get("builder-gateway").await.unwrap());
    let policy: ContextPolicy = serde_json::from_value(json!({
        "apiVersion": "strata.dev/v1alpha1", "kind": "ContextPolicy",
        "metadata": {"name": "default"},
        "spec": {"retention": {"rules": [{"name": "heartbeats", "class": "Ephemeral", "ttlSeconds": 60,
                                          "match": {"contentRegex": "(unclosed"}}]}}
    }))
    .unwrap();
    Api::<ContextPolicy>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    let condition = eventually("PolicyResolved=False", MINUTE, || async {
        let status = agents.get("builder").await.ok()?.status?;
        status.conditions.into_iter().find(|c| c.type_ == "PolicyResolved" && c.status == "False")
    })
    .await;
    assert_eq!(condition.reason, "InvalidRetentionRule");
    assert!(condition.message.contains("\"(unclosed\""), "names the pattern: {}", condition.message);
    assert!(condition.message.contains("unclosed group"), "and the regex error: {}", condition.message);
    assert_eq!(
        gateway_json(&maps.get("builder-gateway").await.unwrap()),
        good_config,
        "the sidecar keeps its last good config"
    );
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_missing_config_map_is_a_condition() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "missing").await.unwrap();
    let patch = json!({"spec": {"stablePrefix": {"systemPrompt": {"configMapKeyRef": {"name": "nope", "key": "system.md"}}}}});
    agents.patch("builder", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    let reason = eventually("ReferencesResolved=False", MINUTE, || async {
        let status = agents.get("builder").await.ok()?.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "ReferencesResolved")?;
        (condition.status == "False").then_some(condition.reason)
    })
    .await;
    assert_eq!(reason, "ConfigMapNotFound");
    namespace.delete().await.unwrap();
}

/// `spec.model.egress`: an authorities ConfigMap that does not exist is a condition naming the
/// field; once it exists (here a copy of the cluster's own root authority), the sidecar mounts it
/// and the proxy's Secret, with the variables naming both files.
#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn egress_settings_reach_the_sidecar_once_their_authorities_exist() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "egress").await.unwrap();
    let ns = &namespace.name;
    settled(&client, ns, &agents).await;
    let egress = json!({"spec": {"model": {"egress": {
        "proxySecretRef": {"name": "egress-proxy", "key": "url"},
        "noProxy": [".svc.cluster.local"],
        "trustedCAConfigMapRef": {"name": "corporate-ca", "key": "ca.pem"},
    }}}});
    agents.patch("builder", &editor(), &Patch::Merge(egress)).await.unwrap();
    let message = eventually("ReferencesResolved=False", MINUTE, || async {
        let status = agents.get("builder").await.ok()?.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "ReferencesResolved")?;
        (condition.status == "False" && condition.reason == "ConfigMapNotFound").then_some(condition.message)
    })
    .await;
    assert!(message.contains("spec.model.egress.trustedCAConfigMapRef"), "{message}");

    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let root = eventually("kube-root-ca.crt", MINUTE, || async {
        maps.get_opt("kube-root-ca.crt").await.ok().flatten()
    })
    .await;
    let pem = root.data.unwrap()["ca.crt"].clone();
    let authorities: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "corporate-ca"},
        "data": {"ca.pem": pem},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &authorities).await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pod = eventually("the sidecar with the egress files", MINUTE, || async {
        let set = sets.get("builder").await.ok()?;
        let pod = set.spec?.template.spec?;
        let sidecar = pod.init_containers.as_ref()?.first()?.clone();
        let names: Vec<String> = sidecar.env.iter().flatten().map(|e| e.name.clone()).collect();
        names.contains(&"STRATA_TRUSTED_CA_FILE".to_owned()).then_some(pod)
    })
    .await;
    let sidecar = pod.init_containers.clone().unwrap().remove(0);
    let value = |name: &str| {
        sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
            .unwrap_or_default()
    };
    assert_eq!(value("STRATA_PROXY_URL_FILE"), "/etc/strata/egress-proxy/url");
    assert_eq!(value("NO_PROXY"), ".svc.cluster.local");
    assert_eq!(value("STRATA_TRUSTED_CA_FILE"), "/etc/strata/trusted-ca/ca.pem");
    let volumes = pod.volumes.unwrap();
    let secret = volumes.iter().find(|v| v.name == "egress-proxy").and_then(|v| v.secret.clone()).unwrap();
    assert_eq!(secret.secret_name.as_deref(), Some("egress-proxy"));
    let config_map =
        volumes.iter().find(|v| v.name == "trusted-ca").and_then(|v| v.config_map.clone()).unwrap();
    assert_eq!(config_map.name, "corporate-ca");
    assert!(
        !pod.containers.iter().any(|c| c.env.iter().flatten().any(|e| e.name == "STRATA_PROXY_URL_FILE")),
        "the agent container is left as it is"
    );
    let resolved = eventually("ReferencesResolved=True", MINUTE, || async {
        let status = agents.get("builder").await.ok()?.status?;
        let condition = status.conditions.into_iter().find(|c| c.type_ == "ReferencesResolved")?;
        (condition.status == "True").then_some(condition)
    })
    .await;
    assert_eq!(resolved.status, "True");
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
