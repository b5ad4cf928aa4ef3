//! The CompactionJob controller: waits for the agent's other jobs, runs `strata compact` as a
//! batch Job on the agent's volume, turns the pod's termination message into the status record (or,
//! on failure, into a reason and message on a `Failed` condition), updates the Agent's
//! `lastCompaction`, emits an Event at each transition, and deletes finished jobs after their TTL.

pub mod job;
pub mod queue;
pub mod record;
pub mod turn;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource};
use serde_json::json;
use strata_api::compaction_job::{CompactionJobStatus, CompactionPhase, CompactionRecord, QualityCheck};
use strata_api::{Agent, CompactionJob};

use crate::controller::agent::dereference::pod_name;
use crate::controller::conditions;
use crate::controller::context::{COMPACTION_FIELD_MANAGER, Context, FIELD_MANAGER};
use crate::controller::error::{Error, Result, name_of, namespace_of};

/// How often a waiting or running CompactionJob is looked at (Job events also wake it).
pub const POLL_INTERVAL: Duration = Duration::from_secs(15);

/// Reconcile one CompactionJob, for the kube-runtime Controller.
pub async fn reconcile(compaction: Arc<CompactionJob>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_compaction(&compaction, &ctx).await
}

/// Move one CompactionJob a step forward.
pub async fn reconcile_compaction(compaction: &CompactionJob, ctx: &Context) -> Result<Action> {
    let namespace = namespace_of(&compaction.metadata, "CompactionJob")?;
    let name = name_of(&compaction.metadata, "CompactionJob")?;
    let current = compaction.status.clone().unwrap_or_default();
    if matches!(current.phase, Some(CompactionPhase::Succeeded) | Some(CompactionPhase::Failed)) {
        return clean_up_when_expired(compaction, &current, ctx, &namespace, &name).await;
    }
    let agents: Api<Agent> = Api::namespaced(ctx.client.clone(), &namespace);
    let agent_name = &compaction.spec.agent_ref.name;
    let agent = agents
        .get_opt(agent_name)
        .await
        .map_err(|e| Error::kube(format!("reading Agent {namespace}/{agent_name}"), e))?;
    let Some(agent) = agent else {
        let note =
            format!("Agent {agent_name:?} does not exist in {namespace}: create it, or delete this job");
        let status =
            finished(compaction, &current, CompactionPhase::Failed, "AgentNotFound", &note, None, ctx);
        transition(ctx, compaction, &current, status, EventType::Warning, "AgentNotFound", &note).await?;
        return Ok(Action::await_change());
    };

    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let job_name = job::job_name(compaction);
    let existing = jobs
        .get_opt(&job_name)
        .await
        .map_err(|e| Error::kube(format!("reading Job {namespace}/{job_name}"), e))?;
    let Some(existing) = existing else {
        // The agent's turn is decided under its lock and on live reads, so that two CompactionJobs
        // created in the same second cannot both start a Job on the one volume.
        let _turn = ctx.compaction_turns.lock(&namespace, agent_name).await;
        let running = turn::unfinished_jobs(ctx, &namespace, agent_name).await?;
        let peers = turn::compaction_jobs_of(ctx, &namespace, agent_name).await?;
        let first = queue::runnable(&peers).and_then(|first| first.metadata.name.clone());
        let blocker = running.first().cloned().or(first.filter(|first| *first != name));
        if let Some(waiting_for) = blocker {
            let status = CompactionJobStatus {
                phase: Some(CompactionPhase::Pending),
                reason: Some("WaitingForActiveJob".into()),
                observed_generation: compaction.metadata.generation,
                ..current.clone()
            };
            let note = format!("{waiting_for} runs first on Agent {agent_name}; one compaction at a time");
            transition(ctx, compaction, &current, status, EventType::Normal, "Waiting", &note).await?;
            return Ok(Action::requeue(POLL_INTERVAL));
        }
        let node = pinned_node(ctx, &namespace, &agent).await?;
        let summarizer_credentials = summarizer_credentials(ctx, &namespace, agent_name).await?;
        let built = job::build_job(
            compaction,
            &agent,
            &ctx.settings.compactor_image,
            node.as_deref(),
            summarizer_credentials.as_ref(),
        )?;
        match jobs.create(&PostParams::default(), &built).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(e) => return Err(Error::kube(format!("creating Job {namespace}/{job_name}"), e)),
        }
        let status = CompactionJobStatus {
            phase: Some(CompactionPhase::Running),
            reason: Some("JobCreated".into()),
            job_name: Some(job_name.clone()),
            start_time: Some(Time(ctx.now())),
            observed_generation: compaction.metadata.generation,
            ..current.clone()
        };
        let pinned = node.map(|n| format!(", pinned to node {n}")).unwrap_or_default();
        let note = format!("Job {job_name} runs strata compact on Agent {agent_name}'s journal{pinned}");
        transition(ctx, compaction, &current, status, EventType::Normal, "Started", &note).await?;
        return Ok(Action::requeue(POLL_INTERVAL));
    };

    let job_status = existing.status.clone().unwrap_or_default();
    let condition_true =
        |kind: &str| job_status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True");
    let succeeded = condition_true("Complete") || job_status.succeeded.unwrap_or(0) > 0;
    let failed = condition_true("Failed");
    if !succeeded && !failed {
        return Ok(Action::requeue(POLL_INTERVAL));
    }
    let termination = read_termination(ctx, &namespace, &job_name).await?;
    let record = termination.as_ref().and_then(|t| t.message.as_deref()).and_then(record::parse_record);
    let (phase, reason, event_type) = match (&record, succeeded) {
        (Some(r), true) if r.quality_check == QualityCheck::Passed => {
            (CompactionPhase::Succeeded, "Compacted", EventType::Normal)
        }
        (Some(_), _) => (CompactionPhase::Failed, "QualityCheckFailed", EventType::Warning),
        (None, true) => (CompactionPhase::Failed, "RecordMissing", EventType::Warning),
        (None, false) => {
            let reason = termination.as_ref().map_or("JobFailed", record::Termination::failure_reason);
            (CompactionPhase::Failed, reason, EventType::Warning)
        }
    };
    let note = match (&record, &termination) {
        (Some(r), _) if phase == CompactionPhase::Succeeded => {
            format!(
                "{}: {} → {} tokens, generation {}",
                r.compaction_id, r.tokens_before, r.tokens_after, r.result_generation
            )
        }
        (Some(r), _) => {
            format!("{}: nothing changed; missing {}", r.compaction_id, r.missing_items.join(", "))
        }
        (None, Some(termination)) => termination.failure_message(),
        (None, None) => job_failure(&job_status, &job_name),
    };
    let mut status = finished(compaction, &current, phase, reason, &note, record.clone(), ctx);
    status.job_name = Some(job_name.clone());
    if phase == CompactionPhase::Succeeded
        && let Some(record) = &record
    {
        record_last_compaction(ctx, &namespace, agent_name, &name, record, status.completion_time.clone())
            .await?;
    }
    transition(ctx, compaction, &current, status.clone(), event_type, reason, &note).await?;
    clean_up_when_expired(compaction, &status, ctx, &namespace, &name).await
}

