//! GitOps safety: reconciling the whole seed-003 fleet never writes an Agent's spec. Every write to a
//! strata.dev object goes to its status subresource with the controller's own field manager, so
//! `kubectl diff` and Argo CD see only what the user applied.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use controller_support::*;
use strata::controller::agent::reconcile_agent;

#[tokio::test]
async fn reconciling_the_fleet_writes_status_only_never_spec() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    for agent in fleet() {
        reconcile_agent(&agent, &ctx).await.unwrap();
    }
    let strata_writes: Vec<_> =
        server.writes().into_iter().filter(|w| w.path.starts_with("/apis/strata.dev/")).collect();
    assert_eq!(strata_writes.len(), fleet().len(), "one status write per agent: {strata_writes:?}");
    for write in strata_writes {
        assert_eq!(write.method, "PATCH", "{} {}", write.method, write.path);
        assert!(write.path.ends_with("/status"), "a write outside the status subresource: {}", write.path);
        assert!(write.query.contains("fieldManager=strata.dev%2Fcontroller"), "{}", write.query);
        let body = write.body.as_object().unwrap();
        assert!(!body.contains_key("spec"), "the status apply carries a spec: {}", write.path);
        let keys: Vec<&str> = body.keys().map(String::as_str).collect();
        assert!(keys.iter().all(|k| ["apiVersion", "kind", "metadata", "status"].contains(k)), "{keys:?}");
    }
    // Children are applied with the same field manager and never touch the user's objects.
    for write in server
        .writes()
        .into_iter()
        .filter(|w| w.method == "PATCH" && !w.path.starts_with("/apis/strata.dev/"))
    {
        assert!(
            write.query.contains("fieldManager=strata.dev%2Fcontroller"),
            "{} {}",
            write.path,
            write.query
        );
    }
}
