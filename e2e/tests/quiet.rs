//! A settled fleet costs no writes: over a window longer than the controller's resync interval
//! (e2e/control-plane.sh runs it with --resync-seconds 45), every Agent is reconciled again and the
//! controller sends no write to the apiserver. Its own request counter is the witness.
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use strata_e2e::{client, controller_metrics, controller_writes, eventually, fleet_namespace, metric_sum};

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_settled_agent_costs_no_writes_across_a_resync() {
    let client = client().await.unwrap();
    let (namespace, agents) = fleet_namespace(&client, "quiet").await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace.name);
    eventually("the StatefulSet", Duration::from_secs(60), || async {
        sets.get_opt("builder").await.ok().flatten()
    })
    .await;
    eventually("status.prefix", Duration::from_secs(60), || async {
        agents.get("builder").await.ok()?.status?.prefix
    })
    .await;
    // Let the trailing watch events of the first apply arrive.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let reconciles =
        |text: &str| metric_sum(text, "strata_controller_reconciles_total", "controller=\"agent\"");
    let before_writes = controller_writes().await;
    let before_reconciles = reconciles(&controller_metrics().await);
    let version = sets.get("builder").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(50)).await;
    let after_reconciles = reconciles(&controller_metrics().await);
    let writes = controller_writes().await - before_writes;
    assert!(
        after_reconciles > before_reconciles,
        "the window covered a resync ({before_reconciles} -> {after_reconciles})"
    );
    assert_eq!(writes, 0.0, "a settled fleet made {writes} writes over a resync");
    assert_eq!(sets.get("builder").await.unwrap().metadata.resource_version, version);
    namespace.delete().await.unwrap();
}
