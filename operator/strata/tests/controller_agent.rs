//! The Agent controller against a fake apiserver (tower-test): first pass creates the children,
//! a second pass writes nothing, missing references leave running children alone, conflicts
//! requeue, orphans are deleted, and high context use creates a Budget CompactionJob.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;

use controller_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use strata::controller::agent::{ReconcileReport, reconcile_agent};
use strata::controller::child_index::ChildKind;
use strata::controller::context::Context;
use strata::controller::error::Error;
use strata_api::agent::{AgentStatus, ContextStatus};
use strata_api::compaction_job::{CompactionJobSpec, CompactionMode};
use strata_api::refs::LocalRef;
use strata_api::{Agent, CompactionJob};

fn running_pod(phase: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "builder-0", "namespace": NAMESPACE},
           "spec": {"containers": [], "nodeName": "node-a"},
           "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if phase == "Running" {"True"} else {"False"}}]}})
}

async fn run(agent: &Agent, ctx: &Arc<Context>) -> Result<ReconcileReport, Error> {
    reconcile_agent(agent, ctx).await.map(|(report, _)| report)
}

fn status_from(server: &FakeApiServer) -> AgentStatus {
    let write = server
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/agents/builder/status"))
        .expect("a status write");
    assert!(write.query.contains("fieldManager=strata.dev%2Fcontroller"), "{}", write.query);
    serde_json::from_value(write.body["status"].clone()).unwrap()
}

#[tokio::test]
async fn first_pass_applies_every_child_then_writes_status() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(
        report,
        ReconcileReport { applied: 7, deleted: 0, compaction_created: false, status_written: true }
    );

    let requests = server.requests();
    let reads: Vec<&str> = requests.iter().filter(|r| !r.is_write()).map(|r| r.path.as_str()).collect();
    assert_eq!(
        reads,
        [
            "/api/v1/namespaces/rateright/configmaps/builder-prompt",
            "/api/v1/namespaces/rateright/configmaps/fleet-tools",
            "/api/v1/namespaces/rateright/pods/builder-0",
        ]
    );
    let writes = server.writes();
    let applied: Vec<(&str, &str)> = writes.iter().map(|w| (w.method.as_str(), w.path.as_str())).collect();
    assert_eq!(
        applied,
        [
            ("PATCH", "/api/v1/namespaces/rateright/serviceaccounts/builder"),
            ("PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/roles/builder"),
            ("PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/rolebindings/builder"),
            ("PATCH", "/api/v1/namespaces/rateright/configmaps/builder-gateway"),
            ("PATCH", "/api/v1/namespaces/rateright/services/builder"),
            ("PATCH", "/apis/networking.k8s.io/v1/namespaces/rateright/networkpolicies/builder"),
            ("PATCH", "/apis/apps/v1/namespaces/rateright/statefulsets/builder"),
            ("PATCH", "/apis/strata.dev/v1alpha1/namespaces/rateright/agents/builder/status"),
        ]
    );
    for write in &writes[..7] {
        assert!(
            write.query.contains("fieldManager=strata.dev%2Fcontroller")
                && write.query.contains("force=true")
        );
        assert_eq!(write.body["metadata"]["ownerReferences"][0]["name"], "builder");
    }
    let status = status_from(&server);
    assert_eq!(status.phase, Some(strata_api::agent::AgentPhase::Pending));
    let prefix = status.prefix.unwrap();
    assert_eq!(prefix.cache_key.len(), 16);
    assert_eq!(writes[6].body["metadata"]["labels"]["strata.dev/prefix-key"], prefix.cache_key);
    let policy = status.effective_policy.unwrap();
    assert_eq!(policy.hash.len(), 64);
    assert!(policy.sources.contains(&"ClusterContextPolicy/fleet-default".to_string()));
    let conditions: Vec<(String, String)> =
        status.conditions.iter().map(|c| (c.type_.clone(), c.status.clone())).collect();
    assert_eq!(
        conditions,
        [
            ("Ready".into(), "False".into()),
            ("ReferencesResolved".into(), "True".into()),
            ("PolicyResolved".into(), "True".into())
        ]
    );
}

