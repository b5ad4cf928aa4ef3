//! The Agent controller against a fake apiserver (tower-test): first pass creates the children,
//! a second pass writes nothing, missing references leave running children alone, conflicts
//! requeue, orphans the Agent controls (by UID) are deleted and look-alikes are not, and high context use creates a Budget CompactionJob.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use std::sync::Arc;

use controller_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use strata::controller::agent::{ReconcileReport, reconcile_agent};
use strata::controller::child_index::{ChildKind, Ownership};
use strata::controller::context::{Caches, Context};
use strata::controller::error::Error;
use strata_api::agent::{AgentStatus, ContextStatus};
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
        ]
    );
    let writes = server.writes();
    let applied: Vec<(&str, &str)> = writes.iter().map(|w| (w.method.as_str(), w.path.as_str())).collect();
    assert_eq!(
        applied,
        [
            ("PATCH", "/api/v1/namespaces/rateright/serviceaccounts/builder"),
            ("PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/roles/builder"),
            ("PATCH", "/api/v1/namespaces/rateright/configmaps/builder-gateway"),
            ("PATCH", "/api/v1/namespaces/rateright/services/builder"),
            ("PATCH", "/apis/networking.k8s.io/v1/namespaces/rateright/networkpolicies/builder"),
            ("PATCH", "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/rolebindings/builder"),
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
            ("PolicyResolved".into(), "True".into()),
            ("JournalBound".into(), "True".into()),
            ("SummarizerReady".into(), "True".into())
        ]
    );
}

/// The children that need no other are in flight together, unanswered, before the RoleBinding (the
/// apiserver refuses it while its Role is missing) and the StatefulSet go out, together; then the
/// status.
#[tokio::test]
async fn the_children_are_applied_in_two_waves_then_the_status() {
    use std::time::Duration;
    let (service, mut handle) =
        tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let ctx = context(kube::Client::new(service, "default"), fleet_caches(Vec::new(), true));
    let reconcile = tokio::spawn({
        let ctx = ctx.clone();
        async move { run(&agent("builder"), &ctx).await }
    });
    let mut next_write = async || loop {
        let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
            .await
            .expect("the next request did not arrive while the earlier ones were unanswered")
            .expect("the client went away");
        let seen = seen_of(request).await;
        if seen.is_write() {
            return (seen, send);
        }
        send.send_response(response_of(default_answer(&seen)));
    };
    let kind_of = |seen: &Seen| seen.path.split('/').nth_back(1).unwrap().to_string();
    for expected in [
        vec!["configmaps", "networkpolicies", "roles", "serviceaccounts", "services"],
        vec!["rolebindings", "statefulsets"],
    ] {
        let mut held = Vec::new();
        while held.len() < expected.len() {
            held.push(next_write().await);
        }
        let mut kinds: Vec<String> = held.iter().map(|(seen, _)| kind_of(seen)).collect();
        kinds.sort_unstable();
        assert_eq!(kinds, expected);
        for (seen, send) in held {
            send.send_response(response_of(default_answer(&seen)));
        }
    }
    let (status, send) = next_write().await;
    assert_eq!(status.path, "/apis/strata.dev/v1alpha1/namespaces/rateright/agents/builder/status");
    send.send_response(response_of(default_answer(&status)));
    let report = reconcile.await.unwrap().unwrap();
    assert_eq!(report.applied, 7);
}

/// A child of the first wave that fails holds the second wave back, but the children applied beside
/// it are recorded: the retry applies only what is still missing.
#[tokio::test]
async fn a_failed_first_wave_apply_holds_back_the_second_and_keeps_the_others() {
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let fail = failing.clone();
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        (fail.load(std::sync::atomic::Ordering::SeqCst)
            && seen.method == "PATCH"
            && seen.path.contains("/roles/"))
        .then(|| (500, status_body(500, "InternalError")))
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    run(&agent("builder"), &ctx).await.unwrap_err();
    let written: Vec<String> = server.writes().iter().map(|w| w.path.clone()).collect();
    assert_eq!(written.len(), 5, "{written:?}");
    assert!(
        !written.iter().any(|path| path.contains("/rolebindings/")
            || path.contains("/statefulsets/")
            || path.ends_with("/status")),
        "{written:?}"
    );

    failing.store(false, std::sync::atomic::Ordering::SeqCst);
    server.clear();
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(report.applied, 3);
    let written: Vec<String> = server.writes().iter().map(|w| w.path.clone()).collect();
    assert_eq!(
        written,
        [
            "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/roles/builder",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/rateright/rolebindings/builder",
            "/apis/apps/v1/namespaces/rateright/statefulsets/builder",
            "/apis/strata.dev/v1alpha1/namespaces/rateright/agents/builder/status",
        ]
    );
}

#[tokio::test]
async fn a_second_pass_with_nothing_changed_makes_no_request_at_all() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let mut builder = agent("builder");
    run(&builder, &ctx).await.unwrap();
    builder.status = Some(status_from(&server));
    server.clear();

    let report = run(&builder, &ctx).await.unwrap();
    assert_eq!(report.writes(), 0, "{report:?}");
    assert!(server.writes().is_empty(), "{:?}", server.writes());
    assert!(
        server.requests().is_empty(),
        "the pod and the ConfigMaps' unchanged versions come from caches: {:?}",
        server.requests()
    );
}

