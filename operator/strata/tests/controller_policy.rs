//! The ContextPolicy and ClusterContextPolicy controllers against a fake apiserver: agent counts,
//! problems, and no write when nothing changed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;

use controller_support::*;
use strata::controller::policy::{cluster_policy, context_policy};
use strata_api::context_policy::PolicyStatus;
use strata_api::policy::RedactionSpec;

#[tokio::test]
async fn the_fleet_policy_counts_every_agent_of_the_selected_namespace() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        seen.path.ends_with("/status").then(|| {
            let mut policy = serde_json::to_value(cluster_policies().remove(0)).unwrap();
            policy["status"] = seen.body["status"].clone();
            (200, policy)
        })
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let policy = Arc::new(cluster_policies().remove(0));
    cluster_policy::reconcile(policy.clone(), ctx.clone()).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].path, "/apis/strata.dev/v1alpha1/clustercontextpolicies/fleet-default/status");
    let status: PolicyStatus = serde_json::from_value(writes[0].body["status"].clone()).unwrap();
    assert_eq!(status.agent_count, 8);
    assert!(status.problems.is_empty(), "{:?}", status.problems);

    let mut reconciled = (*policy).clone();
    reconciled.status = Some(status);
    server.clear();
    cluster_policy::reconcile(Arc::new(reconciled), ctx).await.unwrap();
    assert!(server.writes().is_empty(), "an unchanged count is not rewritten");
}

#[tokio::test]
async fn the_namespace_policy_counts_its_users_and_reports_locked_fields() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        seen.path.ends_with("/status").then(|| {
            let mut policy = serde_json::to_value(context_policies().remove(0)).unwrap();
            policy["status"] = seen.body["status"].clone();
            (200, policy)
        })
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let mut policy = context_policies().remove(0);
    policy.spec.policy.redaction = Some(RedactionSpec { enabled: Some(false), extra_patterns: None });
    context_policy::reconcile(Arc::new(policy), ctx).await.unwrap();
    let write = &server.writes()[0];
    assert_eq!(write.path, "/apis/strata.dev/v1alpha1/namespaces/rateright/contextpolicies/default/status");
    let status: PolicyStatus = serde_json::from_value(write.body["status"].clone()).unwrap();
    assert_eq!(status.agent_count, 8, "builder names it, the other seven use it as the default");
    assert_eq!(status.problems.len(), 1);
    assert!(status.problems[0].contains("redaction.enabled is locked by ClusterContextPolicy/fleet-default"));
    assert_eq!(status.conditions[0].reason, "AppliedWithProblems");
}
