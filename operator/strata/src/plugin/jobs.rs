//! `compact` and `rollback`: create a CompactionJob for an agent and follow it to its end.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use serde_json::json;
use strata_api::compaction_job::CompactionPhase;
use strata_api::{Agent, CompactionJob};

use super::PluginError;

/// What to create.
pub struct JobRequest<'a> {
    /// The agent.
    pub agent: &'a str,
    /// The CompactionJob mode.
    pub mode: &'a str,
    /// Resume instruction.
    pub resume: Option<&'a str>,
    /// Reason.
    pub reason: Option<&'a str>,
    /// Rollback target.
    pub to_generation: Option<u64>,
    /// Follow for at most this long; `None` returns after creating.
    pub follow: Option<Duration>,
}

/// Create the CompactionJob and, unless told not to, wait until it succeeds or fails.
pub async fn run_job(
    client: &Client,
    namespace: &str,
    request: &JobRequest<'_>,
    interval: Duration,
) -> Result<String, PluginError> {
    let agents: Api<Agent> = Api::namespaced(client.clone(), namespace);
    agents
        .get_metadata(request.agent)
        .await
        .map_err(|e| PluginError::from_api(e, "get", "agents", namespace, Some(request.agent)))?;
    let mut spec = json!({"agentRef": {"name": request.agent}, "mode": request.mode});
    if let Some(resume) = request.resume {
        spec["resumeInstruction"] = json!(resume);
    }
    if let Some(reason) = request.reason {
        spec["reason"] = json!(reason);
    }
    if let Some(generation) = request.to_generation {
        spec["rollback"] = json!({"toGeneration": generation});
    }
    let job = CompactionJob {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-{}-", request.agent, request.mode.to_lowercase())),
            namespace: Some(namespace.into()),
            ..ObjectMeta::default()
        },
        spec: serde_json::from_value(spec)
            .map_err(|e| PluginError::Policy(format!("building the CompactionJob: {e}")))?,
        status: None,
    };
    let jobs: Api<CompactionJob> = Api::namespaced(client.clone(), namespace);
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .map_err(|e| PluginError::from_api(e, "create", "compactionjobs", namespace, None))?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let mut out =
        format!("compactionjob.strata.dev/{name} created ({} of agent {})\n", request.mode, request.agent);
    let Some(limit) = request.follow else { return Ok(out) };
    let started = Instant::now();
    loop {
        let current = jobs
            .get(&name)
            .await
            .map_err(|e| PluginError::from_api(e, "get", "compactionjobs", namespace, Some(&name)))?;
        let status = current.status.unwrap_or_default();
        match status.phase {
            Some(CompactionPhase::Succeeded) => {
                if let Some(record) = status.record {
                    let _ = writeln!(
                        out,
                        "Succeeded: {} generation {} → {}, tokens {} → {}, check {:?}",
                        record.compaction_id,
                        record.source_generation,
                        record.result_generation,
                        record.tokens_before,
                        record.tokens_after,
                        record.quality_check
                    );
                } else {
                    let _ = writeln!(out, "Succeeded");
                }
                return Ok(out);
            }
            Some(CompactionPhase::Failed) => {
                return Err(PluginError::JobFailed {
                    name,
                    namespace: namespace.into(),
                    reason: status.reason.unwrap_or_else(|| "no reason given".into()),
                });
            }
            phase => {
                if started.elapsed() >= limit {
                    return Err(PluginError::Timeout {
                        name,
                        namespace: namespace.into(),
                        phase: phase.map_or("Pending".into(), |p| format!("{p:?}")),
                        seconds: limit.as_secs(),
                    });
                }
                tokio::time::sleep(interval).await;
            }
        }
    }
}
