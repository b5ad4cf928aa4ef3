//! CompactionJobs on a real control plane. There is no kubelet, so each Job's pod is finished by
//! hand: the test runs the real `strata compact` with the Job's own arguments against a journal on
//! local disk (the agent's volume), and writes its termination message into the pod's status, as
//! the kubelet would. Covers one compaction at a time per agent, a Budget compaction triggered by
//! the gateway's context report, Purge and Rollback, and the Agent's status after each.
//! Ignored unless STRATA_E2E_KUBECONFIG is set when they are built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use strata_api::compaction_job::CompactionPhase;
use strata_api::{Agent, CompactionJob};
use strata_core::entry::{Content, EntryDraft, EntryKind, RetentionClass, Role};
use strata_core::journal::{Journal, JournalOptions, StdStorage};
use strata_e2e::{TempNamespace, client, eventually, fleet_namespace, harness_var};

const MINUTE: Duration = Duration::from_secs(60);

/// The builder Agent in a fresh namespace, once its gateway.json exists.
async fn builder(client: &Client, prefix: &str) -> (TempNamespace, Api<Agent>) {
    let (namespace, agents) = fleet_namespace(client, prefix).await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace.name);
    eventually("the agent's gateway.json", MINUTE, || async {
        maps.get_opt("builder-gateway").await.ok().flatten()
    })
    .await;
    (namespace, agents)
}

/// The agent's volume: a journal on local disk with a little history, and its gateway.json.
struct Volume {
    root: PathBuf,
}