#[tokio::test]
async fn a_second_pass_with_nothing_changed_makes_zero_writes() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let mut builder = agent("builder");
    run(&builder, &ctx).await.unwrap();
    builder.status = Some(status_from(&server));
    server.clear();

    let report = run(&builder, &ctx).await.unwrap();
    assert_eq!(report.writes(), 0, "{report:?}");
    assert!(server.writes().is_empty(), "{:?}", server.writes());
    assert_eq!(server.requests().len(), 3, "two ConfigMap reads and the pod read only");
}

#[tokio::test]
async fn a_missing_config_map_sets_a_condition_and_leaves_running_children_alone() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        if seen.path.ends_with("/configmaps/builder-prompt") {
            return Some((404, status_body(404, "NotFound")));
        }
        seen.path.ends_with("/pods/builder-0").then(|| (200, running_pod("Running")))
    }));
    let caches = fleet_caches(Vec::new(), true);
    for kind in ChildKind::ALL {
        let name = if kind == ChildKind::ConfigMap { "builder-gateway" } else { "builder" };
        caches.children.record(kind, NAMESPACE, "builder", name, Some("hash-of-the-running-children".into()));
    }
    let ctx = context(client, caches);
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(report, ReconcileReport { status_written: true, ..ReconcileReport::default() });
    assert_eq!(server.writes().len(), 1, "only the status: {:?}", server.writes());
    let status = status_from(&server);
    assert_eq!(status.phase, Some(strata_api::agent::AgentPhase::Degraded));
    let references = status.conditions.iter().find(|c| c.type_ == "ReferencesResolved").unwrap();
    assert_eq!((references.status.as_str(), references.reason.as_str()), ("False", "ConfigMapNotFound"));
    assert!(references.message.contains("builder-prompt"));
}

#[tokio::test]
async fn a_missing_context_policy_ref_is_reported_and_nothing_is_applied() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), false));
    let mut builder = agent("builder");
    builder.spec.context_policy_ref = Some(LocalRef { name: "strict".into() });
    run(&builder, &ctx).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 1);
    let status = status_from(&server);
    assert_eq!(status.phase, Some(strata_api::agent::AgentPhase::Failed));
    let references = status.conditions.iter().find(|c| c.type_ == "ReferencesResolved").unwrap();
    assert_eq!(references.reason, "ContextPolicyNotFound");
}

#[tokio::test]
async fn the_default_policy_is_optional() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), false));
    let report = run(&agent("scout"), &ctx).await.unwrap();
    assert_eq!(report.applied, 7);
    let status: AgentStatus =
        serde_json::from_value(server.writes().last().unwrap().body["status"].clone()).unwrap();
    assert!(!status.effective_policy.unwrap().sources.iter().any(|s| s.starts_with("ContextPolicy/")));
}

#[tokio::test]
async fn a_conflict_is_an_error_that_requeues_quickly() {
    let (client, _server) = FakeApiServer::start(Box::new(|seen| {
        (seen.method == "PATCH" && seen.path.contains("/statefulsets/"))
            .then(|| (409, status_body(409, "Conflict")))
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let error = run(&agent("builder"), &ctx).await.unwrap_err();
    assert!(matches!(error, Error::Conflict { .. }), "{error:?}");
    assert_eq!(error.metric_label(), "conflict");
    assert_eq!(error.requeue_after(), std::time::Duration::from_secs(1));
    assert!(
        !ctx.caches
            .children
            .children_of(NAMESPACE, "builder")
            .iter()
            .any(|c| c.kind == ChildKind::StatefulSet)
    );
}

#[tokio::test]
async fn children_not_built_this_round_are_deleted() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let caches = fleet_caches(Vec::new(), true);
    caches.children.record(ChildKind::ConfigMap, NAMESPACE, "builder", "builder-gateway-v0", None);
    let ctx = context(client, caches);
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(report.deleted, 1);
    let deletes: Vec<String> =
        server.writes().into_iter().filter(|w| w.method == "DELETE").map(|w| w.path).collect();
    assert_eq!(deletes, ["/api/v1/namespaces/rateright/configmaps/builder-gateway-v0"]);
    assert_eq!(ctx.caches.children.children_of(NAMESPACE, "builder").len(), 7);
}

#[tokio::test]
async fn a_missing_credentials_secret_is_reported_from_the_pods_mount_failures() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        if seen.path.ends_with("/pods/builder-0") {
            return Some((200, running_pod("Pending")));
        }
        seen.path.ends_with("/events").then(|| {
            assert!(seen.query.contains("reason%3DFailedMount") || seen.query.contains("reason=FailedMount"), "{}", seen.query);
            (200, json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": [{
                "metadata": {"name": "e1", "namespace": NAMESPACE},
                "involvedObject": {"kind": "Pod", "name": "builder-0"},
                "reason": "FailedMount",
                "message": "MountVolume.SetUp failed for volume \"credentials\" : secret \"anthropic-api\" not found"}]}))
        })
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(report.applied, 7, "children are still applied: the pod starts once the Secret exists");
    let status = status_from(&server);
    let references = status.conditions.iter().find(|c| c.type_ == "ReferencesResolved").unwrap();
    assert_eq!((references.status.as_str(), references.reason.as_str()), ("False", "SecretNotFound"));
    assert_eq!(status.phase, Some(strata_api::agent::AgentPhase::Pending));
}

