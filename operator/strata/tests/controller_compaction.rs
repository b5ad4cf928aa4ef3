//! The CompactionJob controller against a fake apiserver: AgentNotFound, one job at a time per
//! agent, a batch Job pinned to the agent's node, the record from the termination message, the
//! Agent's lastCompaction, Events, and TTL cleanup.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod controller_support;

use controller_support::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use strata::controller::compaction::job::job_name;
use strata::controller::compaction::reconcile_compaction;
use strata_api::CompactionJob;
use strata_api::compaction_job::{CompactionJobStatus, CompactionPhase};

const RECORD: &str = r#"{"compactionId":"cmp:builder:7","mode":"TaskBoundary","sourceGeneration":3,"resultGeneration":4,"tokensBefore":171000,"tokensAfter":23000,"preservedFields":["activeObjective","decisions"],"qualityCheck":"Passed"}"#;

fn sample_job() -> CompactionJob {
    let path = repo_root().join("config/samples/strata_v1alpha1_compactionjob.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut job: CompactionJob = serde_saphyr::from_str(&text).unwrap();
    job.metadata.namespace = Some(NAMESPACE.into());
    job.metadata.uid = Some("11111111-2222-4333-8444-555555555555".into());
    job.metadata.generation = Some(1);
    job.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_759_990_000).unwrap()));
    job
}

/// Answers for a cluster where builder runs on node-a and the Job may already exist.
fn cluster(job_body: Option<Value>, pods_of_job: Value) -> Responder {
    Box::new(move |seen| {
        let path = seen.path.as_str();
        if seen.method == "GET" && path.ends_with("/agents/builder") {
            return Some((200, serde_json::to_value(agent("builder")).unwrap()));
        }
        if seen.method == "GET" && path.ends_with("/pods/builder-0") {
            return Some((
                200,
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "builder-0"},
                                     "spec": {"containers": [], "nodeName": "node-a"}}),
            ));
        }
        if seen.method == "GET" && path.contains("/jobs/") {
            return Some(match &job_body {
                Some(job) => (200, job.clone()),
                None => (404, status_body(404, "NotFound")),
            });
        }
        if seen.method == "GET" && path.ends_with("/pods") {
            return Some((200, pods_of_job.clone()));
        }
        if seen.method == "GET" && path.ends_with("/jobs") {
            return Some((200, list::<Value>("batch/v1", "JobList", vec![])));
        }
        if seen.method == "GET" && path.ends_with("/compactionjobs") {
            return Some((200, list("strata.dev/v1alpha1", "CompactionJobList", vec![sample_job()])));
        }
        if seen.method == "PATCH" && path.contains("/compactionjobs/") {
            let mut job = serde_json::to_value(sample_job()).unwrap();
            job["status"] = seen.body["status"].clone();
            return Some((200, job));
        }
        None
    })
}

fn list<T: serde::Serialize>(api_version: &str, kind: &str, items: Vec<T>) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": {}, "items": items})
}

fn no_pods() -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []})
}

fn status_written(server: &FakeApiServer) -> CompactionJobStatus {
    let write = server
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/compactionjobs/builder-sprint-42-boundary/status"))
        .expect("a CompactionJob status write");
    serde_json::from_value(write.body["status"].clone()).unwrap()
}

fn events(server: &FakeApiServer) -> Vec<Value> {
    server
        .writes()
        .into_iter()
        .filter(|w| w.path.contains("/apis/events.k8s.io/v1/"))
        .map(|w| w.body)
        .collect()
}

#[tokio::test]
async fn a_missing_agent_fails_the_job_with_agent_not_found() {
    let existing_cluster = cluster(None, no_pods());
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.path.ends_with("/agents/builder") {
            return Some((404, status_body(404, "NotFound")));
        }
        existing_cluster(seen)
    }));
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let status = status_written(&server);
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (Some(CompactionPhase::Failed), Some("AgentNotFound"))
    );
    let events = events(&server);
    assert_eq!(events.len(), 1);
    assert_eq!(
        (events[0]["type"].as_str(), events[0]["reason"].as_str()),
        (Some("Warning"), Some("AgentNotFound"))
    );
    assert!(!server.writes().iter().any(|w| w.path.contains("/jobs")));
}

