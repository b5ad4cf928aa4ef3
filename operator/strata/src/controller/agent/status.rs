//! Step 5 of the Agent pipeline: the status the controller owns (phase, conditions, prefix and
//! cache key, effective policy), computed purely and written only when it changed. `context` is
//! the gateway's and `lastCompaction` the CompactionJob controller's; this step never sends them.

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use strata_api::Agent;
use strata_api::agent::{AgentPhase, AgentStatus, EffectivePolicyStatus, PrefixStatus};
use strata_api::status::{
    CONDITION_JOURNAL_BOUND, CONDITION_POLICY_RESOLVED, CONDITION_READY, CONDITION_REFERENCES_RESOLVED,
    CONDITION_SUMMARIZER_READY,
};

use super::dereference::PodObservation;
use super::validate::{Problem, Validation};
use crate::controller::conditions::{carry_transition_times, condition, equivalent};
use crate::controller::context::{Context, FIELD_MANAGER};
use crate::controller::error::{Error, Result, name_of, namespace_of};

/// The controller-owned part of the Agent's status.
pub fn desired_status(
    agent: &Agent,
    validation: &Validation,
    pod: Option<&PodObservation>,
    now: Timestamp,
) -> AgentStatus {
    let current = agent.status.clone().unwrap_or_default();
    let generation = agent.metadata.generation;
    let suspended = agent.spec.suspend.unwrap_or(false);
    let pod_running = pod.is_some_and(|p| p.phase == "Running");
    let pod_ready = pod.is_some_and(|p| p.ready);
    let (problems, prefix, effective_policy): (&[Problem], _, _) = match validation {
        Validation::Valid(valid) => (
            &valid.warnings,
            Some(PrefixStatus {
                hash: valid.manifest.prefix_hash.clone(),
                cache_key: valid.cache_key.short().to_string(),
                canonicalization_version: valid.manifest.canonicalization_version.clone(),
                tokens: u64::from(valid.manifest.total_tokens),
            }),
            Some(EffectivePolicyStatus {
                hash: valid.resolution.hash.clone(),
                sources: valid.resolution.sources.iter().map(ToString::to_string).collect(),
                clamped: valid.resolution.clamps.clone(),
            }),
        ),
        Validation::Invalid(problems) => (problems, current.prefix.clone(), current.effective_policy.clone()),
    };
    let valid = matches!(validation, Validation::Valid(_));
    // A summariser that cannot work stops compactions, not the agent.
    let blocking =
        problems.iter().any(|p| p.reason != "PolicyWarning" && p.condition != CONDITION_SUMMARIZER_READY);
    let foreign_journal = problems.iter().find(|p| p.condition == CONDITION_JOURNAL_BOUND);
    let phase = if !valid {
        if pod_running { AgentPhase::Degraded } else { AgentPhase::Failed }
    } else if suspended {
        AgentPhase::Suspended
    } else if blocking {
        if pod_running { AgentPhase::Degraded } else { AgentPhase::Pending }
    } else if pod_running && pod_ready {
        AgentPhase::Running
    } else {
        AgentPhase::Pending
    };
    let (ready, ready_reason, ready_message) = match phase {
        AgentPhase::Running => (true, "Running", "the agent pod is ready".to_string()),
        AgentPhase::Suspended => {
            (false, "Suspended", "spec.suspend is true; the journal is kept".to_string())
        }
        AgentPhase::Pending => {
            (false, "PodNotReady", "waiting for the agent pod to become ready".to_string())
        }
        AgentPhase::Degraded | AgentPhase::Failed => match foreign_journal {
            Some(problem) => (false, problem.reason, problem.message.clone()),
            None => (
                false,
                "ReferencesOrPolicyInvalid",
                "see the ReferencesResolved and PolicyResolved conditions".to_string(),
            ),
        },
    };
    let desired_conditions = vec![
        condition(CONDITION_READY, ready, ready_reason, &ready_message, generation, now),
        condition_for(CONDITION_REFERENCES_RESOLVED, problems, generation, now),
        condition_for(CONDITION_POLICY_RESOLVED, problems, generation, now),
        condition_for(CONDITION_JOURNAL_BOUND, problems, generation, now),
        condition_for(CONDITION_SUMMARIZER_READY, problems, generation, now),
    ];
    AgentStatus {
        phase: Some(phase),
        conditions: carry_transition_times(&current.conditions, desired_conditions),
        observed_generation: generation,
        prefix,
        context: None,
        effective_policy,
        journal: None,
        last_compaction: None,
    }
}

fn condition_for(
    type_: &str,
    problems: &[Problem],
    generation: Option<i64>,
    now: Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let relevant: Vec<&Problem> = problems.iter().filter(|p| p.condition == type_).collect();
    let blocking: Vec<&&Problem> = relevant.iter().filter(|p| p.reason != "PolicyWarning").collect();
    let message = relevant.iter().map(|p| p.message.as_str()).collect::<Vec<_>>().join("; ");
    match blocking.first() {
        Some(first) => condition(type_, false, first.reason, &message, generation, now),
        None if relevant.is_empty() => condition(type_, true, "Resolved", "", generation, now),
        None => condition(type_, true, "ResolvedWithWarnings", &message, generation, now),
    }
}

/// Warning Events for conditions that just turned False and that a person must act on: a journal
/// the gateway refused, a summariser that cannot work. `(reason, note)` pairs.
pub fn warnings_to_publish(agent: &Agent, desired: &AgentStatus) -> Vec<(String, String)> {
    let current = agent.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    [CONDITION_JOURNAL_BOUND, CONDITION_SUMMARIZER_READY]
        .into_iter()
        .filter_map(|type_| {
            let now = desired.conditions.iter().find(|c| c.type_ == type_ && c.status == "False")?;
            let before = current.iter().find(|c| c.type_ == type_);
            let new = before.is_none_or(|c| c.status != "False" || c.reason != now.reason);
            new.then(|| (now.reason.clone(), now.message.clone()))
        })
        .collect()
}

/// Publish [`warnings_to_publish`] as Events on the Agent (a failed publish is only logged).
pub async fn publish_warnings(ctx: &Context, agent: &Agent, warnings: Vec<(String, String)>) {
    use kube::Resource;
    use kube::runtime::events::{Event, EventType};
    for (reason, note) in warnings {
        let event = Event {
            type_: EventType::Warning,
            reason,
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &agent.object_ref(&())).await {
            tracing::warn!(%error, agent = ?agent.metadata.name, "publishing an Event failed");
        }
    }
}

/// Whether `desired` differs from what the Agent's status already says.
pub fn status_changed(agent: &Agent, desired: &AgentStatus) -> bool {
    let current = agent.status.clone().unwrap_or_default();
    current.phase != desired.phase
        || current.observed_generation != desired.observed_generation
        || current.prefix != desired.prefix
        || current.effective_policy != desired.effective_policy
        || !equivalent(&current.conditions, &desired.conditions)
}

/// Server-side apply the controller-owned status fields.
pub async fn write_status(ctx: &Context, agent: &Agent, desired: &AgentStatus) -> Result<()> {
    let name = name_of(&agent.metadata, "Agent")?;
    let namespace = namespace_of(&agent.metadata, "Agent")?;
    let api: Api<Agent> = Api::namespaced(ctx.client.clone(), &namespace);
    let body = json!({
        "apiVersion": format!("{}/{}", strata_api::GROUP, strata_api::VERSION),
        "kind": "Agent",
        "status": desired,
    });
    api.patch_status(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map_err(|e| Error::kube(format!("writing the status of Agent {namespace}/{name}"), e))?;
    Ok(())
}