#[tokio::test]
async fn an_edited_config_map_is_read_again_and_a_deleted_one_is_missing_without_a_read() {
    static EDITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        let edited = EDITED.load(std::sync::atomic::Ordering::SeqCst);
        (edited && seen.path.ends_with("/configmaps/builder-prompt")).then(|| {
            let mut map = config_maps()
                .into_iter()
                .find(|m| m.metadata.name.as_deref() == Some("builder-prompt"))
                .unwrap();
            map.metadata.resource_version = Some("2".into());
            map.data = Some([("system.md".to_string(), "You are builder, edited.".to_string())].into());
            (200, serde_json::to_value(map).unwrap())
        })
    }));
    let caches = fleet_caches(Vec::new(), true);
    let ctx = context(client.clone(), caches.clone());
    let mut builder = agent("builder");
    run(&builder, &ctx).await.unwrap();
    builder.status = Some(status_from(&server));
    let first_prefix = builder.status.as_ref().and_then(|s| s.prefix.clone()).unwrap();

    // The watch shows the edit: the prompt is read once more and the prefix follows it.
    EDITED.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut metas = config_map_metas();
    metas.iter_mut().filter(|m| m.metadata.name.as_deref() == Some("builder-prompt")).for_each(|m| {
        m.metadata.resource_version = Some("2".into());
    });
    let ctx = context_sharing_memo(
        client.clone(),
        Caches { config_maps: filled_store(metas), ..caches.clone() },
        &ctx,
    );
    server.clear();
    run(&builder, &ctx).await.unwrap();
    let reads: Vec<String> =
        server.requests().into_iter().filter(|r| !r.is_write()).map(|r| r.path).collect();
    assert_eq!(reads, ["/api/v1/namespaces/rateright/configmaps/builder-prompt"]);
    assert_ne!(status_from(&server).prefix.unwrap().hash, first_prefix.hash);

    // The watch shows it deleted: reported missing with no read.
    let metas: Vec<_> = config_map_metas()
        .into_iter()
        .filter(|m| m.metadata.name.as_deref() != Some("builder-prompt"))
        .collect();
    let ctx = context_sharing_memo(client, Caches { config_maps: filled_store(metas), ..caches }, &ctx);
    server.clear();
    run(&builder, &ctx).await.unwrap();
    assert!(server.requests().iter().all(|r| r.is_write()), "{:?}", server.requests());
    let references =
        status_from(&server).conditions.into_iter().find(|c| c.type_ == "ReferencesResolved").unwrap();
    assert_eq!((references.status.as_str(), references.reason.as_str()), ("False", "ConfigMapNotFound"));
}

#[tokio::test]
async fn a_missing_config_map_sets_a_condition_and_leaves_running_children_alone() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        seen.path.ends_with("/configmaps/builder-prompt").then(|| (404, status_body(404, "NotFound")))
    }));
    let caches = with_pod(fleet_caches(Vec::new(), true), running_pod("Running"));
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

fn controlled_by(uid: Option<&str>) -> Ownership {
    Ownership { controller_uid: uid.map(String::from), ..Ownership::default() }
}

#[tokio::test]
async fn children_not_built_this_round_are_deleted_only_when_the_agent_controls_them() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let caches = fleet_caches(Vec::new(), true);
    let builder = agent("builder");
    let uid = builder.metadata.uid.clone().unwrap();
    let index = &caches.children;
    index.observe(
        ChildKind::ConfigMap,
        NAMESPACE,
        "builder",
        "builder-gateway-v0",
        None,
        controlled_by(Some(&uid)),
    );
    // A user's look-alike: the Agent's labels, no ownerReference.
    index.observe(ChildKind::Service, NAMESPACE, "builder", "builder-lookalike", None, controlled_by(None));
    // Left by an earlier Agent of the same name (another UID).
    let earlier = "11111111-0000-4000-8000-000000000000";
    index.observe(ChildKind::Role, NAMESPACE, "builder", "builder-old", None, controlled_by(Some(earlier)));
    let ctx = context(client, caches);
    let report = run(&builder, &ctx).await.unwrap();
    assert_eq!(report.deleted, 1);
    let deletes: Vec<String> =
        server.writes().into_iter().filter(|w| w.method == "DELETE").map(|w| w.path).collect();
    assert_eq!(deletes, ["/api/v1/namespaces/rateright/configmaps/builder-gateway-v0"]);
    let left: Vec<String> =
        ctx.caches.children.children_of(NAMESPACE, "builder").into_iter().map(|c| c.name).collect();
    assert_eq!(left.len(), 9, "the seven children and the two objects that are not the Agent's: {left:?}");
    assert!(left.contains(&"builder-lookalike".to_string()) && left.contains(&"builder-old".to_string()));
}