fn with_context_percent(percent: u8) -> Agent {
    let mut builder = agent("builder");
    builder.status = Some(AgentStatus {
        context: Some(ContextStatus {
            tokens: 170_000,
            limit: 200_000,
            available: 3_000,
            percent,
            ..ContextStatus::default()
        }),
        ..AgentStatus::default()
    });
    builder
}

fn budget_job(
    name: &str,
    created: Timestamp,
    phase: Option<strata_api::compaction_job::CompactionPhase>,
) -> CompactionJob {
    let mut job = CompactionJob::new(
        name,
        CompactionJobSpec {
            agent_ref: LocalRef { name: "builder".into() },
            mode: CompactionMode::Budget,
            reason: None,
            resume_instruction: None,
            rollback: None,
            purge: None,
            ttl_seconds_after_finished: None,
        },
    );
    job.metadata.namespace = Some(NAMESPACE.into());
    job.metadata.creation_timestamp = Some(Time(created));
    job.status = phase.map(|phase| strata_api::compaction_job::CompactionJobStatus {
        phase: Some(phase),
        ..Default::default()
    });
    job
}

#[tokio::test]
async fn context_over_the_trigger_creates_one_budget_compaction_job() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let report = run(&with_context_percent(82), &ctx).await.unwrap();
    assert!(report.compaction_created);
    let post = server.writes().into_iter().find(|w| w.method == "POST").unwrap();
    assert_eq!(post.path, "/apis/strata.dev/v1alpha1/namespaces/rateright/compactionjobs");
    assert_eq!(post.body["spec"]["mode"], "Budget");
    assert_eq!(post.body["spec"]["agentRef"]["name"], "builder");
    assert_eq!(post.body["metadata"]["ownerReferences"][0]["kind"], "Agent");
    assert!(post.body["spec"]["reason"].as_str().unwrap().contains("82%"));
}

#[tokio::test]
async fn budget_compaction_waits_for_active_jobs_and_is_rate_limited() {
    let now = fixed_now();
    let recent = Timestamp::from_second(now.as_second() - 120).unwrap();
    let long_ago = Timestamp::from_second(now.as_second() - 3600).unwrap();
    let cases = [
        (82, vec![budget_job("active", long_ago, None)], false, "an active job blocks"),
        (
            82,
            vec![budget_job("recent", recent, Some(strata_api::compaction_job::CompactionPhase::Succeeded))],
            false,
            "rate limit",
        ),
        (79, Vec::new(), false, "below the trigger of 80%"),
        (
            82,
            vec![budget_job("old", long_ago, Some(strata_api::compaction_job::CompactionPhase::Failed))],
            true,
            "old jobs do not block",
        ),
    ];
    for (percent, jobs, expected, why) in cases {
        let (client, server) = FakeApiServer::start(Box::new(|_| None));
        let ctx = context(client, fleet_caches(jobs, true));
        let report = run(&with_context_percent(percent), &ctx).await.unwrap();
        assert_eq!(report.compaction_created, expected, "{why}");
        assert_eq!(server.writes().iter().any(|w| w.method == "POST"), expected, "{why}");
    }
}

#[tokio::test]
async fn an_unsynced_cache_retries_without_touching_the_cluster() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let mut caches = fleet_caches(Vec::new(), true);
    caches.children = strata::controller::child_index::ChildIndex::new();
    let ctx = context(client, caches);
    let error = run(&agent("builder"), &ctx).await.unwrap_err();
    assert!(matches!(error, Error::CacheNotReady("children")), "{error:?}");
    assert!(server.requests().is_empty());
}