/// The status of a finished job, with a `Complete` or `Failed` condition carrying `message`.
fn finished(
    compaction: &CompactionJob,
    current: &CompactionJobStatus,
    phase: CompactionPhase,
    reason: &str,
    message: &str,
    record: Option<CompactionRecord>,
    ctx: &Context,
) -> CompactionJobStatus {
    let kind = if phase == CompactionPhase::Succeeded { "Complete" } else { "Failed" };
    let message = record::truncate(message, record::MESSAGE_LIMIT);
    let generation = compaction.metadata.generation;
    let condition = conditions::condition(kind, true, reason, &message, generation, ctx.now());
    CompactionJobStatus {
        phase: Some(phase),
        reason: Some(reason.into()),
        completion_time: Some(Time(ctx.now())),
        record,
        conditions: vec![condition],
        ..current.clone()
    }
}

/// Why a Job failed when no pod reported a termination (deadline, backoff limit), from its
/// `Failed` condition.
fn job_failure(status: &k8s_openapi::api::batch::v1::JobStatus, job_name: &str) -> String {
    let failed = status.conditions.iter().flatten().find(|c| c.type_ == "Failed" && c.status == "True");
    match failed {
        Some(c) => {
            let reason = c.reason.as_deref().unwrap_or("Failed");
            let message = c.message.as_deref().unwrap_or_default();
            format!("Job {job_name} failed ({reason}) before strata compact reported anything: {message}")
        }
        None => format!("Job {job_name} ended without a compaction record; see its pod's logs"),
    }
}