#[tokio::test]
async fn the_job_runs_strata_compact_on_the_agents_volume_pinned_to_its_node() {
    let (client, server) = FakeApiServer::start(cluster(None, no_pods()));
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let created =
        server.writes().into_iter().find(|w| w.method == "POST" && w.path.ends_with("/jobs")).unwrap();
    let job = created.body;
    assert_eq!(job["metadata"]["name"], job_name(&sample_job()));
    assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "CompactionJob");
    let spec = &job["spec"];
    assert_eq!(spec["backoffLimit"], 2);
    let rule = &spec["podFailurePolicy"]["rules"][0];
    assert_eq!(rule["action"], "FailJob", "a retry cannot fix a bad request or a damaged journal");
    assert_eq!(rule["onExitCodes"]["values"], json!([2, 64, 65]));
    assert_eq!(spec["activeDeadlineSeconds"], 1800);
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["nodeSelector"]["kubernetes.io/hostname"], "node-a");
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    let container = &pod["containers"][0];
    assert_eq!(container["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(container["securityContext"]["allowPrivilegeEscalation"], false);
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(&args[..5], ["compact", "--data-dir", "/var/lib/strata", "--mode", "TaskBoundary"]);
    assert!(args.windows(2).any(|w| w == ["--termination-log", "/dev/termination-log"]));
    assert!(
        args.windows(2).any(|w| w == ["--reason", "Sprint 42 finished; the pricing-page task is next."]),
        "spec.reason reaches the compaction record: {args:?}"
    );
    assert!(
        args.windows(2).any(|w| w[0] == "--resume-instruction" && w[1].starts_with("Sprint 42 is merged"))
    );
    let claim = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "journal").unwrap();
    assert_eq!(claim["persistentVolumeClaim"]["claimName"], "journal-builder-0");

    let status = status_written(&server);
    assert_eq!(status.phase, Some(CompactionPhase::Running));
    assert_eq!(status.job_name.as_deref(), Some(job_name(&sample_job()).as_str()));
    assert_eq!(events(&server)[0]["reason"], "Started");
}

#[tokio::test]
async fn a_suspended_agent_is_compacted_without_pinning() {
    let (client, server) = FakeApiServer::start(Box::new(|seen| {
        if seen.method == "GET" && seen.path.ends_with("/agents/builder") {
            let mut builder = agent("builder");
            builder.spec.suspend = Some(true);
            return Some((200, serde_json::to_value(builder).unwrap()));
        }
        cluster(None, no_pods())(seen)
    }));
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let created =
        server.writes().into_iter().find(|w| w.method == "POST" && w.path.ends_with("/jobs")).unwrap();
    assert!(created.body["spec"]["template"]["spec"].get("nodeSelector").is_none());
    assert!(!server.requests().iter().any(|r| r.path.ends_with("/pods/builder-0")));
}

#[tokio::test]
async fn a_second_job_for_the_same_agent_waits() {
    let mut earlier = sample_job();
    earlier.metadata.name = Some("builder-budget-1".into());
    earlier.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_759_000_000).unwrap()));
    let live = vec![earlier.clone(), sample_job()];
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method == "GET" && seen.path.ends_with("/compactionjobs") {
            return Some((200, list("strata.dev/v1alpha1", "CompactionJobList", live.clone())));
        }
        cluster(None, no_pods())(seen)
    }));
    // The cache has not seen the earlier job yet (it was created the same second): the live list decides.
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let status = status_written(&server);
    assert_eq!(
        (status.phase, status.reason.as_deref()),
        (Some(CompactionPhase::Pending), Some("WaitingForActiveJob"))
    );
    assert!(!server.writes().iter().any(|w| w.path.ends_with("/jobs")));
}

#[tokio::test]
async fn an_unfinished_job_of_the_agent_blocks_a_new_one() {
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method == "GET" && seen.path.ends_with("/jobs") {
            assert!(seen.query.contains("strata.dev%2Fagent%3Dbuilder"), "{}", seen.query);
            let running = json!({"metadata": {"name": "builder-other-1a2b3c4d"}, "status": {"active": 1}});
            return Some((200, list("batch/v1", "JobList", vec![running])));
        }
        cluster(None, no_pods())(seen)
    }));
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let status = status_written(&server);
    assert_eq!(status.reason.as_deref(), Some("WaitingForActiveJob"));
    assert!(!server.writes().iter().any(|w| w.path.ends_with("/jobs")));
    assert!(events(&server)[0]["note"].as_str().unwrap().contains("builder-other-1a2b3c4d"));
}