impl Volume {
    async fn new(client: &Client, namespace: &str) -> Self {
        let root = std::env::temp_dir().join(format!("strata-e2e-volume-{namespace}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let (mut journal, _) =
            Journal::open(Arc::new(StdStorage), root.join("data"), JournalOptions::new("e2e", 1)).unwrap();
        let mut say = |role: Role, text: &str| {
            let draft = EntryDraft {
                kind: EntryKind::Message,
                role,
                content: Content::text(text),
                retention: RetentionClass::Working,
                created_at_ms: 1,
                tokens: (text.len() as u64).div_ceil(4) + 3,
                artifact_refs: vec![],
            };
            journal.append(draft).unwrap();
        };
        say(Role::User, "Objective: make the pricing page load under 200 ms.");
        say(Role::User, "You must not change the public API of pricing.rs.");
        say(Role::Assistant, "Decision: cache the plan table in memory for 60 s.");
        for n in 0..30 {
            say(Role::Assistant, &format!("Profiling step {n}: {}", "flamegraph frame ".repeat(60)));
        }
        drop(journal);
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let map = maps.get("builder-gateway").await.unwrap();
        let config = map.data.unwrap().remove("gateway.json").unwrap();
        std::fs::write(root.join("gateway.json"), config).unwrap();
        Volume { root }
    }

    /// Run `strata compact` with the Job's arguments, its paths mapped onto this volume; returns
    /// the exit code and the termination message.
    fn run(&self, job: &Job) -> (i32, String) {
        let container = &job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
        let args = container.args.clone().unwrap();
        let log = self.root.join("termination-log");
        let _ = std::fs::remove_file(&log);
        let mapped: Vec<String> = args
            .iter()
            .map(|arg| match arg.as_str() {
                "/var/lib/strata" => self.root.join("data").display().to_string(),
                "/dev/termination-log" => log.display().to_string(),
                other if other.ends_with("/gateway.json") => {
                    self.root.join("gateway.json").display().to_string()
                }
                other => other.to_string(),
            })
            .collect();
        let output =
            std::process::Command::new(harness_var("STRATA_E2E_STRATA_BIN")).args(&mapped).output().unwrap();
        let message = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !message.is_empty(),
            "strata compact {mapped:?} wrote no record:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.code().unwrap_or(-1), message)
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Finish the Job's pod the way the kubelet reports it: terminated, with the termination message.
async fn finish_pod(client: &Client, namespace: &str, job: &str, exit_code: i32, message: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = eventually("the Job's pod", MINUTE, || async {
        pods.list(&ListParams::default().labels(&format!("job-name={job}")))
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let phase = if exit_code == 0 { "Succeeded" } else { "Failed" };
    let status = json!({"status": {"phase": phase, "containerStatuses": [{
        "name": "compact", "image": "strata", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" },
                                 "message": message, "startedAt": now, "finishedAt": now}}}]}});
    let name = pod.metadata.name.unwrap();
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.unwrap();
}

async fn job_of(client: &Client, compactions: &Api<CompactionJob>, namespace: &str, name: &str) -> Job {
    let job_name = eventually(&format!("{name} to start its Job"), MINUTE, || async {
        compactions.get(name).await.ok()?.status?.job_name
    })
    .await;
    Api::<Job>::namespaced(client.clone(), namespace).get(&job_name).await.unwrap()
}

async fn phase_of(compactions: &Api<CompactionJob>, name: &str, want: CompactionPhase) -> CompactionJob {
    eventually(&format!("{name} to reach {want:?}"), MINUTE, || async {
        let job = compactions.get(name).await.ok()?;
        (job.status.as_ref()?.phase? == want).then_some(job)
    })
    .await
}

fn compaction(name: &str, spec: Value) -> CompactionJob {
    serde_json::from_value(json!({"apiVersion": "strata.dev/v1alpha1", "kind": "CompactionJob",
                                  "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

async fn unfinished_jobs(client: &Client, namespace: &str) -> Vec<String> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let list = jobs.list(&ListParams::default().labels("strata.dev/agent=builder")).await.unwrap();
    list.items
        .into_iter()
        .filter(|job| {
            !job.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
        })
        .filter_map(|job| job.metadata.name)
        .collect()
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn two_compaction_jobs_created_at_once_run_one_after_the_other() {
    let client = client().await.unwrap();
    let (namespace, _agents) = builder(&client, "one-at-a-time").await;
    let ns = &namespace.name;
    let volume = Volume::new(&client, ns).await;
    let compactions: Api<CompactionJob> = Api::namespaced(client.clone(), ns);
    let spec = json!({"agentRef": {"name": "builder"}, "mode": "TaskBoundary", "reason": "e2e"});
    let (first, second) = (compaction("first", spec.clone()), compaction("second", spec));
    let params = PostParams::default();
    let (a, b) = tokio::join!(compactions.create(&params, &first), compactions.create(&params, &second));
    a.unwrap();
    b.unwrap();
    let started = eventually("one of them to start", MINUTE, || async {
        for name in ["first", "second"] {
            if compactions.get(name).await.ok()?.status?.job_name.is_some() {
                return Some(name);
            }
        }
        None
    })
    .await;
    let waiting = if started == "first" { "second" } else { "first" };
    for _ in 0..10 {
        let running = unfinished_jobs(&client, ns).await;
        assert!(running.len() <= 1, "two compaction Jobs on one volume: {running:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let pending = compactions.get(waiting).await.unwrap().status.unwrap();
    assert_eq!(pending.reason.as_deref(), Some("WaitingForActiveJob"));

    let job = job_of(&client, &compactions, ns, started).await;
    let (code, record) = volume.run(&job);
    finish_pod(&client, ns, job.metadata.name.as_deref().unwrap(), code, &record).await;
    phase_of(&compactions, started, CompactionPhase::Succeeded).await;
    let next = job_of(&client, &compactions, ns, waiting).await;
    assert_ne!(next.metadata.name, job.metadata.name);
    assert!(unfinished_jobs(&client, ns).await.len() <= 1);
    namespace.delete().await.unwrap();
}

fn record_field(record: &str, field: &str) -> Value {
    serde_json::from_str::<Value>(record).unwrap()[field].clone()
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn purge_budget_and_rollback_run_end_to_end_with_real_strata_compact_records() {
    let client = client().await.unwrap();
    let (namespace, agents) = builder(&client, "compact").await;
    let ns = &namespace.name;
    let volume = Volume::new(&client, ns).await;
    let compactions: Api<CompactionJob> = Api::namespaced(client.clone(), ns);

    // Purge two profiling steps.
    let purge = compaction(
        "purge-profiling",
        json!({"agentRef": {"name": "builder"}, "mode": "Purge", "reason": "noise",
               "purge": {"ids": ["msg_5", "msg_6"], "summary": "two profiling steps"}}),
    );
    compactions.create(&PostParams::default(), &purge).await.unwrap();
    let job = job_of(&client, &compactions, ns, "purge-profiling").await;
    let args = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].args.clone().unwrap();
    assert!(args.windows(2).any(|w| w == ["--ids", "msg_5,msg_6"]), "{args:?}");
    assert!(args.windows(2).any(|w| w == ["--reason", "noise"]), "spec.reason is passed through: {args:?}");
    let (code, record) = volume.run(&job);
    assert_eq!(code, 0, "{record}");
    finish_pod(&client, ns, job.metadata.name.as_deref().unwrap(), code, &record).await;
    let done = phase_of(&compactions, "purge-profiling", CompactionPhase::Succeeded).await;
    let original_generation = record_field(&record, "sourceGeneration").as_u64().unwrap();
    assert_eq!(done.status.unwrap().record.unwrap().compaction_id, record_field(&record, "compactionId"));

    // The gateway reports 85 % of the window in use; the trigger is 80 %: a Budget compaction follows.
    let report = json!({"status": {"context": {"tokens": 170000, "limit": 200000, "available": 12000,
                                               "percent": 85, "level": "HighRisk", "cachedTokens": 0, "freshTokens": 0}}});
    agents.patch_status("builder", &PatchParams::default(), &Patch::Merge(report)).await.unwrap();
    let budget = eventually("a Budget CompactionJob", MINUTE, || async {
        let list = compactions.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|c| c.spec.mode == strata_api::compaction_job::CompactionMode::Budget)
    })
    .await;
    let budget_name = budget.metadata.name.clone().unwrap();
    let job = job_of(&client, &compactions, ns, &budget_name).await;
    let (code, record) = volume.run(&job);
    assert_eq!(code, 0, "{record}");
    finish_pod(&client, ns, job.metadata.name.as_deref().unwrap(), code, &record).await;
    phase_of(&compactions, &budget_name, CompactionPhase::Succeeded).await;
    let status = eventually("the Agent's lastCompaction", MINUTE, || async {
        let status = agents.get("builder").await.ok()?.status?;
        (status.last_compaction.as_ref()?.job_name == budget_name).then_some(status)
    })
    .await;
    let last = status.last_compaction.unwrap();
    assert_eq!(Some(last.compaction_id.unwrap().into()), Some(record_field(&record, "compactionId")));
    assert_eq!(last.tokens_after, record_field(&record, "tokensAfter").as_u64().unwrap());
    assert_eq!(
        status.journal.unwrap().generation,
        record_field(&record, "resultGeneration").as_u64().unwrap(),
        "status.journal follows the journal's CURRENT generation"
    );

    // Roll back to the generation before the purge.
    let rollback = compaction(
        "rollback",
        json!({"agentRef": {"name": "builder"}, "mode": "Rollback", "rollback": {"toGeneration": original_generation}}),
    );
    compactions.create(&PostParams::default(), &rollback).await.unwrap();
    let job = job_of(&client, &compactions, ns, "rollback").await;
    let (code, record) = volume.run(&job);
    assert_eq!(code, 0, "{record}");
    finish_pod(&client, ns, job.metadata.name.as_deref().unwrap(), code, &record).await;
    phase_of(&compactions, "rollback", CompactionPhase::Succeeded).await;
    eventually("status.journal after the rollback", MINUTE, || async {
        let generation = agents.get("builder").await.ok()?.status?.journal?.generation;
        (generation == record_field(&record, "resultGeneration").as_u64()?).then_some(())
    })
    .await;
    assert!(Path::new(&volume.root).exists());
    namespace.delete().await.unwrap();
}

#[tokio::test]
#[cfg_attr(not(strata_e2e), ignore = "needs a cluster: set STRATA_E2E_KUBECONFIG")]
async fn a_failed_compaction_says_why_in_its_condition_and_an_event() {
    let client = client().await.unwrap();
    let (namespace, _agents) = builder(&client, "failed").await;
    let ns = &namespace.name;
    let volume = Volume::new(&client, ns).await;
    let compactions: Api<CompactionJob> = Api::namespaced(client.clone(), ns);
    let rollback = compaction(
        "rollback-to-nowhere",
        json!({"agentRef": {"name": "builder"}, "mode": "Rollback", "rollback": {"toGeneration": 99}}),
    );
    compactions.create(&PostParams::default(), &rollback).await.unwrap();
    let job = job_of(&client, &compactions, ns, "rollback-to-nowhere").await;
    // The real `strata compact` fails on this volume, and writes why into its termination log.
    let (code, message) = volume.run(&job);
    assert_eq!(code, 64, "{message}");
    assert!(message.contains("generation"), "{message}");
    finish_pod(&client, ns, job.metadata.name.as_deref().unwrap(), code, &message).await;

    let failed = phase_of(&compactions, "rollback-to-nowhere", CompactionPhase::Failed).await;
    let status = failed.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("InvalidRequest"));
    let condition = status.conditions.iter().find(|c| c.type_ == "Failed").expect("a Failed condition");
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "InvalidRequest"));
    assert!(condition.message.starts_with("strata compact exited with code 64: "), "{}", condition.message);
    let why = message.trim().trim_start_matches("strata compact: ");
    assert!(condition.message.contains(why), "{} does not carry {why}", condition.message);

    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let event = eventually("a Warning Event on the CompactionJob", MINUTE, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("rollback-to-nowhere")
                && e.reason.as_deref() == Some("InvalidRequest")
        })
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.note.as_deref(), Some(condition.message.as_str()));
    namespace.delete().await.unwrap();
}
