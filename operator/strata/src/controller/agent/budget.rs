//! Budget-triggered compaction: when the gateway reports context use at or above the effective
//! trigger, automatic compaction is on, and no CompactionJob for the agent is active, create a
//! Budget CompactionJob owned by the Agent. At most one per agent per interval: the job's name
//! carries the interval's number, and a recent Budget job blocks a new one.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::Resource;
use kube::api::{ObjectMeta, PostParams};
use strata_api::compaction_job::{CompactionJobSpec, CompactionMode, CompactionPhase};
use strata_api::effective::EffectivePolicy;
use strata_api::refs::LocalRef;
use strata_api::{Agent, CompactionJob};

use crate::controller::context::Context;
use crate::controller::error::{Error, Result, name_of, namespace_of};
use crate::controller::labels::{LABEL_AGENT, LABEL_MANAGED_BY, MANAGED_BY};

/// Budget CompactionJobs delete themselves this long after finishing.
pub const BUDGET_JOB_TTL_SECONDS: u32 = 3600;

/// Whether a CompactionJob has not finished yet.
pub fn is_active(job: &CompactionJob) -> bool {
    !matches!(
        job.status.as_ref().and_then(|s| s.phase),
        Some(CompactionPhase::Succeeded) | Some(CompactionPhase::Failed)
    )
}

/// The CompactionJob to create now, if one is due.
pub fn budget_job_due(
    agent: &Agent,
    policy: &EffectivePolicy,
    jobs_for_agent: &[Arc<CompactionJob>],
    now: Timestamp,
    interval: Duration,
) -> Result<Option<CompactionJob>> {
    let Some(percent) = agent.status.as_ref().and_then(|s| s.context.as_ref()).map(|c| c.percent) else {
        return Ok(None);
    };
    if !policy.compaction.automatic
        || percent < policy.compaction.trigger_percent
        || agent.spec.suspend.unwrap_or(false)
        || jobs_for_agent.iter().any(|job| is_active(job))
    {
        return Ok(None);
    }
    let interval_seconds = i64::try_from(interval.as_secs()).unwrap_or(i64::MAX).max(1);
    let recent_budget_job = jobs_for_agent.iter().any(|job| {
        job.spec.mode == CompactionMode::Budget
            && job
                .metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|created| now.as_second() - created.0.as_second() < interval_seconds)
    });
    if recent_budget_job {
        return Ok(None);
    }
    let name = name_of(&agent.metadata, "Agent")?;
    let owner = agent
        .controller_owner_ref(&())
        .ok_or(Error::MissingField { kind: "Agent", field: "metadata.uid" })?;
    let bucket = now.as_second() / interval_seconds;
    Ok(Some(CompactionJob {
        metadata: ObjectMeta {
            name: Some(format!("{name}-budget-{bucket}")),
            namespace: agent.metadata.namespace.clone(),
            labels: Some(
                [
                    (LABEL_AGENT.to_string(), name.clone()),
                    (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
                ]
                .into(),
            ),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: CompactionJobSpec {
            agent_ref: LocalRef { name },
            mode: CompactionMode::Budget,
            reason: Some(format!(
                "context use {percent}% reached the trigger of {}%",
                policy.compaction.trigger_percent
            )),
            resume_instruction: None,
            rollback: None,
            purge: None,
            ttl_seconds_after_finished: Some(BUDGET_JOB_TTL_SECONDS),
        },
        status: None,
    }))
}

/// The CompactionJobs in the cache that target `agent`.
pub fn jobs_for_agent(ctx: &Context, namespace: &str, agent: &str) -> Vec<Arc<CompactionJob>> {
    ctx.caches.compaction_jobs.state_filter(|job| {
        job.metadata.namespace.as_deref() == Some(namespace) && job.spec.agent_ref.name == agent
    })
}

/// Create the Budget CompactionJob if one is due; returns whether one was created.
pub async fn trigger_budget_compaction(
    ctx: &Context,
    agent: &Agent,
    policy: &EffectivePolicy,
) -> Result<bool> {
    let namespace = namespace_of(&agent.metadata, "Agent")?;
    let name = name_of(&agent.metadata, "Agent")?;
    let jobs = jobs_for_agent(ctx, &namespace, &name);
    let Some(job) = budget_job_due(agent, policy, &jobs, ctx.now(), ctx.settings.budget_compaction_interval)?
    else {
        return Ok(false);
    };
    let api: Api<CompactionJob> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &job).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(false),
        Err(e) => {
            Err(Error::kube(format!("creating a Budget CompactionJob for Agent {namespace}/{name}"), e))
        }
    }
}
