//! Leader election on a coordination.k8s.io/v1 Lease, against a fake apiserver: create, renew,
//! stand by behind a live holder, take over an expired Lease, lose a race, release on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;

use controller_support::*;
use serde_json::{Value, json};
use strata::controller::leader::{LeaderElector, LeaseSettings, LeaseState};

const LEASE_PATH: &str =
    "/apis/coordination.k8s.io/v1/namespaces/strata-system/leases/strata-controller-leader";

fn lease(holder: Option<&str>, renewed_seconds_ago: i64, transitions: i32) -> Value {
    let renewed =
        k8s_openapi::jiff::Timestamp::from_second(fixed_now().as_second() - renewed_seconds_ago).unwrap();
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "strata-controller-leader", "namespace": OPERATOR_NAMESPACE, "resourceVersion": "41"},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "renewTime": format!("{}", renewed.strftime("%Y-%m-%dT%H:%M:%S%.6fZ")),
                    "leaseTransitions": transitions}})
}

fn elector(existing: Option<Value>, conflict: bool, me: &str) -> (LeaderElector, FakeApiServer) {
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method == "GET" && seen.path == LEASE_PATH {
            return Some(match &existing {
                Some(lease) => (200, lease.clone()),
                None => (404, status_body(404, "NotFound")),
            });
        }
        (conflict && seen.method == "PUT").then(|| (409, status_body(409, "Conflict")))
    }));
    let settings = LeaseSettings::new(OPERATOR_NAMESPACE, "strata-controller-leader", me);
    (LeaderElector::new(client, settings, Arc::new(fixed_now)), server)
}

#[tokio::test]
async fn the_first_replica_creates_the_lease_and_leads() {
    let (elector, server) = elector(None, false, "strata-a");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Leading);
    let writes = server.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].method, "POST");
    assert_eq!(writes[0].body["spec"]["holderIdentity"], "strata-a");
    assert_eq!(writes[0].body["spec"]["leaseDurationSeconds"], 15);
}

#[tokio::test]
async fn a_standby_waits_while_the_holder_renews() {
    let (elector, server) = elector(Some(lease(Some("strata-a"), 4, 0)), false, "strata-b");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Following("strata-a".into()));
    assert!(server.writes().is_empty(), "a standby never writes a live Lease");
}

#[tokio::test]
async fn a_standby_takes_over_an_expired_lease_with_a_checked_replace() {
    let (elector, server) = elector(Some(lease(Some("strata-a"), 16, 3)), false, "strata-b");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Leading);
    let writes = server.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!((writes[0].method.as_str(), writes[0].path.as_str()), ("PUT", LEASE_PATH));
    let body = &writes[0].body;
    assert_eq!(body["spec"]["holderIdentity"], "strata-b");
    assert_eq!(body["spec"]["leaseTransitions"], 4);
    assert_eq!(
        body["metadata"]["resourceVersion"], "41",
        "the replace is optimistic: a racing writer gets a 409"
    );
}

#[tokio::test]
async fn losing_the_takeover_race_means_following() {
    let (elector, _server) = elector(Some(lease(Some("strata-a"), 30, 0)), true, "strata-b");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Following("strata-a".into()));
}

#[tokio::test]
async fn the_holder_renews_and_releases_on_shutdown() {
    let (elector, server) = elector(Some(lease(Some("strata-a"), 5, 2)), false, "strata-a");
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Leading);
    let renew = &server.writes()[0].body;
    assert_eq!(renew["spec"]["holderIdentity"], "strata-a");
    assert_eq!(renew["spec"]["leaseTransitions"], 2, "a renewal is not a transition");
    assert!(renew["spec"]["renewTime"].as_str().unwrap().starts_with("2025-10-09T"));
    server.clear();
    elector.release().await.unwrap();
    let release = &server.writes()[0].body;
    assert!(release["spec"].get("holderIdentity").is_none_or(Value::is_null), "{release}");
}