#[tokio::test]
async fn a_missing_credentials_secret_is_reported_from_the_pods_mount_failures() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let caches = with_pod(fleet_caches(Vec::new(), true), running_pod("Pending"));
    let caches = with_mount_failures(
        caches,
        vec![json!({
        "metadata": {"name": "e1", "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "name": "builder-0", "namespace": NAMESPACE},
        "reason": "FailedMount",
        "message": "MountVolume.SetUp failed for volume \"credentials\" : secret \"anthropic-api\" not found"})],
    );
    let ctx = context(client, caches);
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
    let mut job = budget_compaction_job(name);
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

/// The apiserver's answer to a create in a namespace being deleted (as kube-apiserver v1.36 sends it).
fn namespace_terminating_body() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "serviceaccounts \"builder\" is forbidden: unable to create new content in namespace rateright because it is being terminated",
           "reason": "Forbidden", "code": 403,
           "details": {"name": "builder", "kind": "serviceaccounts", "causes": [{
               "reason": "NamespaceTerminating",
               "message": "namespace rateright is being terminated", "field": "metadata.namespace"}]}})
}

#[tokio::test]
async fn a_namespace_being_deleted_is_neither_a_failure_nor_retried_hot() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        (seen.method == "PATCH").then(|| (403, namespace_terminating_body()))
    }));
    let ctx = context(client, fleet_caches(Vec::new(), true));
    let error = run(&agent("builder"), &ctx).await.unwrap_err();
    assert!(
        matches!(&error, Error::NamespaceTerminating { namespace, .. } if namespace == NAMESPACE),
        "{error:?}"
    );
    // The first wave goes out together and is refused; the StatefulSet is not tried.
    let written: Vec<String> = server.writes().iter().map(|w| w.path.clone()).collect();
    assert_eq!(written.len(), 5, "{written:?}");
    assert!(!written.iter().any(|path| path.contains("/statefulsets/")), "{written:?}");

    let metrics = strata::controller::metrics::Metrics::new().unwrap();
    let settled = metrics
        .track("agent", async {
            strata::controller::error::settle_namespace_terminating(Err(error), ctx.settings.resync_interval)
        })
        .await
        .unwrap();
    assert_eq!(settled, kube::runtime::controller::Action::requeue(ctx.settings.resync_interval));
    let text = metrics.render();
    assert!(!text.contains("strata_controller_reconcile_errors_total{"), "not counted as a failure: {text}");

    // A plain 403 (RBAC) is still a failure with reason="forbidden".
    let rbac = kube::Error::Api(serde_json::from_value(status_body(403, "Forbidden")).unwrap());
    let error = Error::kube("applying ServiceAccount rateright/builder", rbac);
    assert_eq!(error.metric_label(), "forbidden");
    assert!(
        strata::controller::error::settle_namespace_terminating(Err(error), ctx.settings.resync_interval)
            .is_err()
    );
}

#[tokio::test]
async fn nothing_is_applied_into_a_namespace_the_cache_shows_deleting() {
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let mut caches = fleet_caches(Vec::new(), true);
    let mut namespace = namespace_meta();
    namespace.metadata.deletion_timestamp = Some(Time(fixed_now()));
    caches.namespaces = filled_store(vec![namespace]);
    let ctx = context(client, caches);
    let report = run(&agent("builder"), &ctx).await.unwrap();
    assert_eq!(report.writes(), 0);
    assert!(server.requests().is_empty(), "{:?}", server.requests());
}

#[tokio::test]
async fn a_journal_refused_by_the_gateway_is_a_condition_and_a_warning_event() {
    let refusal = "strata: data dir /var/lib/strata: the journal in /var/lib/strata belongs to Agent rateright/builder (uid old), not to this Agent (uid new): refusing to serve another agent's history. Delete the claim to start empty, or adopt the journal on purpose by annotating the Agent strata.dev/adopt-journal-from-uid=old";
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "builder-0", "namespace": NAMESPACE, "labels": {"strata.dev/agent": "builder"}},
        "spec": {"containers": []},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "gateway", "image": "x", "imageID": "", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": format!("{refusal}\n")}}}]}});
    let ctx = context(client, with_pod(fleet_caches(Vec::new(), true), pod));
    run(&agent("builder"), &ctx).await.unwrap();
    let status = status_from(&server);
    assert_eq!(status.phase, Some(strata_api::agent::AgentPhase::Degraded));
    let bound = status.conditions.iter().find(|c| c.type_ == "JournalBound").unwrap();
    assert_eq!((bound.status.as_str(), bound.reason.as_str()), ("False", "ForeignJournal"));
    assert!(bound.message.contains("belongs to Agent rateright/builder (uid old)"), "{}", bound.message);
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.reason, "ForeignJournal");
    let event = server
        .writes()
        .into_iter()
        .find(|w| w.path.contains("/apis/events.k8s.io/v1/"))
        .expect("a Warning Event on the Agent");
    assert_eq!(
        (event.body["type"].as_str(), event.body["reason"].as_str()),
        (Some("Warning"), Some("ForeignJournal"))
    );
    assert_eq!(event.body["regarding"]["kind"], "Agent");
}
