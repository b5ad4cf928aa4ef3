//! The controller survives a restart of the control plane (etcd, kube-apiserver and
//! kube-controller-manager stopped and started again on the same data): once the apiserver is back
//! it leads again and reconciles a new Agent. Runs last (cargo runs test files in name order).
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::Api;
use strata_e2e::{client, eventually, fleet_namespace, harness_var};

fn run(script: &str) {
    let plane = harness_var("STRATA_E2E_CONTROL_PLANE");
    let path = std::path::Path::new(&harness_var("STRATA_E2E_K8S")).join(script);
    let status = std::process::Command::new(&path).arg(&plane).status().unwrap();
    assert!(status.success(), "{} {plane} failed", path.display());
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn the_controller_recovers_after_the_control_plane_restarts() {
    run("down");
    tokio::time::sleep(Duration::from_secs(3)).await;
    run("up");
    let client = client().await.unwrap();
    let (namespace, agents) =
        eventually("the apiserver to accept writes again", Duration::from_secs(60), || async {
            fleet_namespace(&client, "restart").await.ok()
        })
        .await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace.name);
    eventually("the new Agent's StatefulSet after the restart", Duration::from_secs(120), || async {
        sets.get_opt("builder").await.ok().flatten()
    })
    .await;
    eventually("its status", Duration::from_secs(60), || async {
        agents.get("builder").await.ok()?.status?.prefix
    })
    .await;
    namespace.delete().await.unwrap();
}
