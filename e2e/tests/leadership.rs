//! Leadership on a real control plane: the running controller (replica a) is frozen with SIGSTOP
//! past the lease duration while a second replica (b) stands by; b takes the Lease and does the
//! work; when a resumes it writes nothing (its client refuses writes past the renew deadline) and
//! exits, and the harness's restart loop brings it back as a standby. Finally b is stopped, gives
//! the Lease up, and a leads again.
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use strata_e2e::{client, controller_pid, eventually, fleet_namespace, harness_var, install_crds, signal};

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get_opt("strata-controller-leader").await.ok().flatten()?.spec?.holder_identity
}

fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_frozen_leader_is_replaced_and_writes_nothing_after_it_resumes() {
    let client = client().await.unwrap();
    install_crds(&client).await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "strata-system");
    eventually("replica a to lead", Duration::from_secs(60), || async {
        (holder(&leases).await? == "strata-e2e-a").then_some(())
    })
    .await;

    let log_b = std::env::temp_dir().join(format!("strata-e2e-controller-b-{}.log", std::process::id()));
    let log_file = std::fs::File::create(&log_b).unwrap();
    let metrics: std::net::SocketAddr = harness_var("STRATA_E2E_CONTROLLER_METRICS").parse().unwrap();
    let mut replica_b = tokio::process::Command::new(harness_var("STRATA_E2E_STRATA_BIN"))
        .args([
            "controller",
            "--resync-seconds",
            "45",
            "--gateway-image",
            "strata-e2e/strata:dev",
            "--metrics-listen",
        ])
        .arg(format!("127.0.0.1:{}", metrics.port() + 1))
        .env("KUBECONFIG", harness_var("STRATA_E2E_CONTROLLER_KUBECONFIG"))
        .env("POD_NAME", "strata-e2e-b")
        .env("POD_NAMESPACE", "strata-system")
        .env("RUST_LOG", "info,strata::controller::client=debug")
        .env("NO_COLOR", "1")
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(holder(&leases).await.as_deref(), Some("strata-e2e-a"), "b stands by while a renews");

    let log_a = harness_var("STRATA_E2E_CONTROLLER_LOG");
    let pid_a = controller_pid();
    signal(pid_a, "STOP");
    let frozen_at = std::time::Instant::now();
    eventually("b to take the Lease from the frozen a", Duration::from_secs(60), || async {
        (holder(&leases).await? == "strata-e2e-b").then_some(())
    })
    .await;
    let waited = frozen_at.elapsed();
    assert!(
        waited >= Duration::from_secs(14),
        "b waited the lease duration on its own clock, not {waited:?}"
    );

    // b does the work now.
    let (namespace, _agents) = fleet_namespace(&client, "handoff").await.unwrap();
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &namespace.name);
    eventually("b to create the new Agent's StatefulSet", Duration::from_secs(60), || async {
        sets.get_opt("builder").await.ok().flatten()
    })
    .await;

    // a resumes: everything it logs from now on is after the takeover.
    let resumed_from = std::fs::metadata(&log_a).unwrap().len();
    signal(pid_a, "CONT");
    eventually("the old leader to exit", Duration::from_secs(30), || async { (!alive(pid_a)).then_some(()) })
        .await;
    let log = std::fs::read(&log_a).unwrap();
    let after = String::from_utf8_lossy(&log[usize::try_from(resumed_from).unwrap()..]).to_string();
    let writes: Vec<&str> = after.lines().filter(|l| l.contains("apiserver write")).collect();
    assert!(writes.is_empty(), "the old leader wrote after the takeover:\n{}", writes.join("\n"));
    assert!(after.contains("lost the leader Lease"), "the old leader says why it stopped:\n{after}");

    // b gives the Lease up on SIGTERM; a (restarted by the harness) leads again.
    signal(i32::try_from(replica_b.id().unwrap()).unwrap(), "TERM");
    let exited = tokio::time::timeout(Duration::from_secs(30), replica_b.wait()).await;
    assert!(exited.is_ok(), "b stops on SIGTERM");
    eventually("a to lead again", Duration::from_secs(60), || async {
        (holder(&leases).await? == "strata-e2e-a").then_some(())
    })
    .await;
    let _ = std::fs::remove_file(&log_b);
    namespace.delete().await.unwrap();
}
