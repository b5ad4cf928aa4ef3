//! Leader election on a coordination.k8s.io/v1 Lease, against a fake apiserver: create, renew,
//! stand by behind a live holder, take over a Lease only after watching it unrenewed, lose a race,
//! stop at the renew deadline, time out a hung call, release on shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;
use std::time::Duration;

use controller_support::*;
use serde_json::{Value, json};
use strata::controller::leader::{LeaderElector, Leadership, LeaseSettings, LeaseState};

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
    elector_with(existing, conflict, LeaseSettings::new(OPERATOR_NAMESPACE, "strata-controller-leader", me)).0
}

fn elector_with(
    existing: Option<Value>,
    conflict: bool,
    settings: LeaseSettings,
) -> ((LeaderElector, FakeApiServer), Leadership) {
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method == "GET" && seen.path == LEASE_PATH {
            return Some(match &existing {
                Some(lease) => (200, lease.clone()),
                None => (404, status_body(404, "NotFound")),
            });
        }
        (conflict && seen.method == "PUT").then(|| (409, status_body(409, "Conflict")))
    }));
    let leadership = Leadership::elected();
    ((LeaderElector::new(client, settings, Arc::new(fixed_now), leadership.clone()), server), leadership)
}

fn quick(me: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_millis(300),
        renew_deadline: Duration::from_millis(200),
        ..LeaseSettings::new(OPERATOR_NAMESPACE, "strata-controller-leader", me)
    }
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
async fn a_standby_takes_over_only_after_watching_the_lease_unrenewed_for_its_duration() {
    // renewTime is an hour old by this replica's wall clock; clocks skew, so that alone proves nothing.
    let ((elector, server), leadership) =
        elector_with(Some(lease(Some("strata-a"), 3600, 3)), false, quick("strata-b"));
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Following("strata-a".into()));
    assert!(server.writes().is_empty(), "the first sight of a record starts the standby's own timer");
    assert!(!leadership.is_leading());
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Leading);
    assert!(leadership.is_leading());
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
    let ((elector, _server), leadership) =
        elector_with(Some(lease(Some("strata-a"), 30, 0)), true, quick("strata-b"));
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Following("strata-a".into()));
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Following("strata-a".into()));
    assert!(!leadership.is_leading());
}

#[tokio::test]
async fn the_holder_stops_leading_at_its_renew_deadline_when_renewals_fail() {
    let ((elector, _server), leadership) = elector_with(None, false, quick("strata-a"));
    assert_eq!(elector.try_acquire_or_renew().await.unwrap(), LeaseState::Leading);
    assert!(leadership.is_leading());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(!leadership.is_leading(), "past the renew deadline, writes stop even before the loop notices");
}

#[tokio::test]
async fn a_renewal_that_hangs_times_out() {
    // An apiserver that accepts the connection and never answers.
    let (service, _never_answered) =
        tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let client = kube::Client::new(service, "default");
    let settings = LeaseSettings { call_timeout: Duration::from_millis(100), ..quick("strata-a") };
    let elector = LeaderElector::new(client, settings, Arc::new(fixed_now), Leadership::elected());
    let error = elector.try_acquire_or_renew().await.unwrap_err();
    assert!(error.to_string().contains("no answer within 100ms"), "{error}");
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