fn finished_job(condition: &str) -> Value {
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job_name(&sample_job()), "namespace": NAMESPACE},
           "spec": {"template": {"spec": {"containers": []}}},
           "status": {"conditions": [{"type": condition, "status": "True"}]}})
}

fn pods_with_message(message: &str) -> Value {
    pods_with_exit(0, message)
}

fn pods_with_exit(exit_code: i32, message: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [{
        "metadata": {"name": "job-pod"},
        "status": {"containerStatuses": [{"name": "compact", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message, "finishedAt": "2025-10-09T19:00:00Z"}}}]}}]})
}

fn running(job: &mut CompactionJob) {
    job.status = Some(CompactionJobStatus {
        phase: Some(CompactionPhase::Running),
        reason: Some("JobCreated".into()),
        job_name: Some(job_name(job)),
        ..CompactionJobStatus::default()
    });
}

#[tokio::test]
async fn the_termination_message_becomes_the_record_and_the_agents_last_compaction() {
    let mut job = sample_job();
    running(&mut job);
    let (client, server) =
        FakeApiServer::start(cluster(Some(finished_job("Complete")), pods_with_message(RECORD)));
    let ctx = context(client, fleet_caches(vec![job.clone()], true));
    reconcile_compaction(&job, &ctx).await.unwrap();

    let list =
        server.requests().into_iter().find(|r| r.path.ends_with("/pods") && r.method == "GET").unwrap();
    assert!(list.query.contains("labelSelector=job-name"), "{}", list.query);
    let status = status_written(&server);
    assert_eq!(status.phase, Some(CompactionPhase::Succeeded));
    let record = status.record.clone().unwrap();
    assert_eq!(
        (record.compaction_id.as_str(), record.tokens_before, record.tokens_after),
        ("cmp:builder:7", 171_000, 23_000)
    );

    let last = server.writes().into_iter().find(|w| w.path.ends_with("/agents/builder/status")).unwrap();
    assert!(last.query.contains("fieldManager=strata.dev%2Fcompaction-controller"), "{}", last.query);
    assert_eq!(
        last.body["status"]["journal"]["generation"], 4,
        "the record's result generation is CURRENT now"
    );
    let last = &last.body["status"]["lastCompaction"];
    assert_eq!(last["jobName"], "builder-sprint-42-boundary");
    assert_eq!(last["compactionId"], "cmp:builder:7");
    assert_eq!(last["tokensAfter"], 23_000);
    assert_eq!(events(&server)[0]["reason"], "Compacted");
    let complete = status.conditions.iter().find(|c| c.type_ == "Complete").expect("a Complete condition");
    assert_eq!(complete.status, "True");
}

#[tokio::test]
async fn a_failed_check_or_a_crash_fails_the_job_without_touching_the_agent() {
    let failed_check = RECORD.replace("\"Passed\"", "\"Failed\",\"missingItems\":[\"open question q3\"]");
    for (condition, message, reason) in
        [("Complete", failed_check.as_str(), "QualityCheckFailed"), ("Failed", "OOMKilled", "JobFailed")]
    {
        let mut job = sample_job();
        running(&mut job);
        let (client, server) =
            FakeApiServer::start(cluster(Some(finished_job(condition)), pods_with_message(message)));
        let ctx = context(client, fleet_caches(vec![job.clone()], true));
        reconcile_compaction(&job, &ctx).await.unwrap();
        let status = status_written(&server);
        assert_eq!((status.phase, status.reason.as_deref()), (Some(CompactionPhase::Failed), Some(reason)));
        assert!(!server.writes().iter().any(|w| w.path.contains("/agents/")), "{reason}");
        assert_eq!(events(&server)[0]["type"], "Warning");
    }
}