/// The agent pod's node while the agent runs (its RWO volume is attached there); none when suspended.
async fn pinned_node(ctx: &Context, namespace: &str, agent: &Agent) -> Result<Option<String>> {
    if agent.spec.suspend.unwrap_or(false) {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let name = pod_name(agent.metadata.name.as_deref().unwrap_or_default());
    let pod =
        pods.get_opt(&name).await.map_err(|e| Error::kube(format!("reading Pod {namespace}/{name}"), e))?;
    Ok(pod.and_then(|p| p.spec).and_then(|s| s.node_name))
}

/// The summariser's own credentials, from the gateway.json that the Job's `strata compact` reads
/// (so the key it mounts is the one that config names).
async fn summarizer_credentials(
    ctx: &Context,
    namespace: &str,
    agent: &str,
) -> Result<Option<strata_api::refs::LocalKeyRef>> {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let name = crate::controller::agent::build::config_map_name(agent);
    let map = maps
        .get_opt(&name)
        .await
        .map_err(|e| Error::kube(format!("reading ConfigMap {namespace}/{name}"), e))?;
    let config = map
        .and_then(|m| m.data)
        .and_then(|data| data.get(crate::controller::agent::build::CONFIG_FILE).cloned())
        .and_then(|json| strata_api::gateway_config::GatewayConfig::from_json(json.as_bytes()).ok());
    Ok(config.and_then(|c| c.policy.compaction.summarizer.credentials_secret_ref))
}

async fn read_termination(
    ctx: &Context,
    namespace: &str,
    job_name: &str,
) -> Result<Option<record::Termination>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job_name}")))
        .await
        .map_err(|e| Error::kube(format!("listing the pods of Job {namespace}/{job_name}"), e))?;
    Ok(record::last_termination(&list.items))
}

async fn record_last_compaction(
    ctx: &Context,
    namespace: &str,
    agent: &str,
    job: &str,
    record: &CompactionRecord,
    finished_at: Option<Time>,
) -> Result<()> {
    let agents: Api<Agent> = Api::namespaced(ctx.client.clone(), namespace);
    // The record's result generation is the journal's CURRENT generation from now on (compaction,
    // purge and rollback are the only ways it changes), so it is also `status.journal`.
    let patch = json!({"status": {
        "lastCompaction": {
            "jobName": job,
            "compactionId": record.compaction_id,
            "tokensBefore": record.tokens_before,
            "tokensAfter": record.tokens_after,
            "finishedAt": finished_at,
        },
        "journal": {"generation": record.result_generation},
    }});
    let params =
        PatchParams { field_manager: Some(COMPACTION_FIELD_MANAGER.into()), ..PatchParams::default() };
    agents
        .patch_status(agent, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("recording the last compaction on Agent {namespace}/{agent}"), e))?;
    Ok(())
}

/// Write `status` if it differs from `current`, and publish an Event for the transition.
async fn transition(
    ctx: &Context,
    compaction: &CompactionJob,
    current: &CompactionJobStatus,
    status: CompactionJobStatus,
    event_type: EventType,
    reason: &str,
    note: &str,
) -> Result<()> {
    if &status == current {
        return Ok(());
    }
    let namespace = namespace_of(&compaction.metadata, "CompactionJob")?;
    let name = name_of(&compaction.metadata, "CompactionJob")?;
    let api: Api<CompactionJob> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = json!({
        "apiVersion": format!("{}/{}", strata_api::GROUP, strata_api::VERSION),
        "kind": "CompactionJob",
        "status": status,
    });
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map_err(|e| Error::kube(format!("writing the status of CompactionJob {namespace}/{name}"), e))?;
    if current.phase != status.phase || current.reason != status.reason {
        let event = Event {
            type_: event_type,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Compact".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &compaction.object_ref(&())).await {
            tracing::warn!(%error, compaction_job = %name, "publishing an Event failed");
        }
    }
    Ok(())
}

/// Delete a finished CompactionJob (and, through its owner reference, its Job) after its TTL.
async fn clean_up_when_expired(
    compaction: &CompactionJob,
    status: &CompactionJobStatus,
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Action> {
    let (Some(ttl), Some(done)) =
        (compaction.spec.ttl_seconds_after_finished, status.completion_time.as_ref())
    else {
        return Ok(Action::await_change());
    };
    let remaining = done.0.as_second() + i64::from(ttl) - ctx.now().as_second();
    if remaining > 0 {
        return Ok(Action::requeue(Duration::from_secs(remaining.unsigned_abs())));
    }
    let api: Api<CompactionJob> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Action::await_change()),
        Err(e) => Err(Error::kube(format!("deleting expired CompactionJob {namespace}/{name}"), e)),
    }
}