#[tokio::test]
async fn a_failed_compactions_reason_reaches_its_condition_and_event() {
    let mut job = sample_job();
    running(&mut job);
    let error = "strata compact: summariser claude-haiku-4-5 failed: HTTP 404 from https://api.openai.com/v1: model not found; nothing changed";
    let (client, server) =
        FakeApiServer::start(cluster(Some(finished_job("Failed")), pods_with_exit(69, error)));
    let ctx = context(client, fleet_caches(vec![job.clone()], true));
    reconcile_compaction(&job, &ctx).await.unwrap();
    let status = status_written(&server);
    assert_eq!(status.phase, Some(CompactionPhase::Failed));
    assert_eq!(status.reason.as_deref(), Some("SummarizerUnavailable"));
    let failed = status.conditions.iter().find(|c| c.type_ == "Failed").expect("a Failed condition");
    assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", "SummarizerUnavailable"));
    assert!(
        failed.message.starts_with("strata compact exited with code 69: summariser"),
        "{}",
        failed.message
    );
    assert!(failed.message.contains("model not found"), "{}", failed.message);
    let event = &events(&server)[0];
    assert_eq!(
        (event["type"].as_str(), event["reason"].as_str()),
        (Some("Warning"), Some("SummarizerUnavailable"))
    );
    assert_eq!(event["note"].as_str(), Some(failed.message.as_str()));
}

#[tokio::test]
async fn a_job_that_failed_before_its_pod_reported_names_the_jobs_own_reason() {
    let mut job = sample_job();
    running(&mut job);
    let mut failed_job = finished_job("Failed");
    failed_job["status"]["conditions"][0]["reason"] = json!("DeadlineExceeded");
    failed_job["status"]["conditions"][0]["message"] = json!("Job was active longer than specified deadline");
    let (client, server) = FakeApiServer::start(cluster(Some(failed_job), no_pods()));
    let ctx = context(client, fleet_caches(vec![job.clone()], true));
    reconcile_compaction(&job, &ctx).await.unwrap();
    let status = status_written(&server);
    assert_eq!(status.reason.as_deref(), Some("JobFailed"));
    let failed = status.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert!(
        failed.message.contains("(DeadlineExceeded)")
            && failed.message.contains("longer than specified deadline"),
        "{}",
        failed.message
    );
}

#[tokio::test]
async fn finished_jobs_are_deleted_after_their_ttl() {
    let mut job = sample_job();
    job.status = Some(CompactionJobStatus {
        phase: Some(CompactionPhase::Succeeded),
        completion_time: Some(Time(Timestamp::from_second(fixed_now().as_second() - 86_401).unwrap())),
        ..CompactionJobStatus::default()
    });
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(vec![job.clone()], true));
    reconcile_compaction(&job, &ctx).await.unwrap();
    let writes = server.writes();
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].method, "DELETE");
    assert!(writes[0].path.ends_with("/compactionjobs/builder-sprint-42-boundary"));

    let mut fresh = job.clone();
    fresh.status.as_mut().unwrap().completion_time = Some(Time(fixed_now()));
    let (client, server) = FakeApiServer::start(Box::new(|_| None));
    let ctx = context(client, fleet_caches(vec![fresh.clone()], true));
    reconcile_compaction(&fresh, &ctx).await.unwrap();
    assert!(server.requests().is_empty(), "not expired yet: nothing to do");
}

#[tokio::test]
async fn the_summarisers_own_key_is_mounted_into_the_job() {
    use strata::controller::agent::build::build;
    use strata::controller::agent::validate::{Validation, validate};
    use strata::controller::prefix_cache::PrefixCache;
    let builder = agent("builder");
    let Validation::Valid(valid) =
        validate(&builder, &inputs_for(&builder), &PrefixCache::default(), &master_key()).unwrap()
    else {
        panic!("builder is valid")
    };
    let gateway_map = serde_json::to_value(build(&builder, &valid, &settings()).unwrap().config_map).unwrap();
    let answers = cluster(None, no_pods());
    let (client, server) = FakeApiServer::start(Box::new(move |seen| {
        if seen.method == "GET" && seen.path.ends_with("/configmaps/builder-gateway") {
            return Some((200, gateway_map.clone()));
        }
        answers(seen)
    }));
    let ctx = context(client, fleet_caches(vec![sample_job()], true));
    reconcile_compaction(&sample_job(), &ctx).await.unwrap();
    let created =
        server.writes().into_iter().find(|w| w.method == "POST" && w.path.ends_with("/jobs")).unwrap();
    let pod = &created.body["spec"]["template"]["spec"];
    let volume =
        pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "summarizer-credentials").unwrap();
    assert_eq!(volume["secret"]["secretName"], "anthropic-api", "the sample policy's summariser key");
    assert_eq!(volume["secret"]["items"][0]["key"], "api-key");
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mount = mounts.iter().find(|m| m["name"] == "summarizer-credentials").unwrap();
    assert_eq!(mount["mountPath"], "/var/run/strata/summarizer");
    assert_eq!(mount["readOnly"], true);
}
